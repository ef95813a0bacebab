#pragma once
// Gradient averaging as part of the training graph. Between the gradients and the optimizer, the session
// inserts `onnxtrain.AllReduce` nodes, one per bucket of same-dtype tensors of at most bucket_bytes. Each
// node's kernel packs its inputs into one buffer, makes one allreduce call and unpacks: few large messages
// instead of one per weight (torch DDP's buckets). Everything after (clipping, the optimizer) sees the
// reduced values, so a data-parallel step is the single-process step on the union of the ranks' batches.
//
// With overlap (the default) each bucket is two nodes instead: `onnxtrain.AllReduceStart` packs the bucket and
// starts a nonblocking allreduce as soon as the backward pass has produced the bucket's last gradient, and
// `onnxtrain.AllReduceWait` (inputs: the start's token, then the bucket's gradients) waits for it and unpacks
// once nothing is left that can run without it (place_collectives). The backward pass of the earlier
// layers runs while the later layers' gradients travel.
//
// The ops exist only in graphs a data-parallel session runs. Checkpoints store the single-process graph
// (remove_allreduce), so they resume anywhere and run in any ONNX runtime.
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "executor/kernel.h"
#include "graph/ir.h"

namespace onnxtrain {

inline constexpr const char* kCollectiveDomain = "onnxtrain";
inline constexpr const char* kAllReduceOp = "AllReduce";
inline constexpr const char* kAllReduceStartOp = "AllReduceStart";
inline constexpr const char* kAllReduceWaitOp = "AllReduceWait";
bool is_collective(const Node& n);  // AllReduce, AllReduceStart or AllReduceWait of the onnxtrain domain

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
// Checks a compression name ("none", "bfloat16", "float16"); errors name `key`.
DType compression_dtype(const std::string& compression, const std::string& key);

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

// Adds the AllReduce, AllReduceStart and AllReduceWait kernels, bound to comm, for comm's device.
void register_allreduce_kernel(KernelRegistry& registry, std::shared_ptr<Communicator> comm);

// Removes every AllReduce, AllReduceStart and AllReduceWait node, rewiring its consumers and the graph outputs to its inputs: the graph a single
// process runs.
void remove_allreduce(Graph& g);

// Fails on every rank, with one message, unless all ranks pass the same fingerprint (a hash of what must
// agree: model, trainable weights, configuration). Two collectives.
void check_same_on_all_ranks(Communicator& comm, uint64_t fingerprint, const std::string& what);

}  // namespace onnxtrain
