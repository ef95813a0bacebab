// Control flow on the CPU: If, Loop and Scan. Each subgraph runs in a nested Executor built by the factory,
// which plans it for the concrete shapes seen at the node's plan time. The values a subgraph reads from the
// enclosing scope arrive as the node's extra inputs, after its own (the plan appends them in
// subgraph_outer_references' order, executor/plan.cpp), and are fed to the subgraph as inputs of its own.
//
// Shapes are static: where an output's shape would only be known at run time (If branches that disagree, Loop
// scan outputs whose iteration count is not a plan-time constant) the factory refuses, naming the node.
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

#include "executor/executor.h"
#include "executor/kernel.h"
#include "graph/error.h"
#include "graph/validate.h"

namespace onnxtrain {

namespace {

std::string spec_string(const KernelOutput& o) { return dtype_name(o.dtype) + shape_string(o.shape); }
std::string spec_string(const KernelInput& o) { return dtype_name(o.dtype) + shape_string(o.shape); }

const Graph& graph_attr(const PrepareContext& ctx, const std::string& name) {
  auto it = ctx.node.attributes.find(name);
  const auto* g = it == ctx.node.attributes.end() ? nullptr : std::get_if<std::shared_ptr<Graph>>(&it->second);
  if (!g || !*g) ctx.fail("attribute '" + name + "' (a graph) is required");
  return **g;
}

// One subgraph, planned and run by an Executor of its own. Its inputs are its declared inputs, then the values
// it reads from the enclosing scope (`outer`: indices into the node's inputs).
struct Body {
  std::unique_ptr<Executor> exec;
  std::vector<size_t> outer;  // node input index of each outer value the body reads
  std::vector<KernelOutput> outputs;
  std::vector<const Tensor*> feeds;  // reused per run

  // `own` are the dtypes and shapes of the body's declared inputs for this plan. With `iteration`, the body's
  // first input (Loop's iteration number) is that constant instead, and `own` leaves it out.
  Body(const PrepareContext& ctx, const std::string& attr, const std::vector<KernelOutput>& own,
       std::optional<int64_t> iteration = std::nullopt) {
    Graph g = graph_attr(ctx, attr);
    if (iteration && !g.inputs.empty()) {
      g.initializers[g.inputs[0].name] = TensorData::scalar<int64_t>(*iteration);
      g.inputs.erase(g.inputs.begin());
    }
    if (own.size() != g.inputs.size())
      ctx.fail("'" + attr + "' has " + std::to_string(g.inputs.size()) + " inputs, the node gives it " +
               std::to_string(own.size()));
    // The node's outer references are its last inputs; this body reads a subset of them.
    const std::vector<std::string> all = subgraph_outer_references(ctx.node);
    const size_t first_outer = ctx.node.inputs.size() - all.size();
    Node probe;
    probe.attributes[attr] = std::make_shared<Graph>(g);  // the body's own references (as changed above)
    Graph copy = g;
    // Declared input shapes of a body may be looser than (or, for scalars, spelled differently from) what the
    // node feeds; the dtypes still have to agree, which the Executor checks.
    for (ValueInfo& v : copy.inputs) v.type.shape.reset();
    std::vector<KernelOutput> feeds_spec = own;
    for (const std::string& v : subgraph_outer_references(probe)) {
      size_t k = 0;
      while (k < all.size() && all[k] != v) ++k;
      if (k == all.size()) ctx.fail("'" + attr + "' reads '" + v + "', which the plan did not pass to the node");
      const KernelInput& in = ctx.inputs[first_outer + k];
      outer.push_back(first_outer + k);
      copy.inputs.push_back({v, TypeInfo{in.dtype, std::nullopt}});
      feeds_spec.push_back({in.dtype, in.shape});
    }
    std::map<std::string, int64_t> opsets{{"", ctx.opset}, {"onnxtrain", 1}};
    ExecutorOptions opts;
    opts.device = Device::CPU;
    try {
      exec = std::make_unique<Executor>(std::move(copy), opsets, std::make_shared<TensorStore>(), opts);
      outputs = exec->plan_outputs(feeds_spec);
    } catch (const Error& e) {
      ctx.fail("in '" + attr + "': " + e.what());
    }
  }

  // Runs the body on its own inputs and the node's; the results are views valid until the next run.
  std::span<const Tensor* const> run(std::span<const Tensor* const> own, std::span<const Tensor* const> node_in) {
    feeds.assign(own.begin(), own.end());
    for (size_t i : outer) feeds.push_back(node_in[i]);
    return exec->run(feeds);
  }
};

void copy_into(Tensor& dst, const Tensor& src) {
  if (dst.data != src.data) std::memmove(dst.data, src.data, src.nbytes());
}

// A tensor's layout around one axis: `outer` blocks of `len` slices of `inner` bytes each.
struct AxisLayout {
  int64_t outer = 1, len = 1;
  size_t inner = 1;
  AxisLayout(const std::vector<int64_t>& shape, int64_t axis, DType t) {
    for (int64_t d = 0; d < axis; ++d) outer *= shape[static_cast<size_t>(d)];
    len = shape[static_cast<size_t>(axis)];
    int64_t in = 1;
    for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) in *= shape[d];
    inner = static_cast<size_t>(in) * dtype_size(t);
  }
  // Slice `i` of the whole into a contiguous slice, or back.
  void gather(const void* whole, int64_t i, void* slice) const {
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(static_cast<std::byte*>(slice) + static_cast<size_t>(o) * inner,
                  static_cast<const std::byte*>(whole) + static_cast<size_t>(o * len + i) * inner, inner);
  }
  void scatter(const void* slice, int64_t i, void* whole) const {
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(static_cast<std::byte*>(whole) + static_cast<size_t>(o * len + i) * inner,
                  static_cast<const std::byte*>(slice) + static_cast<size_t>(o) * inner, inner);
  }
};

std::vector<int64_t> without_axis(std::vector<int64_t> s, int64_t axis) {
  s.erase(s.begin() + axis);
  return s;
}
std::vector<int64_t> with_axis(std::vector<int64_t> s, int64_t axis, int64_t len) {
  s.insert(s.begin() + axis, len);
  return s;
}

// Loop-carried values (Loop's v, Scan's state) keep their dtype and shape from one iteration to the next.
void check_carried(const PrepareContext& ctx, const std::vector<KernelOutput>& body_out, size_t first_body_out,
                   const std::vector<KernelInput>& initial) {
  for (size_t i = 0; i < initial.size(); ++i) {
    const KernelOutput& o = body_out[first_body_out + i];
    if (o.dtype != initial[i].dtype || o.shape != initial[i].shape)
      ctx.fail("loop-carried value " + std::to_string(i) + " enters the body as " + spec_string(initial[i]) +
               " and leaves it as " + spec_string(o) + "; a carried value must keep its dtype and shape");
  }
}

// ---- If ----

class IfKernel : public Kernel {
 public:
  explicit IfKernel(PrepareContext& ctx) {
    if (ctx.inputs.empty() || ctx.inputs[0].dtype != DType::Bool || numel_of(ctx.inputs[0].shape) != 1)
      ctx.fail("cond must be a bool tensor with one element");
    std::optional<bool> known;
    if (const Tensor* c = ctx.inputs[0].value) known = *c->ptr<bool>();
    if (!known || *known) then_ = std::make_unique<Body>(ctx, "then_branch", std::vector<KernelOutput>{});
    if (!known || !*known) else_ = std::make_unique<Body>(ctx, "else_branch", std::vector<KernelOutput>{});
    const Body& any = then_ ? *then_ : *else_;
    if (any.outputs.size() != ctx.outputs.size())
      ctx.fail("the branch has " + std::to_string(any.outputs.size()) + " outputs, the node " +
               std::to_string(ctx.outputs.size()));
    if (then_ && else_) {
      if (else_->outputs.size() != then_->outputs.size())
        ctx.fail("then_branch has " + std::to_string(then_->outputs.size()) + " outputs but else_branch " +
                 std::to_string(else_->outputs.size()));
      for (size_t i = 0; i < then_->outputs.size(); ++i)
        if (then_->outputs[i].dtype != else_->outputs[i].dtype || then_->outputs[i].shape != else_->outputs[i].shape)
          ctx.fail("output " + std::to_string(i) + " is " + spec_string(then_->outputs[i]) + " in then_branch but " +
                   spec_string(else_->outputs[i]) +
                   " in else_branch: its shape would depend on the condition at run time, and plans are static");
    }
    for (size_t i = 0; i < ctx.outputs.size(); ++i) ctx.outputs[i] = {any.outputs[i].dtype, any.outputs[i].shape};
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    Body& b = *in[0]->ptr<bool>() ? *then_ : *else_;
    std::span<const Tensor* const> r = b.run({}, in);
    for (size_t i = 0; i < out.size(); ++i) copy_into(*out[i], *r[i]);
  }

 private:
  std::unique_ptr<Body> then_, else_;
};

// ---- Scan (opset 9 and later: no batch axis) ----

class ScanKernel : public Kernel {
 public:
  explicit ScanKernel(PrepareContext& ctx) {
    const Node& n = ctx.node;
    const size_t own = n.inputs.size() - subgraph_outer_references(n).size();
    const int64_t m = n.attr_int("num_scan_inputs", -1);
    if (m < 1 || static_cast<size_t>(m) > own) ctx.fail("num_scan_inputs must be between 1 and the number of inputs");
    M_ = static_cast<size_t>(m);
    N_ = own - M_;
    const std::vector<int64_t> in_axes = n.attr_ints("scan_input_axes", std::vector<int64_t>(M_, 0));
    const std::vector<int64_t> in_dirs = n.attr_ints("scan_input_directions", std::vector<int64_t>(M_, 0));
    if (in_axes.size() != M_ || in_dirs.size() != M_)
      ctx.fail("scan_input_axes and scan_input_directions need one entry per scan input");
    std::vector<KernelOutput> body_in;
    std::vector<KernelInput> initial(ctx.inputs.begin(), ctx.inputs.begin() + static_cast<std::ptrdiff_t>(N_));
    for (const KernelInput& s : initial) {
      if (!s.present()) ctx.fail("every state input is required");
      body_in.push_back({s.dtype, s.shape});
    }
    for (size_t j = 0; j < M_; ++j) {
      const KernelInput& x = ctx.inputs[N_ + j];
      if (!x.present()) ctx.fail("scan input " + std::to_string(j) + " is required");
      const int64_t r = static_cast<int64_t>(x.shape.size());
      int64_t a = in_axes[j] < 0 ? in_axes[j] + r : in_axes[j];
      if (a < 0 || a >= r) ctx.fail("scan_input_axes[" + std::to_string(j) + "] is out of range for " + spec_string(x));
      if (j == 0) len_ = x.shape[static_cast<size_t>(a)];
      else if (x.shape[static_cast<size_t>(a)] != len_)
        ctx.fail("scan inputs disagree on the sequence length: " + std::to_string(len_) + " and " +
                 std::to_string(x.shape[static_cast<size_t>(a)]));
      in_layout_.emplace_back(x.shape, a, x.dtype);
      in_reverse_.push_back(in_dirs[j] != 0);
      slices_.push_back(Tensor::empty(x.dtype, without_axis(x.shape, a)));
      body_in.push_back({x.dtype, slices_.back().shape});
    }
    body_ = std::make_unique<Body>(ctx, "body", body_in);
    const std::vector<KernelOutput>& bo = body_->outputs;
    if (bo.size() < N_ || bo.size() - N_ != ctx.outputs.size() - N_ || ctx.outputs.size() < N_)
      ctx.fail("the body has " + std::to_string(bo.size()) + " outputs; the node has " + std::to_string(N_) +
               " states and " + std::to_string(ctx.outputs.size()) + " outputs");
    check_carried(ctx, bo, 0, initial);
    const size_t K = bo.size() - N_;
    const std::vector<int64_t> out_axes = n.attr_ints("scan_output_axes", std::vector<int64_t>(K, 0));
    const std::vector<int64_t> out_dirs = n.attr_ints("scan_output_directions", std::vector<int64_t>(K, 0));
    if (out_axes.size() != K || out_dirs.size() != K)
      ctx.fail("scan_output_axes and scan_output_directions need one entry per scan output");
    for (size_t i = 0; i < N_; ++i) {
      ctx.outputs[i] = bo[i];
      states_.push_back(Tensor::empty(bo[i].dtype, bo[i].shape));
      next_.push_back(Tensor::empty(bo[i].dtype, bo[i].shape));
    }
    for (size_t k = 0; k < K; ++k) {
      const KernelOutput& y = bo[N_ + k];
      const int64_t r = static_cast<int64_t>(y.shape.size()) + 1;
      const int64_t a = out_axes[k] < 0 ? out_axes[k] + r : out_axes[k];
      if (a < 0 || a >= r) ctx.fail("scan_output_axes[" + std::to_string(k) + "] is out of range");
      ctx.outputs[N_ + k] = {y.dtype, with_axis(y.shape, a, len_)};
      out_layout_.emplace_back(ctx.outputs[N_ + k].shape, a, y.dtype);
      out_reverse_.push_back(out_dirs[k] != 0);
    }
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    for (size_t i = 0; i < N_; ++i) copy_into(states_[i], *in[i]);
    std::vector<const Tensor*> own;
    for (int64_t t = 0; t < len_; ++t) {
      own.clear();
      for (Tensor& s : states_) own.push_back(&s);
      for (size_t j = 0; j < M_; ++j) {
        in_layout_[j].gather(in[N_ + j]->data, in_reverse_[j] ? len_ - 1 - t : t, slices_[j].data);
        own.push_back(&slices_[j]);
      }
      std::span<const Tensor* const> r = body_->run(own, in);
      for (size_t k = 0; k < out_layout_.size(); ++k)
        out_layout_[k].scatter(r[N_ + k]->data, out_reverse_[k] ? len_ - 1 - t : t, out[N_ + k]->data);
      // Through next_: a body may return a state it was fed (or another state's input) unchanged.
      for (size_t i = 0; i < N_; ++i) copy_into(next_[i], *r[i]);
      std::swap(states_, next_);
    }
    for (size_t i = 0; i < N_; ++i) copy_into(*out[i], states_[i]);
  }

 private:
  size_t N_ = 0, M_ = 0;
  int64_t len_ = 0;
  std::unique_ptr<Body> body_;
  std::vector<AxisLayout> in_layout_, out_layout_;
  std::vector<bool> in_reverse_, out_reverse_;
  std::vector<Tensor> slices_, states_, next_;
};

// ---- Loop ----

// True when the body's condition output is, through Identity nodes, its condition input or a constant true (a
// Constant or initializer of the body, or an outer value known true at plan time: torch's export writes Identity
// of an outer Constant): the loop then runs exactly as long as the trip count and the initial condition say.
bool condition_passes_through(const PrepareContext& ctx, const Graph& body) {
  if (body.inputs.size() < 2 || body.outputs.empty()) return false;
  const std::string& in = body.inputs[1].name;
  std::string out = body.outputs[0].name;
  const Node* producer = nullptr;
  for (int hops = 0; hops < 8 && out != in; ++hops) {
    producer = nullptr;
    for (const Node& n : body.nodes)
      for (const std::string& o : n.outputs)
        if (o == out) producer = &n;
    if (!producer || producer->op_type != "Identity" || producer->inputs.size() != 1) break;
    out = producer->inputs[0];
  }
  if (out == in) return true;
  auto is_true = [](const TensorData& t) { return t.dtype == DType::Bool && t.numel() == 1 && t.as<bool>()[0]; };
  if (auto it = body.initializers.find(out); it != body.initializers.end()) return is_true(it->second);
  if (producer && producer->op_type == "Constant") {
    const TensorData* v = producer->attr_tensor("value");
    return v && is_true(*v);
  }
  if (producer) return false;
  // An outer value: the node's extra inputs, in subgraph_outer_references order.
  const std::vector<std::string> outer = subgraph_outer_references(ctx.node);
  const size_t first = ctx.node.inputs.size() - outer.size();
  for (size_t k = 0; k < outer.size(); ++k)
    if (outer[k] == out) {
      const Tensor* v = ctx.inputs[first + k].value;
      return v && v->dtype == DType::Bool && v->numel() == 1 && *v->ptr<bool>();
    }
  return false;
}

class LoopKernel : public Kernel {
 public:
  explicit LoopKernel(PrepareContext& ctx) {
    const Node& n = ctx.node;
    const size_t own = n.inputs.size() - subgraph_outer_references(n).size();
    if (own < 2) ctx.fail("needs the inputs M and cond (either may be empty)");
    N_ = own - 2;
    has_m_ = ctx.inputs[0].present();
    has_cond_ = ctx.inputs[1].present();
    if (has_m_ && (ctx.inputs[0].dtype != DType::Int64 || numel_of(ctx.inputs[0].shape) != 1))
      ctx.fail("the trip count M must be an int64 tensor with one element");
    if (has_cond_ && (ctx.inputs[1].dtype != DType::Bool || numel_of(ctx.inputs[1].shape) != 1))
      ctx.fail("cond must be a bool tensor with one element");
    std::vector<KernelInput> initial(ctx.inputs.begin() + 2, ctx.inputs.begin() + 2 + static_cast<std::ptrdiff_t>(N_));
    std::vector<KernelOutput> body_in{{DType::Int64, {}}, {DType::Bool, {}}};
    for (const KernelInput& v : initial) {
      if (!v.present()) ctx.fail("every loop-carried initial value is required");
      body_in.push_back({v.dtype, v.shape});
    }
    iter_ = Tensor::empty(DType::Int64, {});
    cond_ = Tensor::empty(DType::Bool, {});
    // The number of iterations, where the plan knows it: M is a plan-time constant and nothing ends the loop
    // earlier (no cond input, whereupon ONNX ignores the body's condition; or a constant true one that the body
    // passes through), or the initial condition is a constant false.
    const Graph& body = graph_attr(ctx, "body");
    const bool cond_known = !has_cond_ || ctx.inputs[1].value;
    const bool initial_true = !has_cond_ || (ctx.inputs[1].value && *ctx.inputs[1].value->ptr<bool>());
    std::optional<int64_t> trips;
    if (has_cond_ && cond_known && !initial_true) trips = 0;
    else if (has_m_ && ctx.inputs[0].value && initial_true && (!has_cond_ || condition_passes_through(ctx, body)))
      trips = std::max<int64_t>(0, *ctx.inputs[0].value->ptr<int64_t>());
    try {
      body_ = std::make_unique<Body>(ctx, "body", body_in);
    } catch (const Error& e) {
      // A body whose shapes follow its iteration number (a Slice up to it, as in ONNX's own Loop test) cannot be
      // planned once for every iteration. With a known, bounded number of iterations, each gets a plan of its
      // own in which the iteration number is a constant; the carried values must still keep their shapes.
      const bool needs_value = std::string(e.what()).find("must be known before the step runs") != std::string::npos;
      if (!needs_value || !trips || *trips == 0 || *trips > kMaxUnrolledPlans) throw;
      const std::vector<KernelOutput> rest(body_in.begin() + 1, body_in.end());
      for (int64_t i = 0; i < *trips; ++i) per_iteration_.push_back(std::make_unique<Body>(ctx, "body", rest, i));
    }
    const std::vector<KernelOutput>& bo = body_ ? body_->outputs : per_iteration_.front()->outputs;
    for (const auto& b : per_iteration_)
      for (size_t k = 0; k < bo.size(); ++k)
        if (b->outputs[k].dtype != bo[k].dtype || b->outputs[k].shape != bo[k].shape)
          ctx.fail("body output " + std::to_string(k) + " is " + spec_string(bo[k]) + " in the first iteration but " +
                   spec_string(b->outputs[k]) + " in a later one; plans need static shapes");
    if (bo.size() < 1 + N_ || bo.size() - 1 != ctx.outputs.size())
      ctx.fail("the body has " + std::to_string(bo.size()) + " outputs; the node needs the condition, " +
               std::to_string(N_) + " carried values and one per remaining output (" +
               std::to_string(ctx.outputs.size()) + " outputs)");
    if (bo[0].dtype != DType::Bool || numel_of(bo[0].shape) != 1) ctx.fail("the body's first output (the condition) must be one bool");
    check_carried(ctx, bo, 1, initial);
    for (size_t i = 0; i < N_; ++i) {
      ctx.outputs[i] = bo[1 + i];
      states_.push_back(Tensor::empty(bo[1 + i].dtype, bo[1 + i].shape));
      next_.push_back(Tensor::empty(bo[1 + i].dtype, bo[1 + i].shape));
    }
    const size_t K = bo.size() - 1 - N_;
    if (K > 0) {
      // Scan outputs stack one slice per iteration: their first dim is the number of iterations, which the plan
      // must know.
      if (!trips)
        ctx.fail("has " + std::to_string(K) +
                 " scan output(s) whose length is the number of iterations; the trip count M and the condition "
                 "must be known before the step runs (constants, and a body that passes its condition through), "
                 "else that length is data-dependent and plans need static shapes");
      trips_ = *trips;
      for (size_t k = 0; k < K; ++k) {
        const KernelOutput& y = bo[1 + N_ + k];
        ctx.outputs[N_ + k] = {y.dtype, with_axis(y.shape, 0, trips_)};
        slice_bytes_.push_back(static_cast<size_t>(numel_of(y.shape)) * dtype_size(y.dtype));
      }
    }
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const int64_t m = has_m_ ? *in[0]->ptr<int64_t>() : std::numeric_limits<int64_t>::max();
    bool cond = has_cond_ ? *in[1]->ptr<bool>() : true;
    for (size_t i = 0; i < N_; ++i) copy_into(states_[i], *in[2 + i]);
    std::vector<const Tensor*> own;
    int64_t i = 0;
    for (; i < m && cond; ++i) {
      *iter_.ptr<int64_t>() = i;
      *cond_.ptr<bool>() = cond;
      if (body_) own.assign({&iter_, &cond_});
      else own.assign({&cond_});  // planned per iteration: the iteration number is a constant of that plan
      for (Tensor& s : states_) own.push_back(&s);
      if (!body_ && i >= static_cast<int64_t>(per_iteration_.size()))
        fail("Loop", "ran more iterations than it has plans for");  // guarded at plan time
      std::span<const Tensor* const> r = (body_ ? *body_ : *per_iteration_[static_cast<size_t>(i)]).run(own, in);
      if (has_cond_) cond = *r[0]->ptr<bool>();  // without the cond input, ONNX ignores the body's condition
      for (size_t k = 0; k < slice_bytes_.size(); ++k) {
        if (i >= trips_) fail("Loop", "ran more iterations than planned for its scan outputs");  // guarded at plan time
        std::memcpy(static_cast<std::byte*>(out[N_ + k]->data) + static_cast<size_t>(i) * slice_bytes_[k],
                    r[1 + N_ + k]->data, slice_bytes_[k]);
      }
      for (size_t c = 0; c < N_; ++c) copy_into(next_[c], *r[1 + c]);
      std::swap(states_, next_);
    }
    if (!slice_bytes_.empty() && i != trips_) fail("Loop", "ran fewer iterations than planned for its scan outputs");
    for (size_t c = 0; c < N_; ++c) copy_into(*out[c], states_[c]);
  }

 private:
  size_t N_ = 0;
  bool has_m_ = false, has_cond_ = false;
  int64_t trips_ = 0;
  static constexpr int64_t kMaxUnrolledPlans = 1024;
  std::unique_ptr<Body> body_;                         // one plan for every iteration, or
  std::vector<std::unique_ptr<Body>> per_iteration_;  // one per iteration (shapes follow the iteration number)
  std::vector<size_t> slice_bytes_;
  Tensor iter_, cond_;
  std::vector<Tensor> states_, next_;
};

}  // namespace

void register_cpu_control_flow(KernelRegistry& r) {
  r.add({"", "If", 1, 1 << 30, Device::CPU, {}, [](PrepareContext& c) -> std::unique_ptr<Kernel> { return std::make_unique<IfKernel>(c); }});
  r.add({"", "Scan", 9, 1 << 30, Device::CPU, {}, [](PrepareContext& c) -> std::unique_ptr<Kernel> { return std::make_unique<ScanKernel>(c); }});
  r.add({"", "Loop", 1, 1 << 30, Device::CPU, {}, [](PrepareContext& c) -> std::unique_ptr<Kernel> { return std::make_unique<LoopKernel>(c); }});
}

}  // namespace onnxtrain
