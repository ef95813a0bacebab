#include "distributed/allreduce.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <queue>
#include <set>

#include "executor/device.h"
#include "graph/builder.h"
#include "graph/error.h"
#include "graph/float16.h"
#include "graph/validate.h"

namespace onnxtrain {

namespace {

bool is_op(const Node& n, const char* op) { return n.domain == kCollectiveDomain && n.op_type == op; }

// One bucket at run time: its tensors' sizes, the buffer they travel in (packed, and converted to 16-bit floats
// with compression) and the reduction in flight. A Start kernel and its Wait kernel share one.
class Bucket {
 public:
  Bucket(std::shared_ptr<Communicator> comm, ReduceOp op, DType dtype, DType wire, std::vector<size_t> counts,
         Device device)
      : comm_(std::move(comm)), op_(op), dtype_(dtype), wire_(wire), counts_(std::move(counts)), device_(device) {
    for (size_t c : counts_) total_ += c;
  }
  const std::vector<size_t>& counts() const { return counts_; }
  size_t total() const { return total_; }

  // The tensors are reduced where they are (threads read their peers' memory): no buffer, nothing to start.
  bool in_place() const { return dtype_ == wire_ && comm_->reduces_many_at_once() && !comm_->overlaps(); }

  // Packs the inputs into the buffer and starts reducing it.
  void start(std::span<const Tensor* const> in) {
    allocate();
    if (dtype_ == wire_) {
      const size_t es = dtype_size(dtype_);
      std::byte* p = buffer_;
      for (size_t i = 0; i < counts_.size(); p += counts_[i] * es, ++i)
        copy_bytes(p, device_, in[i]->data, device_, counts_[i] * es);
    } else {
      uint16_t* p = reinterpret_cast<uint16_t*>(buffer_);
      for (size_t i = 0; i < counts_.size(); p += counts_[i], ++i) {
        const float* x = static_cast<const float*>(in[i]->data);
        if (wire_ == DType::BFloat16)
          for (size_t j = 0; j < counts_[i]; ++j) p[j] = FloatToBFloat16{}(x[j]);
        else
          for (size_t j = 0; j < counts_[i]; ++j) p[j] = FloatToHalf{}(x[j]);
      }
    }
    // Compressed values are summed, and averaged in float32 when unpacked: one rounding fewer.
    comm_->start_allreduce(pending_, buffer_, total_, wire_, dtype_ == wire_ ? op_ : ReduceOp::Sum);
  }

  // Waits for the reduction and unpacks the buffer into the outputs.
  void finish(std::span<Tensor* const> out) {
    comm_->wait(pending_);
    if (dtype_ == wire_) {
      const size_t es = dtype_size(dtype_);
      const std::byte* p = buffer_;
      for (size_t i = 0; i < counts_.size(); p += counts_[i] * es, ++i)
        copy_bytes(out[i]->data, device_, p, device_, counts_[i] * es);
      return;
    }
    const float scale = op_ == ReduceOp::Mean ? 1.0f / static_cast<float>(comm_->size()) : 1.0f;
    const uint16_t* p = reinterpret_cast<const uint16_t*>(buffer_);
    for (size_t i = 0; i < counts_.size(); p += counts_[i], ++i) {
      float* y = static_cast<float*>(out[i]->data);
      if (wire_ == DType::BFloat16)
        for (size_t j = 0; j < counts_[i]; ++j) y[j] = BFloat16ToFloat{}(p[j]) * scale;
      else
        for (size_t j = 0; j < counts_[i]; ++j) y[j] = HalfToFloat{}(p[j]) * scale;
    }
  }

  // The in_place() reduction, from the inputs straight into the outputs.
  void reduce_in_place(std::span<const Tensor* const> in, std::span<Tensor* const> out) {
    send_.resize(counts_.size());
    recv_.resize(counts_.size());
    for (size_t i = 0; i < counts_.size(); ++i) {
      send_[i] = in[i]->data;
      recv_[i] = out[i]->data;
    }
    comm_->allreduce_many(send_, recv_, counts_, dtype_, op_);
  }

 private:
  // Once, on the first run: a steady-state step allocates nothing.
  void allocate() {
    if (buffer_) return;
    const size_t bytes = std::max<size_t>(64, (total_ * dtype_size(wire_) + 63) / 64 * 64);
    if (device_ == Device::CPU) {
      storage_ = allocate_host(bytes);
    } else {
      Tensor t = Tensor::empty(DType::UInt8, {static_cast<int64_t>(bytes)}, device_);
      storage_ = t.owner;
      buffer_ = static_cast<std::byte*>(t.data);
    }
    if (!storage_) fail("AllReduce", "out of memory for a " + std::to_string(bytes) + "-byte bucket");
    if (!buffer_) buffer_ = static_cast<std::byte*>(storage_.get());
  }

  std::shared_ptr<Communicator> comm_;
  ReduceOp op_;
  DType dtype_, wire_;
  std::vector<size_t> counts_;
  size_t total_ = 0;
  Device device_;
  std::shared_ptr<void> storage_;
  std::byte* buffer_ = nullptr;
  PendingReduce pending_;
  std::vector<const void*> send_;  // per run, the tensors' buffers (in_place)
  std::vector<void*> recv_;
};

// The blocking AllReduce: one bucket reduced within the step. Uncompressed, it reads the tensors where they are
// when it can (threads, one tensor, device buffers); otherwise it packs.
class AllReduceKernel final : public Kernel {
 public:
  AllReduceKernel(std::shared_ptr<Bucket> b, std::shared_ptr<Communicator> comm, ReduceOp op, bool compressed)
      : bucket_(std::move(b)), comm_(std::move(comm)), op_(op), compressed_(compressed) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    if (compressed_ || (!bucket_->in_place() && bucket_->counts().size() > 1 && comm_->device() == Device::CPU)) {
      bucket_->start(in);
      bucket_->finish(out);
      return;
    }
    if (bucket_->in_place()) return bucket_->reduce_in_place(in, out);
    // One tensor, or device buffers: reduce straight from input to output.
    for (size_t i = 0; i < bucket_->counts().size(); ++i)
      comm_->allreduce(in[i]->data, out[i]->data, bucket_->counts()[i], in[i]->dtype, op_);
  }

 private:
  std::shared_ptr<Bucket> bucket_;
  std::shared_ptr<Communicator> comm_;
  ReduceOp op_;
  bool compressed_;
};

class AllReduceStartKernel final : public Kernel {
 public:
  explicit AllReduceStartKernel(std::shared_ptr<Bucket> b) : bucket_(std::move(b)) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const>) override {
    if (!bucket_->in_place()) bucket_->start(in);
  }

 private:
  std::shared_ptr<Bucket> bucket_;
};

class AllReduceWaitKernel final : public Kernel {
 public:
  explicit AllReduceWaitKernel(std::shared_ptr<Bucket> b) : bucket_(std::move(b)) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    if (bucket_->in_place()) return bucket_->reduce_in_place(in.subspan(1), out);
    bucket_->finish(out);
  }

 private:
  std::shared_ptr<Bucket> bucket_;
};

// The bucket of a factory's node: its tensors' dtype and sizes, checked, with their outputs' types set.
struct BucketShape {
  DType dtype = DType::Float32;
  std::vector<size_t> counts;
};
BucketShape bucket_inputs(PrepareContext& ctx, size_t first, bool set_outputs) {
  if (ctx.inputs.size() <= first) ctx.fail("expected at least one tensor to reduce");
  BucketShape s;
  s.dtype = ctx.inputs[first].dtype;
  for (size_t i = first; i < ctx.inputs.size(); ++i) {
    const KernelInput& in = ctx.inputs[i];
    if (!in.present()) ctx.fail("input " + std::to_string(i) + " is missing");
    if (in.dtype != s.dtype)
      ctx.fail("every input of one bucket must have the same dtype; input " + std::to_string(first) + " is " +
               dtype_name(s.dtype) + ", input " + std::to_string(i) + " is " + dtype_name(in.dtype));
    if (set_outputs) ctx.outputs[i - first] = {in.dtype, in.shape};
    s.counts.push_back(static_cast<size_t>(numel_of(in.shape)));
  }
  return s;
}

DType wire_dtype(PrepareContext& ctx, DType dtype) {
  const DType wire = compression_dtype(ctx.node.attr_string("compression", "none"), ctx.node.describe());
  if (wire == DType::Undefined) return dtype;
  if (dtype != DType::Float32) ctx.fail("compression applies to float32 gradients, got " + dtype_name(dtype));
  if (ctx.device != Device::CPU)
    ctx.fail("gradient compression packs on the host; on " + device_name(ctx.device) + " use compression 'none'");
  return wire;
}

}  // namespace

bool is_collective(const Node& n) {
  return is_op(n, kAllReduceOp) || is_op(n, kAllReduceStartOp) || is_op(n, kAllReduceWaitOp);
}

DType compression_dtype(const std::string& compression, const std::string& key) {
  if (compression == "none") return DType::Undefined;
  if (compression == "bfloat16") return DType::BFloat16;
  if (compression == "float16") return DType::Float16;
  fail(key, "expected compression 'none', 'bfloat16' or 'float16', got '" + compression + "'");
}

void register_allreduce_kernel(KernelRegistry& registry, std::shared_ptr<Communicator> comm) {
  if (!comm) fail("AllReduce kernel", "no communicator given");
  // A start's bucket, found by its wait through the token's name. Plans compile one node at a time in
  // topological order, so a start's factory always runs before its wait's.
  auto started = std::make_shared<std::map<std::string, std::shared_ptr<Bucket>>>();
  auto add = [&](const char* op, KernelFactory factory) {
    KernelDef d;
    d.domain = kCollectiveDomain;
    d.op_type = op;
    d.device = comm->device();
    d.factory = std::move(factory);
    registry.add(std::move(d));
  };
  add(kAllReduceOp, [comm](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    const ReduceOp op = reduce_op_from_name(ctx.node.attr_string("reduction", "mean"), ctx.node.describe());
    if (ctx.inputs.size() != ctx.outputs.size()) ctx.fail("expected as many outputs as inputs, at least one");
    const BucketShape s = bucket_inputs(ctx, 0, true);
    const DType wire = wire_dtype(ctx, s.dtype);
    return std::make_unique<AllReduceKernel>(std::make_shared<Bucket>(comm, op, s.dtype, wire, s.counts, ctx.device),
                                             comm, op, wire != s.dtype);
  });
  add(kAllReduceStartOp, [comm, started](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    const ReduceOp op = reduce_op_from_name(ctx.node.attr_string("reduction", "mean"), ctx.node.describe());
    if (ctx.outputs.size() != 1) ctx.fail("expected one output, the token its AllReduceWait reads");
    const BucketShape s = bucket_inputs(ctx, 0, false);
    ctx.outputs[0] = {DType::UInt8, {1}};
    auto bucket = std::make_shared<Bucket>(comm, op, s.dtype, wire_dtype(ctx, s.dtype), s.counts, ctx.device);
    (*started)[ctx.node.outputs[0]] = bucket;
    return std::make_unique<AllReduceStartKernel>(std::move(bucket));
  });
  add(kAllReduceWaitOp, [started](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    if (ctx.node.inputs.empty()) ctx.fail("expected the token of an AllReduceStart as input 0");
    auto it = started->find(ctx.node.inputs[0]);
    if (it == started->end()) ctx.fail("input 0 '" + ctx.node.inputs[0] + "' is not the token of an AllReduceStart");
    if (ctx.inputs.size() != ctx.outputs.size() + 1) ctx.fail("expected the token, then one input per output");
    const BucketShape s = bucket_inputs(ctx, 1, true);
    if (s.counts != it->second->counts()) ctx.fail("its tensors are not those of its AllReduceStart");
    return std::make_unique<AllReduceWaitKernel>(it->second);
  });
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
