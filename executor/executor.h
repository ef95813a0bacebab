#pragma once
// Executor: runs one graph against a shared store of state tensors, with a plan cached per signature of
// input shapes. Several executors (inference, gradients, training step) share one store, so they all see
// the same weights.
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "executor/plan.h"

namespace onnxtrain {

// Long-lived tensors by name: weights, optimizer state, step counters.
using TensorStore = std::map<std::string, Tensor>;

struct ExecutorOptions {
  Device device = Device::CPU;
  const KernelRegistry* registry = nullptr;  // default_kernels() when null
  std::set<std::string> variables;  // store entries that may change between runs (never folded)
  // (new value, state name): after each run, the new value is written into the state tensor.
  std::vector<std::pair<std::string, std::string>> updates;
  // Model-local functions: a call with no kernel runs as its inlined body.
  std::vector<Function> functions;
  // Values checked for NaN/Inf after each run, before any update is written: on the first non-finite one,
  // run() throws NonFiniteError (executor/finite.h) and the store is left as it was.
  std::vector<std::string> must_be_finite;
  // Check every value the graph computes, right after its node runs (PlanSpec::check_every_value).
  bool check_every_value = false;
  // Inline every function call, even where a native kernel exists (to test fused kernels against bodies).
  bool prefer_function_bodies = false;
  // Fuse runs of elementwise steps into one kernel each (PlanSpec::fuse_elementwise); off to measure the gain.
  bool fuse_elementwise = true;
  // Time every step (PlanSpec::profile); read with profile().
  bool profile = false;
};

class Executor {
 public:
  // Initializers of g not yet in the store are added to it. Graph inputs that have an initializer are
  // treated as state, as ONNX allows.
  Executor(Graph g, std::map<std::string, int64_t> opsets, std::shared_ptr<TensorStore> store,
           ExecutorOptions opts = {});

  // Names of the values run() expects, in order, and of the values it returns.
  const std::vector<std::string>& feed_names() const { return feed_names_; }
  const std::vector<std::string>& output_names() const { return output_names_; }

  // Validates dtypes and ranks/dims against the graph (errors name the input and what was expected), picks
  // or compiles the plan for these shapes, runs it, applies updates. A feed on another device (host arrays
  // for a device executor) is copied into a staging buffer of this executor, reused while it is large enough.
  // The results are views on this executor's device, valid until the next run: read them across the edge
  // (executor/transfer.h) unless the executor runs on the CPU.
  std::span<const Tensor* const> run(std::span<const Tensor* const> feeds);
  // Compiles (and keeps) the plan for feeds of these dtypes and shapes without running it, and returns the
  // dtypes and shapes of the outputs: a control-flow kernel plans its subgraphs this way at its own plan time.
  std::vector<KernelOutput> plan_outputs(const std::vector<KernelOutput>& feeds);
  // Owning host copies, by name: this is a session edge.
  std::vector<Tensor> run(const std::map<std::string, Tensor>& feeds);

  const Graph& graph() const { return graph_; }
  TensorStore& store() { return *store_; }
  size_t num_plans() const { return plans_.size(); }
  const ExecutionPlan* last_plan() const { return last_; }
  // With ExecutorOptions::profile: the step times of every plan so far, summed per step description (plans
  // for other input shapes run the same nodes), most expensive first.
  std::vector<StepTime> profile() const;

 private:
  ExecutionPlan& plan_for(std::span<const Tensor* const> feeds);
  std::span<const Tensor* const> stage(std::span<const Tensor* const> feeds);
  // t itself on the CPU, else a host copy in a buffer this executor reuses (the non-finite guard reads it every
  // step, and a step allocates nothing once the buffer is large enough).
  const Tensor& host_copy_of(const Tensor& t);
  Graph graph_;
  std::map<std::string, int64_t> opsets_;
  std::shared_ptr<TensorStore> store_;
  ExecutorOptions opts_;
  std::vector<std::string> feed_names_, output_names_;
  std::vector<TypeInfo> feed_types_;
  struct CachedPlan {
    std::vector<std::vector<int64_t>> shapes;
    std::unique_ptr<ExecutionPlan> plan;
  };
  std::vector<CachedPlan> plans_;
  ExecutionPlan* last_ = nullptr;
  size_t last_index_ = 0;
  std::shared_ptr<void> stream_;  // the CUDA stream every run of this executor launches on; empty on the CPU
  // Per feed: a buffer on this executor's device for feeds that arrive from another device, and the view of it
  // that the plan reads; staged_ is the feed list with those views substituted.
  std::vector<Tensor> staging_buffers_, staging_;
  std::vector<const Tensor*> staged_;
  Tensor guard_scratch_, guard_view_;
};

}  // namespace onnxtrain
