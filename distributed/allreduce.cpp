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

// One bucket's nodes: AllReduce, or AllReduceStart + AllReduceWait.
void emit_bucket(GraphBuilder& b, const std::vector<const ReducedValue*>& bucket, ReduceOp op,
                 const BucketOptions& o, std::map<std::string, std::string>& reduced) {
  if (bucket.empty()) return;
  std::vector<std::string> ins, outs;
  for (const ReducedValue* v : bucket) {
    ins.push_back(v->name);
    outs.push_back(b.unique_name(v->name + "/allreduced"));
  }
  std::map<std::string, Attribute> attrs = {{"reduction", reduce_op_name(op)}};
  if (o.compression != "none") attrs["compression"] = o.compression;
  if (!o.overlap) {
    b.add_node(kAllReduceOp, ins, outs.size(), attrs, kCollectiveDomain, outs);
  } else {
    const std::string token = b.unique_name(ins.front() + "/allreduce_started");
    b.add_node(kAllReduceStartOp, ins, 1, attrs, kCollectiveDomain, {token});
    b.set_type(token, TypeInfo{DType::UInt8, Shape{Dim::of(1)}});
    std::vector<std::string> wait_ins = {token};
    wait_ins.insert(wait_ins.end(), ins.begin(), ins.end());
    b.add_node(kAllReduceWaitOp, wait_ins, outs.size(), {}, kCollectiveDomain, outs);
  }
  for (size_t i = 0; i < ins.size(); ++i) {
    if (const TypeInfo* t = b.graph().type_of(ins[i])) b.set_type(outs[i], *t);
    reduced[ins[i]] = outs[i];
  }
}

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

std::map<std::string, std::string> insert_allreduce(Graph& g, const std::vector<ReducedValue>& values, ReduceOp op,
                                                    size_t bucket_bytes) {
  BucketOptions o;
  o.bucket_bytes = bucket_bytes;
  return insert_allreduce(g, values, op, o);
}

std::map<std::string, std::string> insert_allreduce(Graph& g, const std::vector<ReducedValue>& values, ReduceOp op,
                                                    const BucketOptions& o) {
  if (o.bucket_bytes == 0) fail("bucket_bytes", "expected a positive number of bytes");
  compression_dtype(o.compression, "compression");
  // The order the backward pass produces them: the last layer's gradients first.
  std::map<std::string, size_t> producer;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const std::string& out : g.nodes[i].outputs) producer.emplace(out, i + 1);
  std::vector<const ReducedValue*> order;
  for (const ReducedValue& v : values) order.push_back(&v);
  auto made_at = [&](const ReducedValue* v) {
    auto it = producer.find(v->name);
    return it == producer.end() ? size_t(0) : it->second;
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](const ReducedValue* a, const ReducedValue* b) { return made_at(a) < made_at(b); });
  GraphBuilder b(g, "allreduce/");
  std::map<std::string, std::string> reduced;
  // Buckets fill in that order, one open bucket per dtype (and, with compression, per exactness).
  const bool compress = o.compression != "none";
  using Key = std::pair<DType, bool>;  // dtype, travels uncompressed
  std::map<Key, std::pair<std::vector<const ReducedValue*>, size_t>> open;
  auto emit = [&](const Key& key, std::vector<const ReducedValue*>& bucket) {
    BucketOptions bo = o;
    // Only float32 values are compressed: float64 ones (a float64 model) travel as they are.
    if (key.first != DType::Float32 || key.second) bo.compression = "none";
    emit_bucket(b, bucket, op, bo, reduced);
    bucket.clear();
  };
  for (const ReducedValue* pv : order) {
    const ReducedValue& v = *pv;
    if (v.dtype != DType::Float32 && v.dtype != DType::Float64)
      fail("allreduce of '" + v.name + "'", "expected float32 or float64, got " + dtype_name(v.dtype));
    if (reduced.count(v.name)) fail("allreduce of '" + v.name + "'", "the value is listed twice");
    const Key key{v.dtype, compress && v.exact};
    auto& [bucket, bytes] = open[key];
    if (!bucket.empty() && bytes + v.bytes > o.bucket_bytes) {
      emit(key, bucket);
      bytes = 0;
    }
    bucket.push_back(&v);
    bytes += v.bytes;
  }
  for (auto& [key, ob] : open) emit(key, ob.first);
  return reduced;
}

void place_collectives(Graph& g) {
  if (std::none_of(g.nodes.begin(), g.nodes.end(),
                   [](const Node& n) { return is_op(n, kAllReduceStartOp) || is_op(n, kAllReduceWaitOp); }))
    return;
  sort_topologically(g);
  // Starts: each right after the node producing its last input (the other nodes keep their order).
  {
    std::vector<Node> rest, starts;
    for (Node& n : g.nodes) (is_op(n, kAllReduceStartOp) ? starts : rest).push_back(std::move(n));
    std::map<std::string, size_t> producer;  // value -> 1 + index in rest
    for (size_t i = 0; i < rest.size(); ++i)
      for (const std::string& out : rest[i].outputs) producer.emplace(out, i + 1);
    std::vector<std::pair<size_t, size_t>> after;  // (nodes of rest before it, index into starts)
    for (size_t k = 0; k < starts.size(); ++k) {
      size_t at = 0;
      for (const std::string& in : starts[k].inputs)
        if (auto it = producer.find(in); it != producer.end()) at = std::max(at, it->second);
      after.emplace_back(at, k);
    }
    std::stable_sort(after.begin(), after.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<Node> nodes;
    size_t next = 0;
    for (size_t i = 0; i <= rest.size(); ++i) {
      while (next < after.size() && after[next].first <= i) nodes.push_back(std::move(starts[after[next++].second]));
      if (i < rest.size()) nodes.push_back(std::move(rest[i]));
    }
    g.nodes = std::move(nodes);
  }
  // Waits: as late as possible, and what reads a reduction that completes early (the optimizer's update of the
  // last layers) before the waits of later ones. Each node counts the latest wait it depends on (the waits in
  // start order; -1: none); a stable topological order by (that count, position) runs everything that needs no
  // reduction first (the whole backward pass, with its starts), then wait 0 and what only it enables, wait 1, ...
  const size_t n = g.nodes.size();
  std::map<std::string, size_t> producer;
  for (size_t i = 0; i < n; ++i)
    for (const std::string& out : g.nodes[i].outputs) producer.emplace(out, i);
  std::vector<std::vector<size_t>> readers(n);
  std::vector<size_t> missing(n, 0);
  std::vector<long> dep(n, -1);
  long waits = 0;
  for (size_t i = 0; i < n; ++i) {  // in topological order: producers first
    std::set<size_t> from;
    std::vector<std::string> reads = g.nodes[i].inputs;
    for (const std::string& v : subgraph_outer_references(g.nodes[i])) reads.push_back(v);
    for (const std::string& v : reads)
      if (auto it = producer.find(v); it != producer.end() && it->second != i) from.insert(it->second);
    for (size_t p : from) {
      readers[p].push_back(i);
      dep[i] = std::max(dep[i], dep[p]);
    }
    missing[i] = from.size();
    if (is_op(g.nodes[i], kAllReduceWaitOp)) dep[i] = std::max(dep[i], waits++);
  }
  using Key = std::pair<long, size_t>;
  std::priority_queue<Key, std::vector<Key>, std::greater<>> ready;
  for (size_t i = 0; i < n; ++i)
    if (missing[i] == 0) ready.push({dep[i], i});
  std::vector<Node> nodes;
  nodes.reserve(n);
  while (!ready.empty()) {
    const size_t i = ready.top().second;
    ready.pop();
    nodes.push_back(std::move(g.nodes[i]));
    for (size_t r : readers[i])
      if (--missing[r] == 0) ready.push({dep[r], r});
  }
  if (nodes.size() != n) fail("place_collectives", "the graph has a cycle");
  g.nodes = std::move(nodes);
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

void remove_allreduce(Graph& g) {
  std::map<std::string, std::string> original;
  std::erase_if(g.nodes, [&](const Node& n) {
    if (!is_collective(n)) return false;
    const size_t first = is_op(n, kAllReduceWaitOp) ? 1 : 0;  // a wait's input 0 is its start's token
    if (!is_op(n, kAllReduceStartOp))
      for (size_t i = 0; i < n.outputs.size() && first + i < n.inputs.size(); ++i)
        original[n.outputs[i]] = n.inputs[first + i];
    else
      original[n.outputs.at(0)] = "";
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
