#include "training/mixed_precision.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "graph/error.h"
#include "graph/expr.h"

namespace onnxtrain {

namespace {

// Every node the pass adds is named with this prefix, which is how the pass recognises its own work.
constexpr std::string_view kPrefix = "mixed_precision/";

Node cast_node(std::string name, std::string in, std::string out, DType to) {
  Node n;
  n.name = std::move(name);
  n.op_type = "Cast";
  n.inputs = {std::move(in)};
  n.outputs = {std::move(out)};
  n.attributes["to"] = static_cast<int64_t>(to);
  return n;
}

bool ours(const Node& n) { return n.name.rfind(kPrefix, 0) == 0; }

}  // namespace

void validate_mixed_precision(const MixedPrecisionSpec& s) {
  if (s.dtype != "none" && s.dtype != "float16" && s.dtype != "bfloat16")
    fail("mixed_precision.dtype", "expected 'none', 'float16' or 'bfloat16', got '" + s.dtype + "'");
  if (!(s.init_scale > 0) || !std::isfinite(s.init_scale))
    fail("mixed_precision.init_scale", "expected a finite number > 0, got " + std::to_string(s.init_scale));
  if (!(s.growth_factor >= 1) || !std::isfinite(s.growth_factor))
    fail("mixed_precision.growth_factor", "expected a finite number >= 1, got " + std::to_string(s.growth_factor));
  if (!(s.backoff_factor > 0 && s.backoff_factor <= 1))
    fail("mixed_precision.backoff_factor", "expected a number > 0 and <= 1, got " + std::to_string(s.backoff_factor));
  if (s.growth_interval < 1)
    fail("mixed_precision.growth_interval", "expected an integer >= 1, got " + std::to_string(s.growth_interval));
}

DType half_dtype(const MixedPrecisionSpec& s) { return s.dtype == "bfloat16" ? DType::BFloat16 : DType::Float16; }

const std::vector<std::string>& mixed_precision_ops() {
  static const std::vector<std::string> ops = {"MatMul", "Gemm", "Conv", "ConvTranspose"};
  return ops;
}

int apply_mixed_precision(Graph& g, DType half) {
  if (std::any_of(g.nodes.begin(), g.nodes.end(), ours)) return 0;
  const auto& ops = mixed_precision_ops();
  std::vector<Node> out;
  out.reserve(g.nodes.size());
  int rewritten = 0;
  for (Node& n : g.nodes) {
    if (!n.domain.empty() || std::find(ops.begin(), ops.end(), n.op_type) == ops.end()) {
      out.push_back(std::move(n));
      continue;
    }
    // The op's float inputs share one dtype, so any typed input tells it.
    DType t = DType::Undefined;
    for (const std::string& in : n.inputs)
      if (const TypeInfo* ti = in.empty() ? nullptr : g.type_of(in); ti && ti->dtype != DType::Undefined) t = ti->dtype;
    if (t != DType::Float32) {
      out.push_back(std::move(n));
      continue;
    }
    const std::string base = std::string(kPrefix) + (n.name.empty() ? n.outputs.at(0) : n.name) + "/";
    // MatMul and Gemm have half-precision kernels and compute in `half`; the others have only float32 kernels
    // and compute on float32 copies of half-rounded values (emulation, docs/gpu.md).
    // A Gemm with a bias scaled by beta != 1 keeps the emulation: its bias gradient, dY * beta, would need a half
    // Mul kernel, which does not exist.
    const bool scaled_bias = n.inputs.size() > 2 && !n.inputs[2].empty() && n.attr_float("beta", 1.0f) != 1.0f;
    const bool in_half = n.op_type == "MatMul" || (n.op_type == "Gemm" && !scaled_bias);
    auto shape_of = [&](const std::string& name) {
      const TypeInfo* ti = g.type_of(name);
      return ti ? ti->shape : std::nullopt;
    };
    auto to_half = [&](const std::string& from, const std::string& tag) {
      const std::string h = base + tag + "/" + std::string(dtype_name(half));
      g.value_info[h] = TypeInfo{half, shape_of(from)};
      out.push_back(cast_node(base + tag + "/to_half", from, h, half));
      return h;
    };
    auto to_float = [&](const std::string& from, const std::string& to, const std::string& tag) {
      g.value_info[to] = TypeInfo{DType::Float32, shape_of(from)};
      out.push_back(cast_node(base + tag + "/to_float", from, to, DType::Float32));
    };
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (n.inputs[i].empty()) continue;
      const std::string tag = "in" + std::to_string(i);
      const std::string h = to_half(n.inputs[i], tag);
      if (in_half) {
        n.inputs[i] = h;
        continue;
      }
      n.inputs[i] = base + tag;
      to_float(h, n.inputs[i], tag);
    }
    std::vector<std::string> finals = n.outputs;
    for (size_t j = 0; j < n.outputs.size(); ++j) {
      const std::string raw = base + "out" + std::to_string(j) + "/" + std::string(dtype_name(in_half ? half : DType::Float32));
      if (const TypeInfo* ti = g.type_of(n.outputs[j])) g.value_info[raw] = TypeInfo{in_half ? half : ti->dtype, ti->shape};
      n.outputs[j] = raw;
    }
    out.push_back(std::move(n));
    const std::vector<std::string> raws = out.back().outputs;
    for (size_t j = 0; j < raws.size(); ++j) {
      const std::string tag = "out" + std::to_string(j);
      to_float(in_half ? raws[j] : to_half(raws[j], tag), finals[j], tag);
    }
    ++rewritten;
  }
  g.nodes = std::move(out);
  return rewritten;
}

void strip_mixed_precision(Graph& g) {
  // Each of our casts is an edge x -> y. An input-side cast (tag "in<i>") is undone by the op reading x where it
  // read y, an output-side one ("out<j>") by the op writing y where it wrote x; a round trip is two such edges
  // and is followed to its end. MatMul/Gemm have one cast per input and output, the emulated ops two.
  std::map<std::string, std::string> read_instead;   // y -> x, input side
  std::map<std::string, std::string> write_instead;  // x -> y, output side
  for (const Node& n : g.nodes) {
    if (!ours(n)) continue;
    if (n.op_type != "Cast" || n.inputs.size() != 1 || n.outputs.size() != 1)
      fail(n.describe(), "is named as a mixed-precision cast but is not one; the graph was edited");
    const std::string stem = n.name.substr(0, n.name.rfind('/'));
    if (stem.substr(stem.rfind('/') + 1).starts_with("out")) write_instead[n.inputs[0]] = n.outputs[0];
    else read_instead[n.outputs[0]] = n.inputs[0];
  }
  auto follow = [](const std::map<std::string, std::string>& m, std::string v) {
    for (auto it = m.find(v); it != m.end(); it = m.find(v)) v = it->second;
    return v;
  };
  std::erase_if(g.nodes, ours);
  for (Node& n : g.nodes) {
    for (std::string& in : n.inputs) in = follow(read_instead, in);
    for (std::string& o : n.outputs) o = follow(write_instead, o);
  }
  std::erase_if(g.value_info, [](const auto& kv) { return kv.first.rfind(kPrefix, 0) == 0; });
}

std::vector<std::string> loss_scale_state_names() { return {kLossScale, kInvLossScale, kGrowthTracker, kOverflowSteps}; }

void add_loss_scale_state(Graph& g, const MixedPrecisionSpec& spec) {
  const float scale = static_cast<float>(spec.init_scale);
  g.initializers[kLossScale] = TensorData::scalar<float>(scale);
  g.initializers[kInvLossScale] = TensorData::scalar<float>(1.0f / scale);
  g.initializers[kGrowthTracker] = TensorData::scalar<int64_t>(0);
  g.initializers[kOverflowSteps] = TensorData::scalar<int64_t>(0);
}

void unscale_gradients(Graph& g, std::map<std::string, std::string>& grads) {
  GraphBuilder b(g, "mixed_precision.unscale/");
  const Expr inv = value(b, kInvLossScale);
  for (auto& [w, grad] : grads) {
    const Expr gw = value(b, grad);
    if (gw.dtype() != DType::Float32)
      fail("mixed_precision", "trains float32 weights only; the gradient of '" + w + "' is " + dtype_name(gw.dtype()));
    grad = (gw * inv).name;
  }
}

void guard_updates_with_loss_scale(Graph& g, const std::string& loss, const std::vector<std::string>& grads,
                                   std::vector<std::pair<std::string, std::string>>& updates,
                                   const MixedPrecisionSpec& spec) {
  GraphBuilder b(g, "mixed_precision.guard/");
  // x * 0 is 0 where x is finite and NaN where it is not; a dot product of that with itself is one NaN-or-0
  // scalar per tensor (MatMul rather than a reduction, which every device has), and their sum is NaN exactly
  // when some element of the loss or a gradient is not finite. NaN is the one value not equal to itself.
  Expr total = value(b, loss) * 0.0;
  const Expr row = int64s(b, {1, -1}), col = int64s(b, {-1, 1});
  for (const std::string& gname : grads) {
    const Expr z = value(b, gname) * 0.0;
    total = total + reshape(matmul(reshape(z, row), reshape(z, col)), int64s(b, {}), Shape{});
  }
  const Expr found = apply(b, "Not", {equal(total, total)}, TypeInfo{DType::Bool, Shape{}});
  for (auto& [fresh, state] : updates) {
    const Expr old = value(b, state);
    fresh = where(found, old, value(b, fresh, old.type)).name;
  }

  const Expr scale = value(b, kLossScale), tracker = value(b, kGrowthTracker), overflows = value(b, kOverflowSteps);
  const Expr zero_i = scalar(b, DType::Int64, 0);
  const Expr next = tracker + scalar(b, DType::Int64, 1);
  const Expr grow = equal(next, scalar(b, DType::Int64, static_cast<double>(spec.growth_interval)));
  const Expr grown = scale * spec.growth_factor;
  const Expr grown_finite = equal(grown * 0.0, scalar(b, DType::Float32, 0));  // torch keeps the scale otherwise
  const Expr kept = where(grow, where(grown_finite, grown, scale), scale);
  const Expr new_scale = where(found, scale * spec.backoff_factor, kept);
  const Expr new_tracker = where(found, zero_i, where(grow, zero_i, next));
  const Expr new_overflows = overflows + cast(found, DType::Int64);
  const Expr new_inv = 1.0 / new_scale;  // exact for the powers of two the defaults produce
  updates.emplace_back(new_scale.name, kLossScale);
  updates.emplace_back(new_inv.name, kInvLossScale);
  updates.emplace_back(new_tracker.name, kGrowthTracker);
  updates.emplace_back(new_overflows.name, kOverflowSteps);
}

}  // namespace onnxtrain
