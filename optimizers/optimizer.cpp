#include "optimizers/optimizer.h"

#include <algorithm>
#include <cmath>

#include "formulas/optimizer_updates.h"
#include "graph/error.h"
#include "graph/expr.h"

namespace onnxtrain {

using formulas::AdamDecay;
using formulas::AdamScalars;
using formulas::AdamState;

const std::vector<std::string>& optimizer_kinds() {
  static const std::vector<std::string> k = {"sgd", "adam", "adamw", "adagrad"};
  return k;
}

bool glob_match(const std::string& pattern, const std::string& name) {
  // Iterative matcher with one backtrack point: linear in practice, no recursion on long names.
  size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

void require(bool ok, const std::string& key, const std::string& what, double got) {
  if (!ok) fail("optimizer." + key, "expected " + what + ", got " + num(got));
}

bool is_sgd(const OptimizerSpec& s) { return s.kind == "sgd"; }
bool is_adam(const OptimizerSpec& s) { return s.kind == "adam" || s.kind == "adamw"; }

double default_weight_decay(const OptimizerSpec& s) { return s.weight_decay.value_or(s.kind == "adamw" ? 0.01 : 0.0); }
double default_eps(const OptimizerSpec& s) { return s.eps.value_or(s.kind == "adagrad" ? 1e-10 : 1e-8); }

std::vector<int> assign_groups(const OptimizerSpec& spec, const std::vector<std::string>& weights) {
  std::vector<int> group(weights.size(), -1);
  std::vector<bool> used(spec.groups.size(), false);
  for (size_t i = 0; i < weights.size(); ++i)
    for (size_t k = 0; k < spec.groups.size() && group[i] < 0; ++k)
      for (const std::string& pat : spec.groups[k].match)
        if (glob_match(pat, weights[i])) {
          group[i] = static_cast<int>(k);
          used[k] = true;
          break;
        }
  for (size_t k = 0; k < spec.groups.size(); ++k) {
    const std::string key = "optimizer.groups[" + std::to_string(k) + "]";
    if (spec.groups[k].match.empty()) fail(key + ".match", "is empty; list weight names or glob patterns");
    if (!used[k]) {
      std::string pats;
      for (const std::string& p : spec.groups[k].match) pats += (pats.empty() ? "'" : ", '") + p + "'";
      fail(key + ".match", "matches no trainable weight (patterns " + pats +
                               "); an earlier group may have claimed them, the first match wins");
    }
  }
  return group;
}

}  // namespace

void validate_optimizer(const OptimizerSpec& spec, const std::vector<std::string>& weights) {
  const auto& kinds = optimizer_kinds();
  if (std::find(kinds.begin(), kinds.end(), spec.kind) == kinds.end()) {
    std::string all;
    for (const std::string& k : kinds) all += (all.empty() ? "" : ", ") + k;
    fail("optimizer.kind", "unknown optimizer '" + spec.kind + "'; expected one of: " + all);
  }
  auto finite = [](double v) { return std::isfinite(v); };
  require(spec.learning_rate > 0 && finite(spec.learning_rate), "learning_rate", "a positive finite number",
          spec.learning_rate);
  const double wd = default_weight_decay(spec);
  require(wd >= 0 && finite(wd), "weight_decay", "a finite number >= 0", wd);
  require(spec.max_grad_norm >= 0 && finite(spec.max_grad_norm), "max_grad_norm", "a finite number >= 0 (0 = off)",
          spec.max_grad_norm);
  if (spec.gradient_accumulation < 1)
    require(false, "gradient_accumulation", "an integer >= 1", spec.gradient_accumulation);
  if (spec.convention != "torch" && spec.convention != "onnx")
    fail("optimizer.convention", "unknown convention '" + spec.convention + "'; expected torch or onnx");
  if (!is_sgd(spec)) {
    // Options of another optimizer are a mistake the user wants to hear about, not silently ignore.
    if (spec.momentum != 0) fail("optimizer.momentum", "only applies to sgd, not " + spec.kind);
    if (spec.nesterov) fail("optimizer.nesterov", "only applies to sgd, not " + spec.kind);
    if (spec.dampening != 0) fail("optimizer.dampening", "only applies to sgd, not " + spec.kind);
    if (spec.convention != "torch") fail("optimizer.convention", "only applies to sgd, not " + spec.kind);
  }
  if (is_sgd(spec)) {
    require(spec.momentum >= 0 && finite(spec.momentum), "momentum", "a finite number >= 0", spec.momentum);
    if (spec.eps) fail("optimizer.eps", "does not apply to sgd");
    if (spec.convention == "torch") {
      require(spec.dampening >= 0 && spec.dampening <= 1, "dampening", "a number in [0, 1]", spec.dampening);
      if (spec.beta != 1)
        fail("optimizer.beta", "only applies to convention onnx; the torch convention uses dampening = 1 - beta");
      if (spec.nesterov && (spec.momentum <= 0 || spec.dampening != 0))
        fail("optimizer.nesterov", "needs momentum > 0 and dampening 0 (as torch.optim.SGD)");
    } else {
      if (spec.dampening != 0)
        fail("optimizer.dampening", "does not apply to convention onnx; set optimizer.beta (= 1 - dampening)");
      require(finite(spec.beta), "beta", "a finite number", spec.beta);
    }
  }
  if (!is_adam(spec) && spec.amsgrad) fail("optimizer.amsgrad", "only applies to adam and adamw");
  if (!is_adam(spec) && (spec.beta1 != 0.9 || spec.beta2 != 0.999))
    fail(spec.beta1 != 0.9 ? "optimizer.beta1" : "optimizer.beta2", "only applies to adam and adamw");
  if (is_adam(spec)) {
    require(spec.beta1 >= 0 && spec.beta1 < 1, "beta1", "a number in [0, 1)", spec.beta1);
    require(spec.beta2 >= 0 && spec.beta2 < 1, "beta2", "a number in [0, 1)", spec.beta2);
  }
  if (spec.kind != "adagrad" && (spec.lr_decay != 0 || spec.initial_accumulator_value != 0))
    fail(spec.lr_decay != 0 ? "optimizer.lr_decay" : "optimizer.initial_accumulator_value", "only applies to adagrad");
  if (spec.kind == "adagrad") {
    require(spec.lr_decay >= 0 && finite(spec.lr_decay), "lr_decay", "a finite number >= 0", spec.lr_decay);
    require(spec.initial_accumulator_value >= 0 && finite(spec.initial_accumulator_value), "initial_accumulator_value",
            "a finite number >= 0", spec.initial_accumulator_value);
  }
  if (!is_sgd(spec)) {
    const double eps = default_eps(spec);
    require(eps >= 0 && finite(eps), "eps", "a finite number >= 0", eps);
  }
  for (size_t k = 0; k < spec.groups.size(); ++k) {
    const ParamGroup& pg = spec.groups[k];
    const std::string key = "groups[" + std::to_string(k) + "].";
    if (pg.learning_rate)
      require(*pg.learning_rate > 0 && finite(*pg.learning_rate), key + "learning_rate", "a positive finite number",
              *pg.learning_rate);
    if (pg.weight_decay)
      require(*pg.weight_decay >= 0 && finite(*pg.weight_decay), key + "weight_decay", "a finite number >= 0",
              *pg.weight_decay);
  }
  assign_groups(spec, weights);
}

namespace {

class Emitter {
 public:
  Emitter(Graph& g, const OptimizerSpec& spec, OptimizerGraph& out) : g_(g), b_(g, "optim/"), spec_(spec), out_(out) {}

  GraphBuilder& b() { return b_; }

  // A state initializer under its documented name; a clash with the model is an error, never a rename,
  // because checkpoints and tests find state by these names.
  Expr state(const std::string& name, TensorData init) {
    if (g_.initializers.count(name) || g_.type_of(name))
      fail("optimizer state '" + name + "'", "the model already has a value of this name");
    b_.unique_name(name);  // reserve it (the builder's prefix makes generated names differ anyway)
    TypeInfo t{init.dtype, Shape{}};
    t.shape = Shape{};
    for (int64_t d : init.dims) t.shape->push_back(Dim::of(d));
    g_.initializers[name] = std::move(init);
    out_.state.push_back(name);
    return value(b_, name, t);
  }

  Expr zeros_state(const std::string& name, const Expr& like, double fill = 0.0) {
    const TensorData& w = g_.initializers.at(like.name);
    TensorData d;
    d.dtype = w.dtype;
    d.dims = w.dims;
    d.bytes.assign(static_cast<size_t>(w.numel()) * dtype_size(w.dtype), std::byte{0});  // w may be hollow
    if (fill != 0.0) {
      if (w.dtype == DType::Float64)
        std::fill(d.as_mut<double>().begin(), d.as_mut<double>().end(), fill);
      else if (w.dtype == DType::Float32)
        std::fill(d.as_mut<float>().begin(), d.as_mut<float>().end(), static_cast<float>(fill));
      else
        fail("optimizer state '" + name + "'", "a non-zero initial value needs a float32 or float64 weight");
    }
    return state(name, std::move(d));
  }

  void update(const Expr& v, const std::string& target) { out_.updates.emplace_back(v.name, target); }

  // A float64 runtime scalar cast to the weight's dtype: hyperparameter arithmetic stays in double, as torch
  // does it in Python floats before handing the result to the kernel.
  Expr as(const Expr& s, DType t) { return cast(s, t); }

 private:
  Graph& g_;
  GraphBuilder b_;
  const OptimizerSpec& spec_;
  OptimizerGraph& out_;
};

std::vector<Expr> adam_scalar_list(const AdamScalars<Expr>& s, AdamDecay decay) {
  std::vector<Expr> v{s.beta1, s.one_minus_beta1, s.beta2, s.one_minus_beta2, s.bias_correction2_sqrt, s.eps,
                      s.step_size};
  if (decay != AdamDecay::None) v.push_back(s.decay);
  return v;
}

// One weight's Adam update as one node of kOptimizerDomain. The kernels take float32 and float64; a weight of
// another type gets the same formula as standard ops in the graph itself.
AdamState<Expr> adam_update_node(GraphBuilder& b, AdamDecay decay, bool amsgrad, const Expr& p, const Expr& g,
                                 const Expr& m, const Expr& v, const Expr& vmax, const AdamScalars<Expr>& s) {
  if (p.dtype() != DType::Float32 && p.dtype() != DType::Float64)
    return formulas::with_adam_variant(decay, amsgrad, [&]<AdamDecay D, bool A>() {
      return formulas::adam_update<D, A>(p, g, m, v, vmax, s);
    });
  std::vector<Expr> in{p, g, m, v};
  if (amsgrad) in.push_back(vmax);
  for (const Expr& x : adam_scalar_list(s, decay)) in.push_back(x);
  std::vector<Expr> out = apply_n(b, formulas::adam_update_op(decay, amsgrad), in,
                                  std::vector<TypeInfo>(amsgrad ? 4 : 3, p.type), {}, kOptimizerDomain);
  return {out[0], out[1], out[2], amsgrad ? out[3] : Expr{}};
}

// The body of adam_update_op(decay, amsgrad): the template evaluated on the function's inputs.
Function adam_update_function(AdamDecay decay, bool amsgrad) {
  Graph g;
  GraphBuilder b(g, "adam/");
  const TypeInfo any{DType::Float32, std::nullopt};  // no constants in the body: the type is only for Expr's checks
  Function f;
  f.name = formulas::adam_update_op(decay, amsgrad);
  f.domain = kOptimizerDomain;
  f.opset_imports = {{"", 17}};
  auto input = [&](const std::string& name) {
    f.inputs.push_back(name);
    return value(b, name, any);
  };
  const Expr p = input("P"), grad = input("G"), m = input("M"), v = input("V");
  const Expr vmax = amsgrad ? input("Vmax") : Expr{};
  AdamScalars<Expr> s;
  Expr* fields[] = {&s.beta1, &s.one_minus_beta1, &s.beta2, &s.one_minus_beta2, &s.bias_correction2_sqrt, &s.eps,
                    &s.step_size, &s.decay};
  for (int i = 0; i < formulas::adam_scalar_inputs(decay); ++i) *fields[i] = input(formulas::kAdamScalarNames[i]);
  const AdamState<Expr> r = formulas::with_adam_variant(decay, amsgrad, [&]<AdamDecay D, bool A>() {
    return formulas::adam_update<D, A>(p, grad, m, v, vmax, s);
  });
  // The results' generated names become the function's outputs.
  std::map<std::string, std::string> rename{{r.p.name, "P_new"}, {r.m.name, "M_new"}, {r.v.name, "V_new"}};
  if (amsgrad) rename[r.vmax.name] = "Vmax_new";
  for (Node& n : g.nodes) {
    for (std::string& x : n.inputs)
      if (auto it = rename.find(x); it != rename.end()) x = it->second;
    for (std::string& x : n.outputs)
      if (auto it = rename.find(x); it != rename.end()) x = it->second;
  }
  f.outputs = {"P_new", "M_new", "V_new"};
  if (amsgrad) f.outputs.push_back("Vmax_new");
  f.nodes = std::move(g.nodes);
  f.doc = std::string("One weight's ") + (decay == AdamDecay::Decoupled ? "AdamW" : "Adam") +
          (decay == AdamDecay::L2 ? " (L2 weight decay)" : "") + (amsgrad ? " amsgrad" : "") +
          " update in torch's order (onnxtrain formulas/optimizer_updates.h, docs/optimizers.md).";
  return f;
}

}  // namespace

std::vector<Function> optimizer_update_functions() {
  std::vector<Function> out;
  for (AdamDecay d : formulas::kAdamDecays)
    for (bool amsgrad : {false, true}) out.push_back(adam_update_function(d, amsgrad));
  return out;
}

OptimizerGraph append_optimizer(Graph& g, const std::map<std::string, std::string>& grads, const OptimizerSpec& spec,
                                OptimizerPhase phase, const AccumulatedHook& accumulated) {
  std::vector<std::string> weights;
  for (const auto& [w, gname] : grads) weights.push_back(w);
  validate_optimizer(spec, weights);
  const std::vector<int> group_index = assign_groups(spec, weights);

  OptimizerGraph out;
  for (size_t i = 0; i < weights.size(); ++i) out.group_of[weights[i]] = group_index[i];
  Emitter e(g, spec, out);
  GraphBuilder& b = e.b();
  const int n_acc = spec.gradient_accumulation;

  std::map<std::string, Expr> wv, gv;
  for (const std::string& w : weights) {
    if (!g.initializers.count(w)) fail("trainable '" + w + "'", "the optimizer updates initializers only");
    wv.emplace(w, value(b, w));
    gv.emplace(w, value(b, grads.at(w)));
  }

  // Accumulation: buffers hold the sum of the micro-batch gradients so far.
  if (n_acc > 1) {
    std::map<std::string, std::string> sums;
    std::map<std::string, TypeInfo> sum_types;
    for (const std::string& w : weights) {
      Expr buf = e.zeros_state(w + ".grad_accum", wv.at(w));
      Expr total = buf + gv.at(w);
      if (phase == OptimizerPhase::AccumulateOnly) {
        e.update(total, buf.name);
      } else {
        sums[w] = total.name;
        sum_types[w] = total.type;
        e.update(zeros_like(buf), buf.name);
      }
    }
    if (phase != OptimizerPhase::AccumulateOnly) {
      if (accumulated) accumulated(g, sums);
      for (const std::string& w : weights) gv.at(w) = value(b, sums.at(w), sum_types.at(w)) / static_cast<double>(n_acc);
    }
  }
  if (phase == OptimizerPhase::AccumulateOnly) return out;

  // Learning rates and the step counter: variables, so a schedule can write them with no re-planning.
  Expr lr_default = e.state("optim.lr", TensorData::scalar<double>(spec.learning_rate));
  out.learning_rate = lr_default.name;
  std::vector<Expr> lr_group;
  for (size_t k = 0; k < spec.groups.size(); ++k) {
    lr_group.push_back(e.state("optim.lr." + std::to_string(k),
                               TensorData::scalar<double>(spec.groups[k].learning_rate.value_or(spec.learning_rate))));
    out.group_learning_rates.push_back(lr_group.back().name);
  }
  Expr step = e.state("optim.step", TensorData::scalar<int64_t>(0));
  out.step = step.name;
  Expr new_step = step + 1.0;
  e.update(new_step, step.name);
  Expr t = cast(new_step, DType::Float64);  // 1 on the first update, as torch's step after "step += 1"
  Expr f64_one = scalar(b, DType::Float64, 1.0);

  // Global-norm clipping, before weight decay and the update, as clip_grad_norm_ then optimizer.step().
  if (spec.max_grad_norm > 0) {
    std::vector<Expr> squares;
    for (const std::string& w : weights) {
      Expr sq = apply(b, "ReduceSumSquare", {gv.at(w)}, TypeInfo{gv.at(w).dtype(), Shape{}}, {{"keepdims", int64_t{0}}});
      squares.push_back(cast(sq, DType::Float64));
    }
    Expr total_norm = sqrt(sum(squares));
    Expr coef = scalar(b, DType::Float64, spec.max_grad_norm) / (total_norm + 1e-6);
    Expr clamped = apply(b, "Min", {coef, f64_one}, TypeInfo{DType::Float64, Shape{}});
    for (const std::string& w : weights) gv.at(w) = gv.at(w) * cast(clamped, gv.at(w).dtype());
  }

  const double wd_default = default_weight_decay(spec);
  const double eps = default_eps(spec);

  // Step-dependent scalars shared by every weight: emitted once.
  std::optional<Expr> bias_correction1, bias_correction2_sqrt, first_step, adagrad_div;
  if (is_adam(spec)) {
    bias_correction1 = 1.0 - pow(scalar(b, DType::Float64, spec.beta1), t);
    bias_correction2_sqrt = sqrt(1.0 - pow(scalar(b, DType::Float64, spec.beta2), t));
  }
  if (is_sgd(spec)) first_step = equal(step, scalar(b, DType::Int64, 0.0));
  if (spec.kind == "adagrad") adagrad_div = 1.0 + (t - 1.0) * spec.lr_decay;

  // Per (group, dtype) derived learning rates, so a model with many weights emits them once.
  std::map<std::pair<int, DType>, Expr> lr_cache, step_size_cache, decay_cache, bias_correction2_cache;
  // Hyper-parameter constants of the weight's dtype, one node per value.
  std::map<std::pair<DType, double>, Expr> constants;
  auto constant_of = [&](DType d, double v) {
    auto it = constants.find({d, v});
    if (it == constants.end()) it = constants.emplace(std::make_pair(d, v), scalar(b, d, v)).first;
    return it->second;
  };
  auto group_lr64 = [&](int k) { return k < 0 ? lr_default : lr_group[static_cast<size_t>(k)]; };
  auto cached = [&](std::map<std::pair<int, DType>, Expr>& c, int k, DType d, auto make) {
    auto key = std::make_pair(k, d);
    auto it = c.find(key);
    if (it == c.end()) it = c.emplace(key, cast(make(), d)).first;
    return it->second;
  };

  for (size_t i = 0; i < weights.size(); ++i) {
    const std::string& w = weights[i];
    const int k = group_index[i];
    Expr p = wv.at(w);
    Expr grad = gv.at(w);
    const DType dt = p.dtype();
    if (grad.dtype() != dt) grad = cast(grad, dt);
    const double wd = k >= 0 ? spec.groups[static_cast<size_t>(k)].weight_decay.value_or(wd_default) : wd_default;
    Expr lr = cached(lr_cache, k, dt, [&] { return group_lr64(k); });

    if (spec.kind == "sgd") {
      if (spec.convention == "torch") {
        Expr d = wd != 0 ? grad + p * wd : grad;
        if (spec.momentum != 0) {
          Expr buf = e.zeros_state(w + ".momentum_buffer", p);
          Expr next = buf * spec.momentum + d * (1.0 - spec.dampening);
          // torch starts the buffer as a copy of the first gradient (no dampening on step 1).
          Expr nb = where(*first_step, d, next);
          e.update(nb, buf.name);
          d = spec.nesterov ? d + nb * spec.momentum : nb;
        }
        e.update(p - lr * d, w);
      } else {
        // ai.onnx.preview.training Momentum: G_reg = norm_coefficient*X + G; beta_adj = T > 0 ? beta : 1;
        // V_new = alpha*V + beta_adj*G_reg; X_new = X - R*V_new (standard) or X - R*(G_reg + alpha*V_new).
        Expr v = e.zeros_state(w + ".momentum_buffer", p);
        Expr greg = grad + p * wd;
        Expr beta_adj = where(*first_step, scalar(b, dt, 1.0), scalar(b, dt, spec.beta));
        Expr nv = v * spec.momentum + beta_adj * greg;
        e.update(nv, v.name);
        e.update(spec.nesterov ? p - lr * (greg + nv * spec.momentum) : p - lr * nv, w);
      }
    } else if (is_adam(spec)) {
      // One onnxtrain.Adam*Update node per weight: its CPU and CUDA kernels and its standard-ONNX body all evaluate
      // formulas::adam_update (optimizer_update_functions() below), so there is one description of the step.
      Expr m = e.zeros_state(w + ".exp_avg", p);
      Expr v = e.zeros_state(w + ".exp_avg_sq", p);
      Expr vmax = spec.amsgrad ? e.zeros_state(w + ".max_exp_avg_sq", p) : Expr{};
      const AdamDecay decay = wd == 0 ? AdamDecay::None : spec.kind == "adamw" ? AdamDecay::Decoupled : AdamDecay::L2;
      AdamScalars<Expr> s{constant_of(dt, spec.beta1), constant_of(dt, 1.0 - spec.beta1), constant_of(dt, spec.beta2),
                          constant_of(dt, 1.0 - spec.beta2),
                          cached(bias_correction2_cache, -1, dt, [&] { return *bias_correction2_sqrt; }),
                          constant_of(dt, eps),
                          cached(step_size_cache, k, dt, [&] { return group_lr64(k) / *bias_correction1; }),
                          Expr{}};
      if (decay == AdamDecay::Decoupled)
        s.decay = cached(decay_cache, k, dt, [&] { return 1.0 - group_lr64(k) * wd; });
      else if (decay == AdamDecay::L2)
        s.decay = constant_of(dt, wd);
      const AdamState<Expr> r = adam_update_node(b, decay, spec.amsgrad, p, grad, m, v, vmax, s);
      e.update(r.m, m.name);
      e.update(r.v, v.name);
      if (spec.amsgrad) e.update(r.vmax, vmax.name);
      e.update(r.p, w);
    } else {  // adagrad
      Expr sum_sq = e.zeros_state(w + ".sum", p, spec.initial_accumulator_value);
      Expr d = wd != 0 ? grad + p * wd : grad;
      Expr ns = sum_sq + d * d;
      e.update(ns, sum_sq.name);
      Expr clr = cached(step_size_cache, k, dt, [&] { return group_lr64(k) / *adagrad_div; });
      e.update(p - clr * d / (sqrt(ns) + eps), w);
    }
  }
  return out;
}

}  // namespace onnxtrain
