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
    auto round_trip = [&](const std::string& from, const std::string& to, const std::string& tag) {
      const std::string h = base + tag + "/" + std::string(dtype_name(half));
      const TypeInfo* ft = g.type_of(from);
      std::optional<Shape> shape = ft ? ft->shape : std::nullopt;
      out.push_back(cast_node(base + tag + "/to_half", from, h, half));
      out.push_back(cast_node(base + tag + "/to_float", h, to, DType::Float32));
      g.value_info[h] = TypeInfo{half, shape};
      g.value_info[to] = TypeInfo{DType::Float32, shape};
    };
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (n.inputs[i].empty()) continue;
      const std::string rounded = base + "in" + std::to_string(i);
      round_trip(n.inputs[i], rounded, "in" + std::to_string(i));
      n.inputs[i] = rounded;
    }
    std::vector<std::string> finals = n.outputs;
    for (size_t j = 0; j < n.outputs.size(); ++j) {
      const std::string raw = base + "out" + std::to_string(j) + "/float32";
      if (const TypeInfo* ti = g.type_of(n.outputs[j])) g.value_info[raw] = *ti;
      n.outputs[j] = raw;
    }
    out.push_back(std::move(n));
    const Node& op = out.back();
    const std::vector<std::string> raws = op.outputs;
    for (size_t j = 0; j < raws.size(); ++j) round_trip(raws[j], finals[j], "out" + std::to_string(j));
    ++rewritten;
  }
  g.nodes = std::move(out);
  return rewritten;
}

void strip_mixed_precision(Graph& g) {
  // Each round trip is (x -> to_half -> h -> to_float -> y). An input round trip is undone by reading x where
  // y was read; an output round trip by the op writing y again instead of x.
  std::map<std::string, std::string> read_instead;  // y -> x, input round trips
  std::map<std::string, std::string> write_instead;  // x -> y, output round trips
  std::map<std::string, const Node*> half_of;  // h -> its to_half node
  for (const Node& n : g.nodes)
    if (ours(n) && n.name.ends_with("/to_half")) half_of[n.outputs.at(0)] = &n;
  for (const Node& n : g.nodes) {
    if (!ours(n) || !n.name.ends_with("/to_float")) continue;
    auto it = half_of.find(n.inputs.at(0));
    if (it == half_of.end()) fail(n.describe(), "is a mixed-precision cast without its partner; the graph was edited");
    const std::string& x = it->second->inputs.at(0);
    const std::string& y = n.outputs.at(0);
    const std::string stem = n.name.substr(0, n.name.size() - std::string_view("/to_float").size());
    if (stem.substr(stem.rfind('/') + 1).starts_with("out")) write_instead[x] = y;
    else read_instead[y] = x;
  }
  std::erase_if(g.nodes, ours);
  for (Node& n : g.nodes) {
    for (std::string& in : n.inputs)
      if (auto it = read_instead.find(in); it != read_instead.end()) in = it->second;
    for (std::string& o : n.outputs)
      if (auto it = write_instead.find(o); it != write_instead.end()) o = it->second;
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
