// Gradients of the normalisations, as decompositions into standard ops. Each recomputes the statistics from
// X rather than reading the optional Mean/InvStdDev outputs: those are usually absent (exporters emit only
// Y), and recomputing keeps the rule valid whatever outputs the node has.
//
// All four share one identity. With xhat = (x - mean) * rstd over a set of axes (M elements) and dxhat the
// gradient reaching xhat,
//   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
// LayerNormalization uses the fused onnxtrain.LayerNormalizationGrad, and training-mode BatchNormalization the
// fused onnxtrain.BatchNormalizationGrad, where they apply (see try_fused_layer_norm and batch_norm); the other
// cases keep the decomposition.
#include <algorithm>
#include <string>
#include <vector>

#include "gradients/fused.h"
#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

int64_t rank_of(RuleContext& c, const Expr& x, const char* what) {
  auto r = x.rank();
  if (!r) c.fail(std::string("needs the rank of ") + what);
  return static_cast<int64_t>(*r);
}

// 1/M as a value broadcastable against x reduced over `axes` with keepdims: a constant when the reduced
// dims are known, else computed from x's shape at run time.
Expr inv_count(RuleContext& c, const Expr& x, const std::vector<int64_t>& axes) {
  if (x.shape()) {
    const auto r = static_cast<int64_t>(x.shape()->size());
    double n = 1;
    bool known = true;
    for (int64_t a : axes) {
      const Dim& d = (*x.shape())[a < 0 ? a + r : a];
      known = known && d.known();
      if (d.known()) n *= static_cast<double>(d.value);
    }
    if (known) return scalar(c.builder(), x.dtype(), 1.0 / n);
  }
  if (c.opset() < 13) c.fail("needs static dims for the reduced axes at opset " + std::to_string(c.opset()));
  return reduce_mean(ones_like(x), axes, true);
}

Expr mean_over(RuleContext& c, const Expr& x, const std::vector<int64_t>& axes, const Expr& inv_n) {
  return rules::reduce_sum(x, axes, true, c.opset()) * inv_n;
}

struct Normalized {
  Expr mean, xc, rstd, xhat, var, inv_n;
};

Normalized normalize(RuleContext& c, const Expr& x, const std::vector<int64_t>& axes, double eps) {
  Normalized n;
  n.inv_n = inv_count(c, x, axes);
  n.mean = mean_over(c, x, axes, n.inv_n);
  n.xc = x - n.mean;
  n.var = mean_over(c, n.xc * n.xc, axes, n.inv_n);
  n.rstd = 1.0 / sqrt(n.var + eps);
  n.xhat = n.xc * n.rstd;
  return n;
}

Expr backward(RuleContext& c, const Normalized& n, const Expr& dxhat, const std::vector<int64_t>& axes) {
  return n.rstd * (dxhat - mean_over(c, dxhat, axes, n.inv_n) -
                   n.xhat * mean_over(c, dxhat * n.xhat, axes, n.inv_n));
}

bool has_output(RuleContext& c, size_t i) {
  return i < c.node().outputs.size() && !c.node().outputs[i].empty();
}

// Whether a gradient reaches output i: false when the node has no such output, or when dY(i) is the zero fill
// (a ConstantOfShape of 0) the engine makes for an output nothing downstream differentiates. Exporters keep
// BatchNormalization's running statistics outputs, which rarely feed the loss; their terms are then skipped.
bool gradient_reaches(RuleContext& c, size_t i) {
  if (!has_output(c, i)) return false;
  const std::string name = c.dY(i).name;
  const std::vector<Node>& nodes = c.builder().graph().nodes;
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    if (std::find(it->outputs.begin(), it->outputs.end(), name) == it->outputs.end()) continue;
    if (it->op_type != "ConstantOfShape" || !it->domain.empty()) return true;
    auto v = it->attributes.find("value");
    const TensorData* t = v == it->attributes.end() ? nullptr : std::get_if<TensorData>(&v->second);
    return t && std::any_of(t->bytes.begin(), t->bytes.end(), [](std::byte b) { return b != std::byte{0}; });
  }
  return true;  // a graph input or initializer
}

// [-1, 1, ..., 1] with `ones` ones: a per-channel vector laid along axis 1 of an (N, C, ...) tensor.
Expr per_channel(RuleContext& c, const Expr& v, int64_t ones) {
  std::vector<int64_t> s(1 + ones, 1);
  s[0] = -1;
  return reshape(v, int64s(c.builder(), s));
}

// Every axis but 1 (batch and spatial), and the spatial axes alone.
std::vector<int64_t> axes_but_channel(int64_t r) {
  std::vector<int64_t> a{0};
  for (int64_t i = 2; i < r; ++i) a.push_back(i);
  return a;
}
std::vector<int64_t> spatial_axes(int64_t r) {
  std::vector<int64_t> a;
  for (int64_t i = 2; i < r; ++i) a.push_back(i);
  return a;
}

double epsilon(RuleContext& c) { return c.node().attr_float("epsilon", 1e-5f); }

// The fused onnxtrain.LayerNormalizationGrad applies when Scale has the normalised shape and the node has no
// Mean/InvStdDev outputs (their gradients are not part of the fused op). It needs the statistics, which
// exporters do not emit, so the rule recomputes them: for float X with a second LayerNormalization node (one
// fused pass in any runtime; its Y is unused), for double X with standard ops, since LayerNormalization's
// Mean and InvStdDev are float (stash_type) and would lose double's precision.
bool try_fused_layer_norm(RuleContext& c, int64_t axis, int64_t r) {
  if (has_output(c, 1) || has_output(c, 2)) return false;
  const TypeInfo xt = rules::input_type(c, 0), st = rules::input_type(c, 1);
  auto xd = rules::static_dims(xt), sd = rules::static_dims(st);
  if (!xd || !sd || *sd != std::vector<int64_t>(xd->begin() + axis, xd->end())) return false;
  Expr x = c.X(0), s = c.X(1);
  Expr mean, inv_std;
  if (x.dtype() == DType::Float32) {
    // Mean and InvStdDev have the stash type, float, which is X's type only for float X.
    std::vector<Expr> ins{x, s};  // no bias: only the statistics are read
    TypeInfo stat = x.type;
    for (int64_t i = axis; i < r; ++i) (*stat.shape)[i] = Dim::of(1);
    std::map<std::string, Attribute> attrs{{"axis", axis}, {"epsilon", c.node().attr_float("epsilon", 1e-5f)}};
    std::vector<Expr> st = apply_n(c.builder(), "LayerNormalization", ins, {x.type, stat, stat}, attrs);
    mean = st[1];
    inv_std = st[2];
  } else {
    std::vector<int64_t> axes;
    for (int64_t i = axis; i < r; ++i) axes.push_back(i);
    const Normalized n = normalize(c, x, axes, epsilon(c));
    mean = n.mean;
    inv_std = n.rstd;
  }
  // Outputs of inputs that need no gradient stay unnamed: a frozen Scale/Bias (LoRA, frozen layers) then costs
  // no column sums.
  std::vector<Expr> g = rules::fused_grads(c, "LayerNormalizationGrad", {c.dY(0), x, s, mean, inv_std},
                                           {x.type, s.type, s.type}, {{"axis", axis}});
  c.set_dX(0, g[0]);
  c.set_dX(1, g[1]);
  if (c.needs_dX(2)) {
    auto bd = rules::static_dims(rules::input_type(c, 2));
    c.set_dX(2, bd && *bd == *sd ? g[2] : c.dY(0));  // other bias shapes: the engine sums dY back
  }
  return true;
}

void layer_norm(RuleContext& c) {
  Expr x = c.X(0);
  int64_t axis = c.node().attr_int("axis", -1);
  const int64_t r = rank_of(c, x, "X");
  if (axis < -r || axis >= r) c.fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(r));
  if (axis < 0) axis += r;
  if (try_fused_layer_norm(c, axis, r)) return;
  std::vector<int64_t> axes;
  for (int64_t i = axis; i < r; ++i) axes.push_back(i);
  const Normalized n = normalize(c, x, axes, epsilon(c));
  Expr g = c.dY(0);
  if (c.needs_dX(2)) c.set_dX(2, g);  // the engine sums it back to B's shape
  if (c.needs_dX(1)) c.set_dX(1, g * n.xhat);
  if (!c.needs_dX(0)) return;
  Expr dx = backward(c, n, g * c.X(1), axes);
  // Mean = mean(x); InvStdDev = (var + eps)^-1/2, whose derivative is -rstd^3 * (x - mean) / M.
  // Their type is stash_type's, which need not be X's.
  auto as_x = [&](Expr v) { return v.dtype() == x.dtype() ? v : cast(v, x.dtype()); };
  if (has_output(c, 1)) dx = dx + as_x(c.dY(1)) * n.inv_n;
  if (has_output(c, 2)) dx = dx - as_x(c.dY(2)) * (n.rstd * n.rstd * n.rstd) * n.xc * n.inv_n;
  c.set_dX(0, dx);
}

void instance_norm(RuleContext& c) {
  Expr x = c.X(0);
  const int64_t r = rank_of(c, x, "input");
  if (r < 3) c.fail("needs an input of rank >= 3 (N, C, spatial...)");
  const std::vector<int64_t> axes = spatial_axes(r), outer = axes_but_channel(r);
  const Normalized n = normalize(c, x, axes, epsilon(c));
  Expr g = c.dY(0);
  if (c.needs_dX(2)) c.set_dX(2, rules::reduce_sum(g, outer, false, c.opset()));
  if (c.needs_dX(1)) c.set_dX(1, rules::reduce_sum(g * n.xhat, outer, false, c.opset()));
  if (c.needs_dX(0)) c.set_dX(0, backward(c, n, g * per_channel(c, c.X(1), r - 2), axes));
}

// X is viewed as (N, G, C/G * spatial) and normalised over the last axis. Opset 21 scales per channel,
// opset 18 per group.
void group_norm(RuleContext& c) {
  Expr x = c.X(0);
  const int64_t r = rank_of(c, x, "X");
  if (r < 2) c.fail("needs an input of rank >= 2 (N, C, ...)");
  if (!c.node().has_attr("num_groups")) c.fail("attribute 'num_groups' is required");
  const int64_t groups = c.node().attr_int("num_groups", 1);
  const std::vector<int64_t> grouped_shape{0, groups, -1};
  auto grouped = [&](const Expr& v) { return reshape(v, int64s(c.builder(), grouped_shape)); };
  const std::vector<int64_t> last{2};
  const Normalized n = normalize(c, grouped(x), last, epsilon(c));
  Expr g = c.dY(0);
  if (c.opset() >= 21) {
    const std::vector<int64_t> outer = axes_but_channel(r);
    Expr xhat = reshape_like(n.xhat, x);
    if (c.needs_dX(2)) c.set_dX(2, rules::reduce_sum(g, outer, false, c.opset()));
    if (c.needs_dX(1)) c.set_dX(1, rules::reduce_sum(g * xhat, outer, false, c.opset()));
    if (c.needs_dX(0))
      c.set_dX(0, reshape_like(backward(c, n, grouped(g * per_channel(c, c.X(1), r - 2)), last), x));
  } else {
    const std::vector<int64_t> outer{0, 2};
    Expr gg = grouped(g);
    if (c.needs_dX(2)) c.set_dX(2, rules::reduce_sum(gg, outer, false, c.opset()));
    if (c.needs_dX(1)) c.set_dX(1, rules::reduce_sum(gg * n.xhat, outer, false, c.opset()));
    if (c.needs_dX(0)) c.set_dX(0, reshape_like(backward(c, n, gg * per_channel(c, c.X(1), 1), last), x));
  }
}

// Inference mode: the statistics are inputs, so y = (x - mean) * scale * rstd + B with rstd = (var + eps)^-1/2
// is affine in x. Training mode: the batch statistics over (N, spatial) depend on x; the running statistics
// outputs are momentum blends of the inputs and the batch statistics (population variance).
void batch_norm(RuleContext& c) {
  Expr x = c.X(0);
  const int64_t r = rank_of(c, x, "X");
  if (r < 2) c.fail("needs an input of rank >= 2 (N, C, ...)");
  const std::vector<int64_t> outer = axes_but_channel(r);
  const double eps = epsilon(c);
  const bool training = c.opset() >= 14 && c.node().attr_int("training_mode", 0) != 0;
  if (c.opset() < 14 && c.num_outputs() > 1)
    c.fail("opset " + std::to_string(c.opset()) + " training outputs are not supported (use opset 14+ training_mode)");
  Expr g = c.dY(0);
  auto sum_outer = [&](const Expr& v) { return rules::reduce_sum(v, outer, false, c.opset()); };
  if (!training) {
    if (c.needs_dX(2)) c.set_dX(2, sum_outer(g));
    Expr rstd = 1.0 / sqrt(c.X(4) + eps);  // per channel, [C]
    Expr rstd_c = per_channel(c, rstd, r - 2);
    Expr xc = x - per_channel(c, c.X(3), r - 2);
    if (c.needs_dX(1)) c.set_dX(1, sum_outer(g * xc) * rstd);
    if (c.needs_dX(0) || c.needs_dX(3)) {
      Expr a = c.X(1) * rstd;  // dy/dx per channel
      if (c.needs_dX(0)) c.set_dX(0, g * per_channel(c, a, r - 2));
      if (c.needs_dX(3)) c.set_dX(3, -(sum_outer(g) * a));
    }
    // dy/dvar = (x - mean) * scale * -1/2 (var + eps)^-3/2
    if (c.needs_dX(4)) c.set_dX(4, sum_outer(g * xc) * c.X(1) * (rstd * rstd * rstd) * -0.5);
    return;
  }
  const double momentum = c.node().attr_float("momentum", 0.9f);
  const bool has_mean = gradient_reaches(c, 1), has_var = gradient_reaches(c, 2);
  if (c.needs_dX(3)) c.set_dX(3, has_mean ? c.dY(1) * momentum : zeros_like(c.X(3)));
  if (c.needs_dX(4)) c.set_dX(4, has_var ? c.dY(2) * momentum : zeros_like(c.X(4)));
  if (!c.needs_dX(0) && !c.needs_dX(1) && !c.needs_dX(2)) return;
  Expr dx;
  if (c.opset() >= 15) {
    // The fused op gives Y's share of every gradient; its body needs opset 15 (gradients/fused.h).
    Expr s = c.X(1);
    std::vector<Expr> f = apply_n(c.builder(), "BatchNormalizationGrad", {g, x, s}, {x.type, s.type, s.type},
                                  {{"epsilon", static_cast<float>(eps)}}, kFusedGradDomain);
    c.set_dX(1, f[1]);
    c.set_dX(2, f[2]);
    dx = f[0];
    if (!c.needs_dX(0) || (!has_mean && !has_var)) {
      c.set_dX(0, dx);
      return;
    }
  }
  const Normalized n = normalize(c, x, outer, eps);
  if (!dx.valid()) {
    if (c.needs_dX(2)) c.set_dX(2, sum_outer(g));
    if (c.needs_dX(1)) c.set_dX(1, sum_outer(g * n.xhat));
    if (!c.needs_dX(0)) return;
    dx = backward(c, n, g * per_channel(c, c.X(1), r - 2), outer);
  }
  // running_mean = m * momentum + mean(x) * (1 - momentum); running_var likewise with the population var,
  // whose derivative is 2 (x - mean) / M.
  if (has_mean) dx = dx + per_channel(c, c.dY(1), r - 2) * ((1.0 - momentum) * n.inv_n);
  if (has_var) dx = dx + per_channel(c, c.dY(2), r - 2) * n.xc * ((2.0 * (1.0 - momentum)) * n.inv_n);
  c.set_dX(0, dx);
}

// LpNormalization: y = x / n, n = ||x||_p along axis (p = 1: sum |x|; p = 2: sqrt(sum x^2)). With
// dn/dx = sign(x) (p = 1) or x / n = y (p = 2):
//   dx = dy / n - dn/dx * sum(dy * x) / n^2 = (dy - dn/dx * sum(dy * y)) / n.
void lp_norm(RuleContext& c) {
  const int64_t p = c.node().attr_int("p", 2);
  if (p != 1 && p != 2) c.fail("attribute 'p' must be 1 or 2, got " + std::to_string(p));
  const std::vector<int64_t> axis{c.node().attr_int("axis", -1)};
  Expr x = c.X(0), y = c.Y(0), dy = c.dY(0);
  auto sum = [&](const Expr& v) { return rules::reduce_sum(v, axis, true, c.opset()); };
  Expr n = p == 1 ? sum(abs(x)) : sqrt(sum(x * x));
  Expr dn = p == 1 ? sign(x) : y;
  c.set_dX(0, (dy - dn * sum(dy * y)) / n);
}

// MeanVarianceNormalization: y = xc / s over `axes`, xc = x - mean(x), s = sd + 1e-9, sd = sqrt(mean(xc^2))
// (the schema's function body adds 1e-9 to the standard deviation, not to the variance). Since
// d sd / dx = xc / (M sd) (mean(xc) = 0 removes the mean's term):
//   dx = (dy - mean(dy)) / s - xc * mean(dy * xc) / (s^2 sd).
// A constant input (sd = 0) divides by zero here as the forward nearly does (it returns 0 / 1e-9).
void mean_variance_norm(RuleContext& c) {
  Expr x = c.X(0), g = c.dY(0);
  const int64_t r = rank_of(c, x, "X");
  std::vector<int64_t> axes = c.node().has_attr("axes") ? c.node().attr_ints("axes") : std::vector<int64_t>{0, 2, 3};
  for (int64_t& a : axes) {
    if (a < -r || a >= r) c.fail("axis " + std::to_string(a) + " in 'axes' is out of range for rank " + std::to_string(r));
    if (a < 0) a += r;
  }
  Expr inv_n = inv_count(c, x, axes);
  auto mean = [&](const Expr& v) { return mean_over(c, v, axes, inv_n); };
  Expr xc = x - mean(x);
  Expr sd = sqrt(mean(xc * xc));
  Expr s = sd + 1e-9;
  c.set_dX(0, (g - mean(g)) / s - xc * mean(g * xc) / (s * s * sd));
}

// LRN: y = x * D^-beta, D = bias + alpha / size * W(x^2), where W sums over the channel window
// [c - floor((size - 1) / 2), c + ceil((size - 1) / 2)] (clipped to [0, C)). W is linear along the channel
// axis: a C x C band matrix B applied there (B[k][c] = 1 when channel k is in c's window), as a MatMul with the
// channels moved last. Its adjoint W^T applies B transposed. Then
//   dx = dy * D^-beta - 2 alpha beta / size * x * W^T(dy * x * D^(-beta - 1)).
void lrn(RuleContext& c) {
  Expr x = c.X(0), dy = c.dY(0);
  const int64_t r = rank_of(c, x, "X");
  if (r < 3) c.fail("needs an input of rank >= 3 (N, C, D1, ...)");
  const Dim& cdim = (*x.shape())[1];
  if (!cdim.known()) c.fail("needs the channel count (dim 1 of X) to be known statically");
  if (!c.node().has_attr("size")) c.fail("attribute 'size' is required");
  const int64_t ch = cdim.value, size = c.node().attr_int("size", 1);
  if (size <= 0) c.fail("attribute 'size' must be positive, got " + std::to_string(size));
  const double alpha = c.node().attr_float("alpha", 1e-4f), beta = c.node().attr_float("beta", 0.75f),
               bias = c.node().attr_float("bias", 1.0f);
  const int64_t c1 = (size - 1) / 2, c2 = size / 2;
  auto band = [&](bool transposed) {
    std::vector<double> v(ch * ch, 0.0);
    for (int64_t col = 0; col < ch; ++col)
      for (int64_t k = std::max<int64_t>(0, col - c1); k <= std::min(ch - 1, col + c2); ++k)
        (transposed ? v[col * ch + k] : v[k * ch + col]) = 1.0;
    TensorData t;
    if (x.dtype() == DType::Float32) {
      std::vector<float> f(v.begin(), v.end());
      t = TensorData::from<float>({ch, ch}, std::span<const float>(f));
    } else {
      t = TensorData::from<double>({ch, ch}, std::span<const double>(v));
    }
    return constant(c.builder(), t);
  };
  std::vector<int64_t> last{0}, back{0, r - 1};  // channels to the end, and back to axis 1
  for (int64_t d = 2; d < r; ++d) last.push_back(d);
  last.push_back(1);
  for (int64_t d = 1; d < r - 1; ++d) back.push_back(d);
  auto along_channels = [&](const Expr& v, bool transposed) {
    return transpose(matmul(transpose(v, last), band(transposed)), back);
  };
  Expr d = bias + (alpha / static_cast<double>(size)) * along_channels(x * x, false);
  auto power = [&](const Expr& v, double e) { return pow(v, scalar(c.builder(), v.dtype(), e)); };
  c.set_dX(0, dy * power(d, -beta) -
                  (2.0 * alpha * beta / static_cast<double>(size)) * x * along_channels(dy * x * power(d, -beta - 1.0), true));
}

}  // namespace

void register_norm_rules(GradientRegistry& r) {
  r.add("LayerNormalization", layer_norm);
  r.add("InstanceNormalization", instance_norm);
  r.add("GroupNormalization", group_norm);
  r.add("BatchNormalization", batch_norm);
  r.add("LpNormalization", lp_norm);
  r.add("MeanVarianceNormalization", mean_variance_norm);
  r.add("LRN", lrn);
}

}  // namespace onnxtrain
