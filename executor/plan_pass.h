#pragma once
// Plan passes: the rewrites a backend applies to the plans compiled for its device, registered with its kernels
// (KernelRegistry::set_plan_passes) so that the plan compiler (plan.cpp) calls them without knowing any backend.
// The CPU registers the Transpose folding and the elementwise/optimizer-update fusion (executor/cpu/
// fusion_pass.cpp); CUDA registers none, so its plans run every node as written.
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "executor/kernel.h"
#include "executor/tensor.h"
#include "graph/ir.h"

namespace onnxtrain {

// One compiled step as a step-fusion pass sees it (before any fusion there is one step per node).
struct PlannedStep {
  const Node* node = nullptr;  // the node it computes, as the plan runs it (after rewrite_nodes)
  const Kernel* kernel = nullptr;
  std::span<const Tensor* const> in;  // nullptr for an absent optional input
  std::span<Tensor* const> out;
  // Output 0 is no view, or the only view of its buffer. A view records its root buffer, not the view it was
  // made from, so a pass must not turn a view that shares its buffer with another into a value of its own.
  bool out0_sole_view = true;
};

// Steps that a pass replaces by one kernel, which runs where the last of them was.
struct FusedSteps {
  std::vector<size_t> steps;  // increasing indices into the steps the pass saw
  std::unique_ptr<Kernel> kernel;
  std::vector<const Tensor*> in;
  std::vector<Tensor*> out;  // values of the plan that the kernel writes (read outside the group, or returned)
  // Outputs of view steps among `steps` that stop being views: the kernel may write them as values of their own.
  std::vector<const Tensor*> unviewed;
  std::string step;  // what the profiler reports for it (StepTime::step)
  std::string op;    // and its op (StepTime::op)
};

struct PlanPasses {
  // Rewrites the plan's private copy of the nodes before they are compiled (never the model: errors, gradients
  // and exports keep seeing the graph as written). keep: values that must still be computed (the plan's
  // outputs); types: the graph with its value_info, for ranks. Empty: the nodes are compiled as written.
  std::function<void(std::vector<Node>& nodes, const std::vector<std::string>& keep, const Graph* types)>
      rewrite_nodes;
  // Groups compiled steps into fused kernels; the plan swaps them in and recomputes lifetimes. needed: values
  // the plan returns. Skipped under PlanSpec::fuse_elementwise = false. Empty: no step fusion.
  std::function<std::vector<FusedSteps>(std::span<const PlannedStep> steps,
                                        const std::unordered_set<const Tensor*>& needed)>
      fuse_steps;
};

}  // namespace onnxtrain
