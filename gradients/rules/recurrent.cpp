// Gradients of the recurrent op family (see register_recurrent_rules in gradients/rule.h): LSTM, GRU, RNN.
//
// Design. Each rule emits one fused op of the onnxtrain domain, LSTMGrad / GRUGrad / RNNGrad, whose native CPU
// kernel (executor/cpu/recurrent.cpp) does backpropagation through time. Its inputs are the forward node's
// inputs (absent ones stay absent) followed by the incoming gradients of Y, Y_h (and Y_c); output i is the
// gradient of forward input i (dX, dW, dR, dB, -, d initial_h, d initial_c, dP), and the forward node's
// attributes are copied onto it. The kernel recomputes the forward pass (keeping each step's state and gate
// pre-activations) instead of reading saved gates: that keeps the forward op a standard ONNX node with its
// standard outputs, and costs one extra forward pass, which is small next to the backward pass.
//
// Function bodies. The project rule is that fused gradient ops also carry a standard-ONNX function body
// (gradients/fused.h). All three have one (gradients/fused_recurrent.cpp) for everything the ONNX ops define:
// every direction, sequence_lens or none, layout 0 or 1, clip or none, every activation function, LSTM peepholes
// and input_forget: the forward states recomputed (the standard op, or a forward Scan for LSTM's cell states),
// then, per direction, BPTT as a reverse Scan carrying dH (and dC) that recomputes each step's gates. The bodies
// cannot tell absent inputs or attributes, nor compare strings before opset 19, so this rule passes zeros for an
// absent B, initial state, P or unread output's gradient, and always writes what the bodies read: GRU's
// linear_before_reset, LSTM's input_forget, layout, the int `reverse` (1 for direction 'reverse', else 0: whether
// the first direction runs backwards in time), the float `clip_bound` (the clip, or the largest float for none)
// and the activation functions as ints and floats (resolve_functions). The kernel reads the attributes the forward
// op defines, ignores reverse and clip_bound, and checks that the functions' ints and floats agree with the
// strings. export_gradient_model refuses a node that lacks what the bodies need, naming it (fused_body_refusal).
//
// Correctness conditions the kernel implements: every direction (bidirectional sums dX over both), sequence_lens
// (steps past a batch entry's length contribute nothing; Y is zero there and Y_h is the last active step's
// state), clip (zero gradient where a pre-activation was clipped), peepholes and input_forget (LSTM),
// linear_before_reset (GRU), layout, and the activation functions of the forward kernel.
#include <cctype>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "gradients/fused.h"
#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

// Zeros of the state shape [D, B, H] (with `steps`: Y's [S, D, B, H]; layout 1: [B, D, H] and [B, S, D, H]), for
// the bodies, which cannot tell an absent input from a present one. nullopt when hidden_size is not set (the body
// is then refused at export).
std::optional<Expr> zero_states(RuleContext& c, bool steps) {
  const Node& n = c.node();
  if (!n.has_attr("hidden_size")) return std::nullopt;
  const bool batch_major = n.attr_int("layout", 0) == 1;
  GraphBuilder& b = c.builder();
  const int64_t D = n.attr_string("direction", "forward") == "bidirectional" ? 2 : 1;
  const TypeInfo xt = rules::input_type(c, 0);
  const TypeInfo shape_t{DType::Int64, std::nullopt};
  Expr xs = shape_of(c.X(0));  // [S, B, I], or [B, S, I] batch-major
  const auto dim = [&](int64_t i) { return apply(b, "Slice", {xs, int64s(b, {i}), int64s(b, {i + 1})}, shape_t); };
  Expr batch = dim(batch_major ? 0 : 1);
  std::vector<Expr> parts;
  if (batch_major) parts.push_back(batch);
  if (steps) parts.push_back(dim(batch_major ? 1 : 0));
  parts.push_back(int64s(b, {D}));
  if (!batch_major) parts.push_back(batch);
  parts.push_back(int64s(b, {n.attr_int("hidden_size", 0)}));
  Expr shape = apply(b, "Concat", parts, shape_t, {{"axis", int64_t{0}}});
  return expand(scalar(b, xt.dtype, 0.0), shape);
}

// The activation functions of every direction as the bodies read them (a body cannot compare strings before opset
// 19): kinds coded as the kernel's ActKind, and each function's alpha and beta with the ONNX defaults filled in.
// They are resolved as the kernel resolves the strings (executor/cpu/recurrent.cpp, make_spec: the default list,
// one list standing for both directions, alpha and beta consumed in order by the functions that take them), and
// the grad kernel checks that the two agree. nullopt for a name the kernel does not know (it refuses the node).
struct Functions {
  std::vector<int64_t> kinds;
  std::vector<float> alphas, betas;
};
std::optional<Functions> resolve_functions(const Node& n, const std::string& grad_op) {
  const size_t per = grad_op == "LSTMGrad" ? 3 : grad_op == "GRUGrad" ? 2 : 1;
  const size_t D = n.attr_string("direction", "forward") == "bidirectional" ? 2 : 1;
  const auto list = [&]<class V>(const char* a, V none) {
    auto it = n.attributes.find(a);
    const V* v = it == n.attributes.end() ? nullptr : std::get_if<V>(&it->second);
    return v ? *v : none;
  };
  std::vector<std::string> names = list("activations", std::vector<std::string>{});
  const std::vector<std::string> fallback = per == 3 ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
                                            : per == 2 ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                       : std::vector<std::string>{"Tanh"};
  if (names.empty()) names = fallback;
  if (names.size() == per && D == 2) {
    const std::vector<std::string> one = names;  // not names' own range, which the insertion may free
    names.insert(names.end(), one.begin(), one.end());
  }
  const std::vector<float> alphas = list("activation_alpha", std::vector<float>{});
  const std::vector<float> betas = list("activation_beta", std::vector<float>{});
  struct Known {  // a function's name, its code, its default alpha and beta, and which of them it takes
    const char* name;
    int64_t code;
    float alpha, beta;
    bool takes_alpha, takes_beta;
  };
  static const Known known[] = {{"sigmoid", 0, 0, 0, false, false},     {"tanh", 1, 0, 0, false, false},
                                {"relu", 2, 0, 0, false, false},        {"affine", 3, 1, 0, true, true},
                                {"leakyrelu", 4, 0.01f, 0, true, false}, {"thresholdedrelu", 5, 1, 0, true, false},
                                {"scaledtanh", 6, 1, 1, true, true},    {"hardsigmoid", 7, 0.2f, 0.5f, true, true},
                                {"elu", 8, 1, 0, true, false},          {"softsign", 9, 0, 0, false, false},
                                {"softplus", 10, 0, 0, false, false}};
  Functions f;
  size_t ai = 0, bi = 0;
  for (std::string name : names) {
    for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    const Known* k = nullptr;
    for (const Known& c : known)
      if (name == c.name) k = &c;
    if (!k) return std::nullopt;
    f.kinds.push_back(k->code);
    f.alphas.push_back(k->takes_alpha && ai < alphas.size() ? alphas[ai++] : k->alpha);
    f.betas.push_back(k->takes_beta && bi < betas.size() ? betas[bi++] : k->beta);
  }
  return f;
}

// nf forward inputs, ng outputs (Y, Y_h[, Y_c]).
void recurrent_rule(RuleContext& c, const std::string& grad_op, size_t nf, size_t ng) {
  const TypeInfo xt = rules::input_type(c, 0);
  std::vector<Expr> ins;
  std::vector<TypeInfo> types;
  for (size_t i = 0; i < nf; ++i) {
    ins.push_back(c.has_input(i) ? c.X(i) : Expr{});
    types.push_back(c.has_input(i) && i != 4 ? rules::input_type(c, i) : TypeInfo{xt.dtype, std::nullopt});
  }
  bool any = false;
  for (size_t k = 0; k < ng; ++k) {
    const bool present = k < c.num_outputs() && !c.node().outputs[k].empty();
    ins.push_back(present ? c.dY(k) : Expr{});
    any = any || present;
  }
  if (!any) return;
  // The bodies need B, the initial states, P (LSTM) and every incoming gradient: zeros stand in for absent ones
  // (the kernel computes the same with them).
  {
    const Node& n = c.node();
    const int64_t D = n.attr_string("direction", "forward") == "bidirectional" ? 2 : 1;
    const int64_t H = n.attr_int("hidden_size", 0);
    const auto zeros = [&](std::vector<int64_t> shape) {
      return expand(scalar(c.builder(), xt.dtype, 0.0), int64s(c.builder(), std::move(shape)));
    };
    if (!c.has_input(3) && n.has_attr("hidden_size")) {  // B: [D, 2 gates H]
      const int64_t gates = grad_op == "LSTMGrad" ? 4 : grad_op == "GRUGrad" ? 3 : 1;
      ins[3] = zeros({D, 2 * gates * H});
    }
    if (grad_op == "LSTMGrad" && !c.has_input(7) && n.has_attr("hidden_size")) ins[7] = zeros({D, 3 * H});  // P
    for (size_t i : {size_t{5}, size_t{6}})  // initial_h (and LSTM's initial_c)
      if (i < nf && (i == 5 || grad_op == "LSTMGrad") && !c.has_input(i))
        if (auto z = zero_states(c, false)) ins[i] = *z;
    for (size_t k = 0; k < ng; ++k)
      if (!ins[nf + k].valid())
        if (auto z = zero_states(c, k == 0)) ins[nf + k] = *z;
  }
  std::map<std::string, Attribute> attrs = c.node().attributes;
  // The bodies read these by reference, and a body has no attribute defaults: they are written even when the
  // forward node leaves them to their defaults.
  if (grad_op == "GRUGrad") attrs.emplace("linear_before_reset", int64_t{0});
  if (grad_op == "LSTMGrad") attrs.emplace("input_forget", int64_t{0});
  attrs.emplace("layout", int64_t{0});
  // The bodies read the direction as an int too (a body cannot compare strings before opset 19), and the clip as
  // clip_bound, which is always there: the clip, or the largest float (no finite pre-activation exceeds it).
  attrs["reverse"] = int64_t{c.node().attr_string("direction", "forward") == "reverse" ? 1 : 0};
  attrs["clip_bound"] = c.node().has_attr("clip") ? c.node().attr_float("clip", 0) : std::numeric_limits<float>::max();
  if (std::optional<Functions> fns = resolve_functions(c.node(), grad_op)) {
    attrs["activation_kinds"] = fns->kinds;
    attrs["activation_alphas"] = fns->alphas;
    attrs["activation_betas"] = fns->betas;
  }
  std::vector<Expr> g = apply_n(c.builder(), grad_op, ins, types, attrs, kFusedGradDomain);
  // Outputs nobody needs (sequence_lens', absent inputs', constants') are left unnamed.
  Node& n = c.builder().graph().nodes.back();
  for (size_t i = 0; i < g.size(); ++i) {
    if (i != 4 && c.has_input(i) && c.needs_dX(i)) {
      c.set_dX(i, g[i]);
      continue;
    }
    c.builder().graph().value_info.erase(n.outputs[i]);
    n.outputs[i].clear();
  }
}

}  // namespace

void register_recurrent_rules(GradientRegistry& r) {
  r.add("LSTM", [](RuleContext& c) { recurrent_rule(c, "LSTMGrad", 8, 3); });
  r.add("GRU", [](RuleContext& c) { recurrent_rule(c, "GRUGrad", 6, 2); });
  r.add("RNN", [](RuleContext& c) { recurrent_rule(c, "RNNGrad", 6, 2); });
}

}  // namespace onnxtrain
