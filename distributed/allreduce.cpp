#include "distributed/allreduce.h"

#include <cstdlib>
#include <cstring>
#include <set>

#include "graph/builder.h"
#include "graph/error.h"

namespace onnxtrain {

namespace {

void emit_bucket(GraphBuilder& b, const std::vector<const ReducedValue*>& bucket, ReduceOp op,
                 std::map<std::string, std::string>& reduced) {
  if (bucket.empty()) return;
  std::vector<std::string> ins, outs;
  for (const ReducedValue* v : bucket) {
    ins.push_back(v->name);
    outs.push_back(b.unique_name(v->name + "/allreduced"));
  }
  b.add_node(kAllReduceOp, ins, outs.size(), {{"reduction", reduce_op_name(op)}}, kCollectiveDomain, outs);
  for (size_t i = 0; i < ins.size(); ++i) {
    if (const TypeInfo* t = b.graph().type_of(ins[i])) b.set_type(outs[i], *t);
    reduced[ins[i]] = outs[i];
  }
}

class AllReduceKernel final : public Kernel {
 public:
  AllReduceKernel(std::shared_ptr<Communicator> comm, ReduceOp op, DType dtype, std::vector<size_t> counts)
      : comm_(std::move(comm)), op_(op), dtype_(dtype), counts_(std::move(counts)) {
    for (size_t c : counts_) total_ += c;
    // Backends that reduce many buffers in one collective read the tensors where they are.
    if (comm_->reduces_many_at_once()) {
      send_.resize(counts_.size());
      recv_.resize(counts_.size());
      return;
    }
    // Else one packed buffer, allocated once here: a steady-state step allocates nothing.
    if (counts_.size() > 1 && comm_->device() == Device::CPU) {
      const size_t bytes = (total_ * dtype_size(dtype_) + 63) / 64 * 64;
      bucket_.reset(static_cast<std::byte*>(std::aligned_alloc(64, bytes)));
      if (!bucket_) fail("AllReduce", "out of memory for a " + std::to_string(bytes) + "-byte bucket");
    }
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const size_t es = dtype_size(dtype_);
    if (!send_.empty()) {
      for (size_t i = 0; i < counts_.size(); ++i) {
        send_[i] = in[i]->data;
        recv_[i] = out[i]->data;
      }
      comm_->allreduce_many(send_, recv_, counts_, dtype_, op_);
      return;
    }
    if (!bucket_) {
      // One tensor, or device buffers: reduce straight from input to output.
      for (size_t i = 0; i < counts_.size(); ++i) comm_->allreduce(in[i]->data, out[i]->data, counts_[i], dtype_, op_);
      return;
    }
    std::byte* p = bucket_.get();
    for (size_t i = 0; i < counts_.size(); p += counts_[i] * es, ++i) std::memcpy(p, in[i]->data, counts_[i] * es);
    comm_->allreduce(bucket_.get(), total_, dtype_, op_);
    p = bucket_.get();
    for (size_t i = 0; i < counts_.size(); p += counts_[i] * es, ++i) std::memcpy(out[i]->data, p, counts_[i] * es);
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::shared_ptr<Communicator> comm_;
  ReduceOp op_;
  DType dtype_;
  std::vector<size_t> counts_;
  size_t total_ = 0;
  std::unique_ptr<std::byte, Free> bucket_;
  std::vector<const void*> send_;  // per run, the tensors' buffers (reduces_many_at_once backends)
  std::vector<void*> recv_;
};

}  // namespace

std::map<std::string, std::string> insert_allreduce(Graph& g, const std::vector<ReducedValue>& values, ReduceOp op,
                                                    size_t bucket_bytes) {
  if (bucket_bytes == 0) fail("bucket_bytes", "expected a positive number of bytes");
  GraphBuilder b(g, "allreduce/");
  std::map<std::string, std::string> reduced;
  // Buckets fill in the given order, one open bucket per dtype.
  std::map<DType, std::pair<std::vector<const ReducedValue*>, size_t>> open;
  for (const ReducedValue& v : values) {
    if (v.dtype != DType::Float32 && v.dtype != DType::Float64)
      fail("allreduce of '" + v.name + "'", "expected float32 or float64, got " + dtype_name(v.dtype));
    if (reduced.count(v.name)) fail("allreduce of '" + v.name + "'", "the value is listed twice");
    auto& [bucket, bytes] = open[v.dtype];
    if (!bucket.empty() && bytes + v.bytes > bucket_bytes) {
      emit_bucket(b, bucket, op, reduced);
      bucket.clear();
      bytes = 0;
    }
    bucket.push_back(&v);
    bytes += v.bytes;
  }
  for (auto& [dtype, ob] : open) emit_bucket(b, ob.first, op, reduced);
  return reduced;
}

void register_allreduce_kernel(KernelRegistry& registry, std::shared_ptr<Communicator> comm) {
  if (!comm) fail("AllReduce kernel", "no communicator given");
  KernelDef d;
  d.domain = kCollectiveDomain;
  d.op_type = kAllReduceOp;
  d.device = comm->device();
  d.dtypes = {DType::Float32, DType::Float64};
  d.factory = [comm](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    const ReduceOp op = reduce_op_from_name(ctx.node.attr_string("reduction", "mean"), ctx.node.describe());
    if (ctx.inputs.empty() || ctx.inputs.size() != ctx.outputs.size())
      ctx.fail("expected as many outputs as inputs, at least one");
    const DType dtype = ctx.inputs[0].dtype;
    std::vector<size_t> counts;
    for (size_t i = 0; i < ctx.inputs.size(); ++i) {
      const KernelInput& in = ctx.inputs[i];
      if (!in.present()) ctx.fail("input " + std::to_string(i) + " is missing");
      if (in.dtype != dtype)
        ctx.fail("every input of one bucket must have the same dtype; input 0 is " + dtype_name(dtype) + ", input " +
                 std::to_string(i) + " is " + dtype_name(in.dtype));
      ctx.outputs[i] = {in.dtype, in.shape};
      counts.push_back(static_cast<size_t>(numel_of(in.shape)));
    }
    return std::make_unique<AllReduceKernel>(comm, op, dtype, std::move(counts));
  };
  registry.add(std::move(d));
}

void remove_allreduce(Graph& g) {
  std::map<std::string, std::string> original;
  std::erase_if(g.nodes, [&](const Node& n) {
    if (n.domain != kCollectiveDomain || n.op_type != kAllReduceOp) return false;
    for (size_t i = 0; i < n.outputs.size() && i < n.inputs.size(); ++i) original[n.outputs[i]] = n.inputs[i];
    return true;
  });
  if (original.empty()) return;
  auto rename = [&](std::string& v) {
    if (auto it = original.find(v); it != original.end()) v = it->second;
  };
  for (Node& n : g.nodes)
    for (std::string& in : n.inputs) rename(in);
  for (ValueInfo& out : g.outputs) rename(out.name);
  for (const auto& [reduced, from] : original) g.value_info.erase(reduced);
}

void check_same_on_all_ranks(Communicator& comm, uint64_t fingerprint, const std::string& what) {
  uint64_t root = fingerprint;
  comm.broadcast(&root, sizeof root, 0);
  const double differing = comm.allreduce(root == fingerprint ? 0.0 : 1.0, ReduceOp::Sum);
  if (differing > 0)
    fail(comm.describe(), std::to_string(static_cast<int>(differing)) + " rank(s) differ from rank 0 in " + what +
                              (root == fingerprint ? "" : ", this one among them") +
                              "; every rank must start from the same model and configuration");
}

}  // namespace onnxtrain
