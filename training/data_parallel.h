#pragma once
// Data parallelism as a graph pass over the training graph (the other passes: mixed_precision.h, recompute.h):
// between the gradients and the optimizer the session inserts collectives, one per bucket of gradients, whose
// kernels (distributed/allreduce.h) reduce them across ranks; checkpoints store the graph without them.
// docs/distributed.md.
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distributed/allreduce.h"
#include "distributed/communicator.h"
#include "graph/ir.h"

namespace onnxtrain {

// How a session trains data-parallel. With no communicator, or one of size 1, nothing changes: the graph
// gets no collective and a step costs what it costs single-process.
struct DataParallelSpec {
  std::shared_ptr<Communicator> communicator;
  // Upper bound of one allreduce message (of the float32 values, before any compression). Gradients fill
  // buckets in the order the backward pass produces them (the last layer's first), so small tensors travel
  // together; a tensor larger than this is a bucket of its own. Smaller buckets start earlier and overlap more,
  // at one message's latency each (benchmarks/results.md measures it).
  size_t bucket_bytes = kDefaultBucketBytes;
  static constexpr size_t kDefaultBucketBytes = size_t(1) << 20;
  // Start each bucket's allreduce as soon as its gradients exist and wait where the optimizer reads them
  // (AllReduceStart/AllReduceWait); false: one blocking AllReduce per bucket after the backward pass.
  bool overlap = true;
  // "none", "bfloat16" or "float16": float32 gradients travel as 16-bit floats (half the bytes), summed in
  // float32 and rounded once per addition, and come back as float32. Lossy: docs/distributed.md.
  std::string compression = "none";
  // With optimizer.gradient_accumulation = k > 1: true reduces every micro-batch's gradients; false keeps the
  // micro-batches local and reduces only the accumulated sum, once per update (k times fewer messages).
  bool reduce_every_micro_batch = true;
  bool active() const { return communicator && communicator->size() > 1; }
};

// How insert_allreduce emits buckets (DataParallelSpec's fields of the same names).
struct BucketOptions {
  size_t bucket_bytes = DataParallelSpec::kDefaultBucketBytes;
  bool overlap = false;
  std::string compression = "none";
};
struct ReducedValue {
  std::string name;
  DType dtype = DType::Float32;
  size_t bytes = 0;
  // Never compressed (the loss, which is reported): with compression such values share buckets of their own.
  bool exact = false;
};

// Appends nodes reducing `values`, grouped into buckets by dtype and size in the order the graph produces them
// (values no node produces first, then by producer; ties keep the given order), and returns the fresh name of
// each reduced value. Attributes: "reduction" (op), "compression" when not "none". With overlap, call
// place_collectives once the graph is complete (the optimizer appended).
std::map<std::string, std::string> insert_allreduce(Graph& g, const std::vector<ReducedValue>& values, ReduceOp op,
                                                    const BucketOptions& options);
std::map<std::string, std::string> insert_allreduce(Graph& g, const std::vector<ReducedValue>& values, ReduceOp op,
                                                    size_t bucket_bytes);

// Moves every AllReduceStart right after the node producing its last input, and every AllReduceWait after all
// nodes that need no reduction, the waits in start order, each followed by the nodes it alone enables (the
// optimizer's update of the weights it carries runs while later buckets travel). The result stays in topological
// order, so the executor's stable order starts reductions as early and waits as late as the dependencies allow.
void place_collectives(Graph& g);

// Removes every AllReduce, AllReduceStart and AllReduceWait node, rewiring its consumers and the graph outputs to its inputs: the graph a single
// process runs.
void remove_allreduce(Graph& g);

}  // namespace onnxtrain
