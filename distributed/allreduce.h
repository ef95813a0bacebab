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
// The ops exist only in graphs a data-parallel session runs. This header holds their kernels; the graph pass
// that inserts, places and removes them is training/data_parallel.h. Checkpoints store the single-process
// graph (remove_allreduce), so they resume anywhere and run in any ONNX runtime.
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

// Checks a compression name ("none", "bfloat16", "float16"); errors name `key`.
DType compression_dtype(const std::string& compression, const std::string& key);

// Adds the AllReduce, AllReduceStart and AllReduceWait kernels, bound to comm, for comm's device.
void register_allreduce_kernel(KernelRegistry& registry, std::shared_ptr<Communicator> comm);

// Fails on every rank, with one message, unless all ranks pass the same fingerprint (a hash of what must
// agree: model, trainable weights, configuration). Two collectives.
void check_same_on_all_ranks(Communicator& comm, uint64_t fingerprint, const std::string& what);

}  // namespace onnxtrain
