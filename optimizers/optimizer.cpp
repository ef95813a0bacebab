#include "optimizers/optimizer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "formulas/optimizer_updates.h"
#include "graph/error.h"
#include "graph/expr.h"

namespace onnxtrain {

using formulas::AdamDecay;
using formulas::AdamScalars;
using formulas::AdamState;
using formulas::AdagradScalars;
using formulas::AdagradState;
using formulas::OnnxMomentumScalars;
using formulas::OnnxMomentumState;
using formulas::SgdMomentum;
using formulas::SgdScalars;
using formulas::SgdState;

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

bool has_update_kernel(DType t) { return t == DType::Float32 || t == DType::Float64; }

// One weight's Adam update as one node of kOptimizerDomain. The kernels take float32 and float64; a weight of
// another type gets the same formula as standard ops in the graph itself.
AdamState<Expr> adam_update_node(GraphBuilder& b, AdamDecay decay, bool amsgrad, const Expr& p, const Expr& g,
                                 const Expr& m, const Expr& v, const Expr& vmax, const AdamScalars<Expr>& s) {
  if (!has_update_kernel(p.dtype()))
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

// A function of kOptimizerDomain whose body is `formula` evaluated on its inputs' graph values (the input named
// `flag`, if any, is bool; the others are of any float type: the bodies hold no constants, so one serves float32 and
// float64). `formula` returns the outputs' values in order; they take the outputs' names.
Function update_function(const std::string& name, const std::vector<std::string>& inputs, const std::string& flag,
                         const std::vector<std::string>& outputs, const std::string& doc,
                         const std::function<std::vector<Expr>(const std::vector<Expr>&)>& formula) {
  Graph g;
  GraphBuilder b(g, "update/");
  std::vector<Expr> in;
  for (const std::string& x : inputs)
    in.push_back(value(b, x, TypeInfo{x == flag ? DType::Bool : DType::Float32, std::nullopt}));
  const std::vector<Expr> results = formula(in);
  std::map<std::string, std::string> rename;
  for (size_t i = 0; i < outputs.size(); ++i) rename[results.at(i).name] = outputs[i];
  for (Node& n : g.nodes) {
    for (std::string& x : n.inputs)
      if (auto it = rename.find(x); it != rename.end()) x = it->second;
    for (std::string& x : n.outputs)
      if (auto it = rename.find(x); it != rename.end()) x = it->second;
  }
  Function f;
  f.name = name;
  f.domain = kOptimizerDomain;
  f.inputs = inputs;
  f.outputs = outputs;
  f.nodes = std::move(g.nodes);
  f.opset_imports = {{"", 17}};
  f.doc = doc + " In torch's order (onnxtrain formulas/optimizer_updates.h, docs/optimizers.md).";
  return f;
}

Function adam_update_function(AdamDecay decay, bool amsgrad) {
  std::vector<std::string> inputs{"P", "G", "M", "V"};
  if (amsgrad) inputs.push_back("Vmax");
  for (int i = 0; i < formulas::adam_scalar_inputs(decay); ++i) inputs.push_back(formulas::kAdamScalarNames[i]);
  std::vector<std::string> outputs{"P_new", "M_new", "V_new"};
  if (amsgrad) outputs.push_back("Vmax_new");
  const std::string doc = std::string("One weight's ") + (decay == AdamDecay::Decoupled ? "AdamW" : "Adam") +
                          (decay == AdamDecay::L2 ? " (L2 weight decay)" : "") + (amsgrad ? " amsgrad" : "") + " update.";
  return update_function(formulas::adam_update_op(decay, amsgrad), inputs, "", outputs, doc,
                         [&](const std::vector<Expr>& in) {
                           const size_t a = amsgrad ? 5 : 4;
                           AdamScalars<Expr> s{in[a], in[a + 1], in[a + 2], in[a + 3], in[a + 4], in[a + 5], in[a + 6],
                                               decay == AdamDecay::None ? Expr{} : in[a + 7]};
                           const AdamState<Expr> r = formulas::with_adam_variant(
                               decay, amsgrad, [&]<AdamDecay D, bool A>() {
                                 return formulas::adam_update<D, A>(in[0], in[1], in[2], in[3], amsgrad ? in[4] : Expr{}, s);
                               });
                           std::vector<Expr> out{r.p, r.m, r.v};
                           if (amsgrad) out.push_back(r.vmax);
                           return out;
                         });
}

std::vector<Expr> sgd_scalar_list(const SgdScalars<Expr>& s, bool l2, SgdMomentum momentum) {
  std::vector<Expr> v{s.lr};
  if (l2) v.push_back(s.decay);
  if (momentum != SgdMomentum::None) v.insert(v.end(), {s.momentum, s.one_minus_dampening});
  return v;
}

Function sgd_update_function(bool l2, SgdMomentum momentum) {
  const bool with_buffer = momentum != SgdMomentum::None;
  std::vector<std::string> inputs{"P", "G"};
  if (with_buffer) inputs.insert(inputs.end(), {"Buf", "FirstStep"});
  inputs.push_back("Lr");
  if (l2) inputs.push_back("Decay");
  if (with_buffer) inputs.insert(inputs.end(), {"Momentum", "OneMinusDampening"});
  std::vector<std::string> outputs{"P_new"};
  if (with_buffer) outputs.push_back("Buf_new");
  const std::string doc = std::string("One weight's SGD update (torch convention") + (l2 ? ", L2 weight decay" : "") +
                          (momentum == SgdMomentum::Momentum   ? ", momentum"
                           : momentum == SgdMomentum::Nesterov ? ", nesterov momentum"
                                                               : "") +
                          ").";
  return update_function(formulas::sgd_update_op(l2, momentum), inputs, "FirstStep", outputs, doc,
                         [&](const std::vector<Expr>& in) {
                           std::map<std::string, Expr> x;
                           for (size_t i = 0; i < inputs.size(); ++i) x[inputs[i]] = in[i];
                           const SgdScalars<Expr> s{x["Lr"], x["Decay"], x["Momentum"], x["OneMinusDampening"]};
                           const SgdState<Expr> r = formulas::with_sgd_variant(l2, momentum, [&]<bool L, SgdMomentum M>() {
                             return formulas::sgd_update<L, M>(x["P"], x["G"], x["Buf"], x["FirstStep"], s);
                           });
                           std::vector<Expr> out{r.p};
                           if (with_buffer) out.push_back(r.buf);
                           return out;
                         });
}

Function adagrad_update_function(bool l2) {
  std::vector<std::string> inputs{"P", "G", "Sum", "Clr", "Eps"};
  if (l2) inputs.push_back("Decay");
  return update_function(formulas::adagrad_update_op(l2), inputs, "", {"P_new", "Sum_new"},
                         std::string("One weight's Adagrad update") + (l2 ? " (L2 weight decay)." : "."),
                         [&](const std::vector<Expr>& in) {
                           const AdagradScalars<Expr> s{in[3], in[4], l2 ? in[5] : Expr{}};
                           const AdagradState<Expr> r = l2 ? formulas::adagrad_update<true>(in[0], in[1], in[2], s)
                                                           : formulas::adagrad_update<false>(in[0], in[1], in[2], s);
                           return std::vector<Expr>{r.p, r.sum};
                         });
}

// One weight's SGD (torch convention) update as one node; the standard ops of the same formula for a type the
// kernels do not take.
SgdState<Expr> sgd_update_node(GraphBuilder& b, bool l2, SgdMomentum momentum, const Expr& p, const Expr& g,
                               const Expr& buf, const Expr& first_step, const SgdScalars<Expr>& s) {
  if (!has_update_kernel(p.dtype()))
    return formulas::with_sgd_variant(l2, momentum, [&]<bool L, SgdMomentum M>() {
      return formulas::sgd_update<L, M>(p, g, buf, first_step, s);
    });
  const bool with_buffer = momentum != SgdMomentum::None;
  std::vector<Expr> in{p, g};
  if (with_buffer) in.insert(in.end(), {buf, first_step});
  for (const Expr& x : sgd_scalar_list(s, l2, momentum)) in.push_back(x);
  std::vector<Expr> out = apply_n(b, formulas::sgd_update_op(l2, momentum), in,
                                  std::vector<TypeInfo>(with_buffer ? 2 : 1, p.type), {}, kOptimizerDomain);
  return {out[0], with_buffer ? out[1] : Expr{}};
}

AdagradState<Expr> adagrad_update_node(GraphBuilder& b, bool l2, const Expr& p, const Expr& g, const Expr& sum,
                                       const AdagradScalars<Expr>& s) {
  if (!has_update_kernel(p.dtype()))
    return l2 ? formulas::adagrad_update<true>(p, g, sum, s) : formulas::adagrad_update<false>(p, g, sum, s);
  std::vector<Expr> in{p, g, sum, s.clr, s.eps};
  if (l2) in.push_back(s.decay);
  std::vector<Expr> out = apply_n(b, formulas::adagrad_update_op(l2), in, {p.type, p.type}, {}, kOptimizerDomain);
  return {out[0], out[1]};
}

}  // namespace

std::vector<Function> optimizer_update_functions() {
  std::vector<Function> out;
  for (AdamDecay d : formulas::kAdamDecays)
    for (bool amsgrad : {false, true}) out.push_back(adam_update_function(d, amsgrad));
  for (bool l2 : {false, true}) {
    for (SgdMomentum m : formulas::kSgdMomenta) out.push_back(sgd_update_function(l2, m));
    out.push_back(adagrad_update_function(l2));
  }
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
        // One onnxtrain.Sgd*Update node (formulas::sgd_update). torch starts the buffer as a copy of the first
        // gradient (no dampening on step 1).
        const SgdMomentum momentum = spec.momentum == 0 ? SgdMomentum::None
                                     : spec.nesterov    ? SgdMomentum::Nesterov
                                                        : SgdMomentum::Momentum;
        const bool with_buffer = momentum != SgdMomentum::None;
        Expr buf = with_buffer ? e.zeros_state(w + ".momentum_buffer", p) : Expr{};
        SgdScalars<Expr> s{lr, wd != 0 ? constant_of(dt, wd) : Expr{}, Expr{}, Expr{}};
        if (with_buffer) {
          s.momentum = constant_of(dt, spec.momentum);
          s.one_minus_dampening = constant_of(dt, 1.0 - spec.dampening);
        }
        const SgdState<Expr> r =
            sgd_update_node(b, wd != 0, momentum, p, grad, buf, with_buffer ? *first_step : Expr{}, s);
        if (with_buffer) e.update(r.buf, buf.name);
        e.update(r.p, w);
      } else {
        // ai.onnx.preview.training Momentum's step (formulas::onnx_momentum_update, which that op's kernels run too),
        // as standard ops: the gradient's coefficient is 1 on the first step and beta after it.
        Expr v = e.zeros_state(w + ".momentum_buffer", p);
        const OnnxMomentumScalars<Expr> s{lr, constant_of(dt, wd), constant_of(dt, spec.momentum),
                                          where(*first_step, scalar(b, dt, 1.0), scalar(b, dt, spec.beta))};
        const OnnxMomentumState<Expr> r = spec.nesterov ? formulas::onnx_momentum_update<true>(p, grad, v, s)
                                                        : formulas::onnx_momentum_update<false>(p, grad, v, s);
        e.update(r.v, v.name);
        e.update(r.p, w);
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
      // One onnxtrain.Adagrad*Update node (formulas::adagrad_update).
      Expr sum_sq = e.zeros_state(w + ".sum", p, spec.initial_accumulator_value);
      const AdagradScalars<Expr> s{cached(step_size_cache, k, dt, [&] { return group_lr64(k) / *adagrad_div; }),
                                   constant_of(dt, eps), wd != 0 ? constant_of(dt, wd) : Expr{}};
      const AdagradState<Expr> r = adagrad_update_node(b, wd != 0, p, grad, sum_sq, s);
      e.update(r.sum, sum_sq.name);
      e.update(r.p, w);
    }
  }
  return out;
}

}  // namespace onnxtrain
