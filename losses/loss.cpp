#include "losses/loss.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>

#include "graph/error.h"
#include "graph/expr.h"

namespace onnxtrain {

const std::vector<std::string>& loss_kinds() {
  static const std::vector<std::string> k = {"square", "mse",           "absolute", "elastic",        "huber",
                                             "neg_log", "cross_entropy", "nll",      "bce_with_logits"};
  return k;
}

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void check_choice(const std::string& key, const std::string& v, const std::vector<std::string>& choices) {
  if (std::find(choices.begin(), choices.end(), v) == choices.end())
    fail("loss." + key, "unknown value '" + v + "'; expected one of: " + join(choices));
}

bool is_one_of(const std::string& v, std::initializer_list<const char*> xs) {
  return std::any_of(xs.begin(), xs.end(), [&](const char* x) { return v == x; });
}

// Options that only some kinds read: setting one for another kind is a mistake worth reporting, since the
// loss would silently ignore it.
void check_option_applies(const LossSpec& s, const std::string& kind) {
  auto only = [&](const std::string& key, bool set, std::initializer_list<const char*> kinds, const std::string& list) {
    if (set && !is_one_of(kind, kinds)) fail("loss." + key, "is read only by " + list + ", not by '" + kind + "'");
  };
  only("half", s.half, {"square"}, "square (mse)");
  only("input", !s.input.empty(), {"neg_log", "cross_entropy"}, "neg_log and cross_entropy");
  only("eps", s.eps.has_value(), {"neg_log"}, "neg_log");
  only("class_weights", !s.class_weights.empty(), {"cross_entropy", "nll"}, "cross_entropy and nll");
  only("label_smoothing", s.label_smoothing != 0.0, {"cross_entropy"}, "cross_entropy");
  only("target_format", s.target_format != "indices", {"cross_entropy"}, "cross_entropy");
  only("pos_weight", !s.pos_weight.empty(), {"bce_with_logits"}, "bce_with_logits");
}

struct Ctx {
  Graph& g;
  GraphBuilder& b;
  const LossSpec& spec;
  std::string kind;  // aliases resolved
  Expr p;
  DType dt;
  LossGraph out;
  int64_t opset = 0;  // the model's ai.onnx opset; 0 when not known
};

Expr fscalar(Ctx& c, double v) { return scalar(c.b, c.dt, v); }

// A user-facing graph input: plain name (no "loss/" prefix) so callers can feed it by a readable name.
Expr add_user_input(Ctx& c, const std::string& base, TypeInfo t) {
  std::string name = GraphBuilder(c.g).unique_name(base);
  c.b.add_input(name, t);
  return value(c.b, name, t);
}

// A constant vector as an initializer (not a Constant node) so it can be inspected and replaced in the model.
Expr add_initializer(Ctx& c, const std::string& base, const std::vector<double>& v) {
  TensorData t;
  t.dtype = c.dt;
  t.dims = {static_cast<int64_t>(v.size())};
  if (c.dt == DType::Float64) {
    t = TensorData::from<double>(t.dims, std::span<const double>(v));
  } else {
    std::vector<float> f(v.begin(), v.end());
    t = TensorData::from<float>(t.dims, std::span<const float>(f));
  }
  std::string name = c.b.unique_name(base);
  c.g.initializers[name] = std::move(t);
  return value(c.b, name, TypeInfo{c.dt, Shape{Dim::of(static_cast<int64_t>(v.size()))}});
}


// Dim `axis` of x as a scalar of the loss dtype: a constant when known statically, else read at run time.
Expr dim_as_float(Ctx& c, const Expr& x, int64_t axis) {
  const Dim& d = (*x.shape())[axis];
  if (d.known()) return fscalar(c, static_cast<double>(d.value));
  Expr idx = constant(c.b, TensorData::scalar<int64_t>(axis));
  Expr n = apply(c.b, "Gather", {shape_of(x), idx}, TypeInfo{DType::Int64, Shape{}}, {{"axis", int64_t{0}}});
  return cast(n, c.dt);
}

Expr numel_as_float(Ctx& c, const Expr& x) {
  if (x.shape() && std::all_of(x.shape()->begin(), x.shape()->end(), [](const Dim& d) { return d.known(); })) {
    double n = 1;
    for (const Dim& d : *x.shape()) n *= static_cast<double>(d.value);
    return fscalar(c, n);
  }
  return cast(apply(c.b, "Size", {x}, TypeInfo{DType::Int64, Shape{}}), c.dt);
}

// The per-sample weights shaped [N, 1, ..., 1] (rank `rank`) so they broadcast over a per-element loss.
std::optional<Expr> sample_weights(Ctx& c, size_t rank) {
  if (!c.spec.sample_weight) return std::nullopt;
  Expr w = value(c.b, c.out.sample_weight);
  if (rank <= 1) return w;
  std::vector<int64_t> dims(rank, 1);
  dims[0] = -1;
  Shape s(rank, Dim::of(1));
  s[0] = (*c.p.shape())[0];
  return reshape(w, int64s(c.b, dims), s);
}

Expr weighted(Ctx& c, const Expr& per_element) {
  auto w = sample_weights(c, *per_element.rank());
  return w ? per_element * *w : per_element;
}

Expr elementwise_mean_or_sum(Ctx& c, const Expr& per_element) {
  Expr total = reduce_sum_all(weighted(c, per_element));
  if (c.spec.reduction == "sum") return total;
  return total / numel_as_float(c, per_element);
}

Expr softplus(const Expr& x) { return apply(*x.b, "Softplus", {x}, x.type); }
Expr max_s(Ctx& c, const Expr& x, double v) { return apply(c.b, "Max", {x, fscalar(c, v)}, x.type); }
Expr min_s(Ctx& c, const Expr& x, double v) { return apply(c.b, "Min", {x, fscalar(c, v)}, x.type); }

// ---- regression -----------------------------------------------------------------------------------------

Expr regression(Ctx& c) {
  const LossSpec& s = c.spec;
  c.out.target = add_user_input(c, "target", c.p.type).name;
  Expr d = c.p - value(c.b, c.out.target);
  Expr l;
  if (c.kind == "square") {
    l = d * d;
    if (s.half) l = l * 0.5;
  } else if (c.kind == "absolute") {
    l = abs(d);
  } else if (c.kind == "elastic") {
    if (!(s.l1 >= 0) || !std::isfinite(s.l1)) fail("loss.l1", "expected a non-negative number, got " + num(s.l1));
    if (!(s.l2 >= 0) || !std::isfinite(s.l2)) fail("loss.l2", "expected a non-negative number, got " + num(s.l2));
    if (s.l1 == 0 && s.l2 == 0) fail("loss.l1, loss.l2", "elastic needs at least one positive coefficient, both are 0");
    if (s.l1 == 0)
      l = s.l2 * (d * d);
    else if (s.l2 == 0)
      l = s.l1 * abs(d);
    else
      l = s.l1 * abs(d) + s.l2 * (d * d);
  } else {  // huber
    if (!(s.delta > 0) || !std::isfinite(s.delta))
      fail("loss.delta", "expected a positive number, got " + num(s.delta));
    // With q = min(|d|, delta): 0.5 q^2 + delta (|d| - q) is 0.5 d^2 below delta and delta (|d| - delta/2)
    // above, one branch-free expression whose gradient is d below delta and delta * sign(d) above.
    Expr a = abs(d);
    Expr q = min_s(c, a, s.delta);
    l = 0.5 * (q * q) + s.delta * (a - q);
  }
  return elementwise_mean_or_sum(c, l);
}

// ---- binary ---------------------------------------------------------------------------------------------

double machine_eps(DType t) {
  return t == DType::Float64 ? std::numeric_limits<double>::epsilon() : std::numeric_limits<float>::epsilon();
}

// -(t log sigmoid(z) * pw + (1 - t) log(1 - sigmoid(z))) = pw t softplus(-z) + (1 - t) softplus(z): no
// cancellation for large |z| on either side.
Expr bce_logits(Ctx& c, const Expr& z, const Expr& t, const std::optional<Expr>& pos_weight) {
  Expr pos = t * softplus(-z);
  if (pos_weight) pos = pos * *pos_weight;
  return pos + (1.0 - t) * softplus(z);
}

Expr binary(Ctx& c) {
  const LossSpec& s = c.spec;
  c.out.target = add_user_input(c, "target", c.p.type).name;
  Expr t = value(c.b, c.out.target);
  if (c.kind == "bce_with_logits") {
    std::optional<Expr> pw;
    if (!s.pos_weight.empty()) {
      const int64_t k = static_cast<int64_t>(s.pos_weight.size());
      if (k > 1) {
        if (!c.p.rank() || *c.p.rank() == 0)
          fail("loss.pos_weight", std::to_string(k) + " values need a prediction with a last axis, '" + c.p.name +
                                      "' is " + (c.p.rank() ? "a scalar" : "of unknown rank"));
        const Dim& last = c.p.shape()->back();
        if (last.known() && last.value != k)
          fail("loss.pos_weight", "expected 1 or " + std::to_string(last.value) +
                                      " values (the prediction's last axis), got " + std::to_string(k));
      }
      pw = add_initializer(c, "pos_weight", s.pos_weight);
    }
    return elementwise_mean_or_sum(c, bce_logits(c, c.p, t, pw));
  }
  // neg_log
  const std::string input = s.input.empty() ? "probability" : s.input;
  check_choice("input", input, {"probability", "logits"});
  const double eps = s.eps ? *s.eps : (input == "probability" ? machine_eps(c.dt) : 0.0);
  if (!(eps >= 0 && eps < 0.5)) fail("loss.eps", "expected a number in [0, 0.5), got " + num(eps));
  if (input == "logits") {
    Expr z = c.p;
    if (eps > 0) {
      // sigmoid is monotonic, so clipping the logit to logit(eps)..logit(1 - eps) is clipping the probability.
      const double bound = std::log((1.0 - eps) / eps);
      z = min_s(c, max_s(c, z, -bound), bound);
    }
    return elementwise_mean_or_sum(c, bce_logits(c, z, t, std::nullopt));
  }
  Expr q = c.p;
  if (eps > 0) q = min_s(c, max_s(c, q, eps), 1.0 - eps);
  Expr l = -(t * log(q) + (1.0 - t) * log(1.0 - q));
  return elementwise_mean_or_sum(c, l);
}

// ---- classification -------------------------------------------------------------------------------------

// logp: log-probabilities with the class axis last (rank r, [N, d1.., C]). Implements torch's nll_loss /
// cross_entropy with one-hot masks and broadcasting only, so no node depends on the opset's axes conventions
// and no gather needs a scatter in the backward pass.
Expr classification(Ctx& c, const Expr& logp, bool smoothing_allowed) {
  const LossSpec& s = c.spec;
  const Shape& ps = *c.p.shape();
  const size_t r = ps.size();
  const Dim class_dim = ps[1];
  const std::string format = s.target_format;
  check_choice("target_format", format, smoothing_allowed ? std::vector<std::string>{"indices", "probabilities"}
                                                          : std::vector<std::string>{"indices"});
  const double eps = s.label_smoothing;
  if (!(eps >= 0 && eps <= 1)) fail("loss.label_smoothing", "expected a number in [0, 1], got " + num(eps));

  std::optional<Expr> cw;
  if (!s.class_weights.empty()) {
    const int64_t k = static_cast<int64_t>(s.class_weights.size());
    if (class_dim.known() && class_dim.value != k)
      fail("loss.class_weights", "expected " + std::to_string(class_dim.value) +
                                     " values (one per class, axis 1 of '" + c.p.name + "'), got " + std::to_string(k));
    cw = add_initializer(c, "class_weight", s.class_weights);
  }
  // Number of classes, statically when the prediction or the weights tell it.
  std::optional<int64_t> n_classes;
  if (class_dim.known()) n_classes = class_dim.value;
  else if (cw) n_classes = static_cast<int64_t>(s.class_weights.size());
  Expr n_classes_f = n_classes ? fscalar(c, static_cast<double>(*n_classes)) : dim_as_float(c, c.p, 1);

  auto sw = sample_weights(c, r);
  auto scale = [&](Expr e) {
    if (cw) e = e * *cw;
    if (sw) e = e * *sw;
    return e;
  };

  if (format == "probabilities") {
    c.out.target = add_user_input(c, "target", c.p.type).name;
    Expr t = value(c.b, c.out.target);
    if (r > 2) {
      std::vector<int64_t> perm(r);
      std::iota(perm.begin(), perm.end(), 0);
      perm.erase(perm.begin() + 1);
      perm.push_back(1);
      t = transpose(t, perm);
    }
    if (eps > 0) t = t * (1.0 - eps) + fscalar(c, eps) / n_classes_f;
    Expr total = -reduce_sum_all(scale(t * logp));
    if (s.reduction == "sum") return total;
    // torch divides by the number of samples (positions), not by the weights.
    return total / (numel_as_float(c, c.p) / n_classes_f);
  }

  // Class indices: shape = prediction's without axis 1.
  Shape ts = ps;
  ts.erase(ts.begin() + 1);
  c.out.target = add_user_input(c, "target", TypeInfo{DType::Int64, ts}).name;
  Expr idx = value(c.b, c.out.target);
  // [N, d1..] -> [N, d1.., 1]: Reshape's 0 copies a dim, so this is valid at every opset (Unsqueeze is not).
  std::vector<int64_t> dims(r, 0);
  dims.back() = 1;
  Shape is = ts;
  is.push_back(Dim::of(1));
  idx = reshape(idx, int64s(c.b, dims), is);

  // From opset 16, each position's target log-probability is gathered ([N, d1.., 1]) rather than picked with a
  // one-hot mask: on a transformer's [tokens, vocabulary] logits that mask and its product were three passes
  // over [N, C] in every forward (W3: about 1.2 ms of a 44 ms step). The backward is then a scatter-add.
  const bool gather = c.opset >= 16;
  std::optional<Expr> valid;  // [N, d1.., 1], 1 where the target is not ignore_index
  if (s.ignore_index) {
    Expr ign = equal(idx, constant(c.b, TensorData::scalar<int64_t>(*s.ignore_index)));
    valid = cast(apply(c.b, "Not", {ign}, ign.type), c.dt);
    // One-hot: -1 matches no class, so an ignored target's row is all zeros (even if ignore_index is a class).
    // Gather: any class will do, the position's weight is 0.
    idx = where(ign, constant(c.b, TensorData::scalar<int64_t>(gather ? 0 : -1)), idx);
  }
  // Both forms give the sum of -w[target] * sw * logp[target] and, for the mean, the sum of the weights w[target]
  // of the counted targets (torch divides by that, or by their count without class weights).
  Expr total;
  std::function<Expr()> weight_sum;
  if (gather) {
    const TypeInfo per_position{c.dt, is};
    Expr picked_logp = apply(c.b, "GatherElements", {logp, idx}, per_position, {{"axis", static_cast<int64_t>(r - 1)}});
    std::optional<Expr> w = valid;  // w[target] where the target counts, 0 where ignored
    if (cw) {
      Expr wt = apply(c.b, "Gather", {*cw, idx}, per_position, {{"axis", int64_t{0}}});
      w = w ? *w * wt : wt;
    }
    Expr nll = w ? picked_logp * *w : picked_logp;
    total = -reduce_sum_all(sw ? nll * *sw : nll);
    weight_sum = [&c, w, picked_logp] { return w ? reduce_sum_all(*w) : numel_as_float(c, picked_logp); };
  } else {
    Expr classes;
    if (n_classes) {
      std::vector<int64_t> v(static_cast<size_t>(*n_classes));
      std::iota(v.begin(), v.end(), 0);
      classes = int64s(c.b, v);
    } else {
      Expr ci = constant(c.b, TensorData::scalar<int64_t>(1));
      Expr cn = apply(c.b, "Gather", {shape_of(c.p), ci}, TypeInfo{DType::Int64, Shape{}}, {{"axis", int64_t{0}}});
      classes = apply(c.b, "Range", {constant(c.b, TensorData::scalar<int64_t>(0)), cn,
                                     constant(c.b, TensorData::scalar<int64_t>(1))},
                      TypeInfo{DType::Int64, Shape{Dim{}}});
    }
    Expr onehot = cast(equal(idx, classes), c.dt);  // [N, d1.., C]
    Expr picked = cw ? onehot * *cw : onehot;       // w[target] at the target's class, 0 elsewhere
    Expr nll = sw ? picked * *sw : picked;
    total = -reduce_sum_all(nll * logp);
    weight_sum = [picked] { return reduce_sum_all(picked); };
  }
  if (eps > 0) {
    // torch: (1 - eps) * nll + eps / C * sum_c(-w_c logp_c), ignored targets masked out of both.
    Expr smooth = scale(valid ? logp * *valid : logp);
    total = (1.0 - eps) * total - reduce_sum_all(smooth) * (fscalar(c, eps) / n_classes_f);
  }
  if (s.reduction == "sum") return total;
  return total / weight_sum();
}

Expr classes_last(Ctx& c, const Expr& x) {
  const size_t r = *x.rank();
  if (r == 2) return x;
  std::vector<int64_t> perm(r);
  std::iota(perm.begin(), perm.end(), 0);
  perm.erase(perm.begin() + 1);
  perm.push_back(1);
  return transpose(x, perm);
}

Expr class_loss(Ctx& c) {
  if (!c.p.rank() || *c.p.rank() < 2)
    fail("loss.kind", "'" + c.kind + "' needs a prediction of rank >= 2 ([N, C, d1, ...]), '" + c.p.name + "' is " +
                          (c.p.rank() ? "of rank " + std::to_string(*c.p.rank()) : std::string("of unknown rank")));
  if (c.kind == "nll") {
    return classification(c, classes_last(c, c.p), false);
  }
  const std::string input = c.spec.input.empty() ? "logits" : c.spec.input;
  check_choice("input", input, {"logits"});
  // The class axis is moved last first: LogSoftmax over the last axis means the same at every opset (before 13
  // it flattens from `axis` on) and uses the fused gradient kernel.
  Expr x = classes_last(c, c.p);
  Expr logp = apply(c.b, "LogSoftmax", {x}, x.type, {{"axis", int64_t{-1}}});
  return classification(c, logp, true);
}

}  // namespace

LossGraph append_loss(Graph& g, const std::string& prediction, const LossSpec& spec, int64_t opset) {
  check_choice("kind", spec.kind, loss_kinds());
  check_choice("reduction", spec.reduction, {"mean", "sum"});
  const std::string kind = spec.kind == "mse" ? "square" : spec.kind;
  check_option_applies(spec, kind);
  const TypeInfo* pt = g.type_of(prediction);
  if (!pt || !is_floating(pt->dtype))
    fail("loss", "prediction '" + prediction + "' must be a floating-point tensor with a known type");
  GraphBuilder b(g, "loss/");
  Ctx c{g, b, spec, kind, value(b, prediction), pt->dtype, {}, opset};
  if (spec.sample_weight) {
    if (!c.p.rank() || *c.p.rank() == 0)
      fail("loss.sample_weight", "needs a prediction with a batch axis, '" + prediction + "' is " +
                                     (c.p.rank() ? "a scalar" : "of unknown rank"));
    c.out.sample_weight = add_user_input(c, "sample_weight", TypeInfo{c.dt, Shape{(*c.p.shape())[0]}}).name;
  }
  Expr l;
  if (is_one_of(kind, {"square", "absolute", "elastic", "huber"}))
    l = regression(c);
  else if (is_one_of(kind, {"neg_log", "bce_with_logits"}))
    l = binary(c);
  else
    l = class_loss(c);
  if (spec.sample_weight) {
    // Inputs read: the model's, then target, then sample_weight (it was created first to be shared).
    auto it = std::find_if(g.inputs.begin(), g.inputs.end(),
                           [&](const ValueInfo& v) { return v.name == c.out.sample_weight; });
    std::rotate(it, it + 1, g.inputs.end());
  }
  c.out.loss = GraphBuilder(g).unique_name("loss");
  b.add_node("Identity", {l.name}, 1, {}, {}, {c.out.loss});
  b.set_type(c.out.loss, l.type);
  return c.out;
}

}  // namespace onnxtrain
