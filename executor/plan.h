#pragma once
// An execution plan: one graph compiled for one signature of input shapes. Compilation binds every kernel,
// folds what is known at plan time (constants, shape arithmetic), and places every intermediate value in one
// arena by lifetime. run() is then a loop over bound kernels: no allocation, no lookup, no hashing.
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "executor/kernel.h"
#include "graph/ir.h"

namespace onnxtrain {

struct PlanSpec {
  const Graph* graph = nullptr;
  const std::map<std::string, int64_t>* opsets = nullptr;
  Device device = Device::CPU;
  const KernelRegistry* registry = nullptr;
  std::vector<std::string> feed_names;             // in the order run() receives them
  std::vector<KernelOutput> feed_specs;            // dtype and shape of each feed
  std::unordered_map<std::string, Tensor*> state;  // weights and other values that live across runs
  std::unordered_set<std::string> constants;       // state entries that never change (foldable)
  std::vector<std::string> outputs;                // values to return
  // Debugging aid (docs/reliability.md): after every step, check its floating-point outputs for NaN/Inf and
  // throw NonFiniteError naming the node and the value. Off, run() is unchanged.
  bool check_every_value = false;
  // With the built-in kernels (and not checking every value), the device's step fusion runs (executor/
  // plan_pass.h): on the CPU, runs of elementwise steps become one fused kernel each (executor/cpu/
  // fusion_pass.cpp); CUDA has none. Off only to measure or bisect that rewrite.
  bool fuse_elementwise = true;
  // Time every step of every run (two clock reads per step; off, run() is unchanged). ExecutionPlan::profile().
  bool profile = false;
  // Indices into `outputs` of the new values of state (optimizer updates): on the CPU each gets a buffer of its
  // own for the whole run, so that ExecutionPlan::hand_over can give it to the state instead of copying.
  std::vector<size_t> handed_over;

  std::vector<std::string> feed_names_and_state() const;  // names defined before the first node
};

// Where a plan's runs spent their time, per step (docs/performance.md "Profiling a step").
struct StepTime {
  std::string step;  // "node 'x' (Op)", or for a fused elementwise step the ops it runs and its last node
  std::string op;    // the op type, "fused elementwise" for a fused step
  int64_t calls = 0;
  double seconds = 0;  // total over the calls (wall time; on a GPU, of the launches only)
};

// A text report of step times: the total per op type, then the `top` most expensive steps, each with its share
// of the total and its mean time per call.
std::string format_profile(const std::vector<StepTime>& times, size_t top = 15);

class ExecutionPlan {
 public:
  static std::unique_ptr<ExecutionPlan> compile(const PlanSpec& spec);
  ~ExecutionPlan();

  // feeds must match the spec's dtypes and shapes (the caller checked). Returned views stay valid until the
  // next run.
  std::span<const Tensor* const> run(std::span<const Tensor* const> feeds);

  size_t arena_bytes() const { return arena_bytes_; }
  // Of the arena, the buffers of PlanSpec::handed_over outputs (an optimizer's new weights and state): they live
  // through the whole run and do not depend on the batch, so arena_bytes() minus this is what the run's
  // activations, gradients and temporaries need at their peak (docs/memory.md).
  size_t handed_over_bytes() const { return handed_over_bytes_; }
  // The values run() returns, with the dtypes and shapes planned for them (control-flow kernels read them).
  const std::vector<const Tensor*>& outputs() const { return outputs_; }
  size_t num_steps() const { return steps_.size(); }
  // With PlanSpec::profile: every step in execution order, with its calls and time so far; empty otherwise.
  std::vector<StepTime> profile() const;
  // Bytes that a naive plan (one buffer per value) would need, for the memory planner's tests and docs.
  size_t unplanned_bytes() const { return unplanned_bytes_; }
  // After a run: swaps the buffer of output i (one of PlanSpec::handed_over that got a buffer of its own) with
  // `state`'s, so the state holds the new value without a copy and the plan writes the next one into the old
  // buffer. Other plans read state through its Tensor at run time, so they follow. False: copy instead.
  bool hand_over(size_t output, Tensor& state);

 private:
  struct Step {
    std::unique_ptr<Kernel> kernel;
    std::vector<const Tensor*> in;
    std::vector<Tensor*> out;
  };
  ExecutionPlan() = default;
  Device device_ = Device::CPU;  // whose kernels run the steps (KernelScope)
  std::vector<Step> steps_;
  std::vector<StepTime> times_;  // per step: its description and op, and with profile_ its calls and time
  bool profile_ = false;
  std::vector<std::unique_ptr<Tensor>> slots_;  // every value the plan owns or views
  std::vector<Tensor*> feed_slots_;
  std::vector<const Tensor*> outputs_;
  std::vector<bool> handed_over_;  // per output: hand_over may swap its buffer
  std::shared_ptr<void> arena_;
  size_t arena_bytes_ = 0;
  size_t handed_over_bytes_ = 0;
  size_t unplanned_bytes_ = 0;
  std::vector<Tensor> folded_;  // values computed at compile time
  // With PlanSpec::check_every_value (which keeps one step per node, named in times_): per step, its output names.
  std::vector<std::vector<std::string>> checked_steps_;
  void check_step(size_t i) const;
  friend class PlanCompiler;
};

}  // namespace onnxtrain
