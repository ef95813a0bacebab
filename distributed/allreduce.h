#pragma once
// Gradient averaging as part of the training graph. Between the gradients and the optimizer, the session
// inserts `onnxtrain.AllReduce` nodes, one per bucket of same-dtype tensors of at most bucket_bytes. Each
// node's kernel packs its inputs into one buffer, makes one allreduce call and unpacks: few large messages
// instead of one per weight (torch DDP's buckets). Everything after (clipping, the optimizer) sees the
// reduced values, so a data-parallel step is the single-process step on the union of the ranks' batches.
//
// The op exists only in graphs a data-parallel session runs. Checkpoints store the single-process graph
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

// How a session trains data-parallel. With no communicator, or one of size 1, nothing changes: the graph
// gets no collective and a step costs what it costs single-process.
struct DataParallelSpec {
  std::shared_ptr<Communicator> communicator;
  // Upper bound of one allreduce message; torch DDP's default is 25 MB. A tensor larger than this is a
  // bucket of its own.
  size_t bucket_bytes = size_t(25) << 20;
  bool active() const { return communicator && communicator->size() > 1; }
};

struct ReducedValue {
  std::string name;
  DType dtype = DType::Float32;
  size_t bytes = 0;
};

// Appends AllReduce nodes reducing `values` (in that order, grouped into buckets by dtype and size) and
// returns the fresh name of each reduced value. The attribute "reduction" holds op.
std::map<std::string, std::string> insert_allreduce(Graph& g, const std::vector<ReducedValue>& values, ReduceOp op,
                                                    size_t bucket_bytes);

// Adds the AllReduce kernel, bound to comm, for comm's device.
void register_allreduce_kernel(KernelRegistry& registry, std::shared_ptr<Communicator> comm);

// Removes every AllReduce node, rewiring its consumers and the graph outputs to its inputs: the graph a single
// process runs.
void remove_allreduce(Graph& g);

// Fails on every rank, with one message, unless all ranks pass the same fingerprint (a hash of what must
// agree: model, trainable weights, configuration). Two collectives.
void check_same_on_all_ranks(Communicator& comm, uint64_t fingerprint, const std::string& what);

}  // namespace onnxtrain
