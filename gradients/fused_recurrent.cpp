// Standard-ONNX bodies of onnxtrain.RNNGrad, GRUGrad and LSTMGrad (native kernels: executor/cpu/recurrent.cpp; the
// design is in gradients/rules/recurrent.cpp). They serve everything the ONNX ops define: every direction
// (forward, reverse and bidirectional), sequence_lens or none, layout 0 and 1, clip or none, every activation
// function, LSTM peepholes and input_forget, GRU's linear_before_reset. They need B, the initial states, P (LSTM)
// and every incoming gradient present (the rule passes zeros for absent ones) and the attributes the rule writes
// for them; fused_body_refusal() names what a node lacks of these, and TrainingSession::export_gradient_model
// refuses such a node rather than export a body that would compute something else.
//
// Directions. Each op's backpropagation through time is written once, for one direction, and run once per
// direction as the body of a Scan over the direction axis (over_directions): on that direction's slices of W, R,
// B, P, the initial states, Y and the incoming gradients. The Scan stacks the per-direction dW, dR, dB, dP and
// initial states' gradients on a new axis, which is their direction axis; dX, to which every direction
// contributes, is the sum over it. A direction that runs backwards in time (the only one of 'reverse', the second
// of 'bidirectional') works in step order, on tensors flipped along time (flip_setup), and flips its dX back.
//
// sequence_lens. A row's steps past its length do not run (its Y is zero there, its Y_h the state after its last
// step). The Scans read which steps run (active_steps) and, on a step that did not, emit no gradient and pass dH
// (and dC) through unchanged; LSTM's forward Scan keeps its states there, and the state entering a step is
// initial_h until the row's first step (states_entering). A row of length 0 so passes dY_h straight to initial_h.
//
// layout 1 (batch-major X, Y, the states and their gradients). The bodies work in layout 0: they move the
// batch-major inputs to it first and the gradients of X and of the initial states back last (by_layout), and
// rerun the forward ops on the moved inputs without the attribute.
//
// clip. Every gate's pre-activation a is clipped to [-clip, clip] before its activation (LSTM's cell state
// is not); the slope of f(clip(a)) is zero where |a| > clip (activation()). The rule writes the float attribute
// clip_bound (the clip, or the largest float when the node has none), since a body cannot read an attribute
// the caller may leave out; the forward reruns take `clip` itself by reference (left out when the caller has none).
//
// Activations. A body cannot compare strings before opset 19, so the rule writes the functions beside the strings
// as ints (activation_kinds, the kernel's ActKind codes) and floats (activation_alphas / activation_betas, with the
// defaults filled in), F per direction (3 for LSTM, 2 for GRU, 1 for RNN); the grad kernel checks that they say what
// the strings say. Each direction reads its F functions (activation_setup, direction_functions), and activation()
// computes every candidate function and picks the coded one. The forward reruns take the strings by reference.
//
// RNNGrad:
// The body reruns the forward RNN (the standard op, with the caller's hidden_size, clip and activations) for the
// states h_t, then, per direction, recomputes every step's pre-activation a_t = x_t W^T + h_{t-1} R^T + Wb + Rb at
// once and its slope, and runs backpropagation through time as a reverse Scan carrying dH (R rides along as a
// second state, so the Scan body reads nothing from the enclosing scope) and emitting da_t = (dY_t + dH) *
// slope_t; dH becomes da_t R. The weight gradients come after the Scan from the stacked da: dW = da^T X,
// dR = da^T h_{t-1}, dB = (sum da, sum da), dX = da W, d initial_h the final dH. The Scans and the products run
// in float64 (cast in and out), so their bodies have one concrete type whatever the caller's, as ONNX requires of
// a graph's inputs.
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "gradients/fused_body.h"

namespace onnxtrain {

namespace {

using fused_body::add;
using fused_body::int64s;

constexpr int64_t kDouble = 11;  // TensorProto element type

const TypeInfo kF64{DType::Float64, std::nullopt};
const TypeInfo kBool{DType::Bool, std::nullopt};
const TypeInfo kI64{DType::Int64, std::nullopt};
constexpr int32_t kFloats = 6, kStrings = 8;  // AttributeProto type codes fused_body does not name

// What the rule writes as clip_bound when the node has no clip: no finite pre-activation exceeds it.
constexpr float kNoClip = std::numeric_limits<float>::max();

// Appends single-output nodes, named after their outputs, to a function's or a Scan body's node list alike.
struct Nodes {
  std::vector<Node>& nodes;
  std::string operator()(std::string type, std::vector<std::string> in, const std::string& out,
                         std::map<std::string, Attribute> attrs = {}) const {
    nodes.push_back(fused_body::op(out, std::move(type), std::move(in), out, std::move(attrs)));
    return out;
  }
};

// The activation functions, coded as the kernel's ActKind (executor/cpu/recurrent.cpp), in the int attribute
// activation_kinds that the rule writes (a body cannot compare strings before opset 19).
enum ActCode : int64_t { kSigmoid, kTanh, kRelu, kAffine, kLeakyRelu, kThresholdedRelu, kScaledTanh, kHardSigmoid,
                         kElu, kSoftsign, kSoftplus, kActCodes };

// y = f(clip(a)) and its slope "<y>_slope" = dy/da, which is zero where |a| > clip: a clipped pre-activation does
// not move (the kernel's derivative()). f is the function `fn` names: scalars fn_kind (int64, an ActCode),
// fn_alpha and fn_beta (float64; what the function does not take is unused). `clip` names a float64 scalar;
// reads "one" and "zero". The one place the bodies apply an activation, so each formula is written once and clip
// applies alike in every cell. A body cannot branch on a value, so every candidate is computed and one picked.
// (Names made here end in suffixes that no enclosing graph uses, so that no Scan body's name shadows an outer one.)
void activation(const Nodes& e, const std::string& a, const std::string& y, const std::string& fn,
                const std::string& clip) {
  const std::string al = fn + "_alpha", be = fn + "_beta", x = y + "_x";
  const auto v = [&](const std::string& s) { return y + "_" + s; };
  e("Clip", {a, e("Neg", {clip}, v("lo")), clip}, x);
  e("Greater", {x, "zero"}, v("pos"));
  e("Not", {e("Less", {x, "zero"}, v("neg"))}, v("nonneg"));
  e("Mul", {al, x}, v("ax"));
  e("Exp", {x}, v("ex"));
  // value and slope of each function, in ActCode order
  std::vector<std::pair<std::string, std::string>> cand(kActCodes);
  cand[kSigmoid] = {e("Sigmoid", {x}, v("sig")),
                    e("Mul", {v("sig"), e("Sub", {"one", v("sig")}, v("sig_1m"))}, v("sig_d"))};
  cand[kTanh] = {e("Tanh", {x}, v("tanh")),
                 e("Sub", {"one", e("Mul", {v("tanh"), v("tanh")}, v("tanh_sq"))}, v("tanh_d"))};
  cand[kRelu] = {e("Where", {v("pos"), x, "zero"}, v("relu")), e("Where", {v("pos"), "one", "zero"}, v("relu_d"))};
  cand[kAffine] = {e("Add", {v("ax"), be}, v("affine")), e("Identity", {al}, v("affine_d"))};
  cand[kLeakyRelu] = {e("Where", {v("nonneg"), x, v("ax")}, v("leaky")),
                      e("Where", {v("nonneg"), "one", al}, v("leaky_d"))};
  e("Greater", {x, al}, v("above"));
  cand[kThresholdedRelu] = {e("Where", {v("above"), x, "zero"}, v("thr")),
                            e("Where", {v("above"), "one", "zero"}, v("thr_d"))};
  e("Tanh", {e("Mul", {be, x}, v("bx"))}, v("tbx"));
  cand[kScaledTanh] = {e("Mul", {al, v("tbx")}, v("stanh")),
                       e("Mul", {e("Mul", {al, be}, v("ab")),
                                 e("Sub", {"one", e("Mul", {v("tbx"), v("tbx")}, v("tbx_sq"))}, v("tbx_d"))},
                         v("stanh_d"))};
  e("Add", {v("ax"), be}, v("hs_in"));
  e("And", {e("Greater", {v("hs_in"), "zero"}, v("hs_lo")), e("Less", {v("hs_in"), "one"}, v("hs_hi"))}, v("hs_lin"));
  cand[kHardSigmoid] = {e("Max", {"zero", e("Min", {"one", v("hs_in")}, v("hs_min"))}, v("hsig")),
                        e("Where", {v("hs_lin"), al, "zero"}, v("hsig_d"))};
  e("Mul", {al, v("ex")}, v("aex"));
  cand[kElu] = {e("Where", {v("nonneg"), x, e("Sub", {v("aex"), al}, v("aex_1"))}, v("elu")),
                e("Where", {v("nonneg"), "one", v("aex")}, v("elu_d"))};
  e("Add", {"one", e("Abs", {x}, v("absx"))}, v("ss_den"));
  cand[kSoftsign] = {e("Div", {x, v("ss_den")}, v("ssign")),
                     e("Reciprocal", {e("Mul", {v("ss_den"), v("ss_den")}, v("ss_den2"))}, v("ssign_d"))};
  e("Constant", {}, v("sp_big"), {{"value", TensorData::scalar<double>(20.0)}});  // log(1 + e^x) is x past it
  cand[kSoftplus] = {e("Where", {e("Greater", {x, v("sp_big")}, v("sp_past")), x,
                                 e("Log", {e("Add", {"one", v("ex")}, v("ex_1"))}, v("sp_log"))},
                       v("splus")),
                     v("sig")};
  std::string value = cand[kSoftplus].first, slope = cand[kSoftplus].second;
  for (int64_t k = kSoftplus - 1; k >= 0; --k) {
    const std::string is = e("Equal", {fn + "_kind", e("Constant", {}, v("code" + std::to_string(k)),
                                                      {{"value", TensorData::scalar<int64_t>(k)}})},
                             v("is" + std::to_string(k)));
    value = e("Where", {is, cand[k].first, value}, k == 0 ? y : v("pick" + std::to_string(k)));
    slope = e("Where", {is, cand[k].second, slope}, v("dpick" + std::to_string(k)));
  }
  e("Greater", {e("Abs", {a}, v("abs")), clip}, v("clipped"));
  e("Where", {v("clipped"), "zero", slope}, y + "_slope");
}

// `in` with its axes permuted by perm when the caller's layout is 1 ("batch_major", from prologue), else as it
// is, named `out`. A body cannot branch on an attribute (an If's branches would read the function's names, which
// the inliner does not rename inside subgraphs), so it computes both and picks one: flattened (the same count
// either way), then reshaped to the picked shape.
std::string by_layout(Function& f, const std::string& in, const std::vector<int64_t>& perm, const std::string& out) {
  add(f, "Transpose", {in}, out + "_t", {{"perm", perm}});
  add(f, "Reshape", {in, "lay_flat"}, out + "_f0");
  add(f, "Reshape", {out + "_t", "lay_flat"}, out + "_f1");
  add(f, "Where", {"batch_major", out + "_f1", out + "_f0"}, out + "_f");
  add(f, "Shape", {in}, out + "_s0");
  add(f, "Shape", {out + "_t"}, out + "_s1");
  add(f, "Where", {"batch_major", out + "_s1", out + "_s0"}, out + "_s");
  return add(f, "Reshape", {out + "_f", out + "_s"}, out, {{"allowzero", int64_t{1}}});
}

// What every body does first. "batch_major" from the int attribute layout (the rule always writes it), and the
// inputs in layout 0: X_l0 [S, B, I], dY_l0 [S, D, B, H], and <s>_l0 [D, B, H] for each state or state gradient
// in `states`. "clip" [scalar float64] from clip_bound.
void prologue(Function& f, const std::vector<std::string>& states) {
  fused_body::caller_attribute(f, "layout_i", "layout", fused_body::kInt);
  add(f, "Constant", {}, "layout_one", {{"value", TensorData::scalar<int64_t>(1)}});
  add(f, "Equal", {"layout_i", "layout_one"}, "batch_major");
  int64s(f, "lay_flat", {-1});
  by_layout(f, "X", {1, 0, 2}, "X_l0");           // [B, S, I] -> [S, B, I]
  by_layout(f, "dY", {1, 2, 0, 3}, "dY_l0");      // [B, S, D, H] -> [S, D, B, H]
  for (const std::string& s : states) by_layout(f, s, {1, 0, 2}, s + "_l0");  // [B, D, H] -> [D, B, H]
  fused_body::caller_attribute(f, "clip_f", "clip_bound", fused_body::kFloat);
  add(f, "Cast", {"clip_f"}, "clip_f64", {{"to", kDouble}});
}
// The activation functions per direction, from what the rule writes: act_kinds_dirs [D, F] (int64 ActCodes),
// act_alphas_dirs and act_betas_dirs [D, F] (float64), F functions per direction. Needs num_dirs.
void activation_setup(Function& f) {
  add(f, "Constant", {}, "act_kinds", {}, {{"value_ints", "activation_kinds", fused_body::kInts}});
  add(f, "Constant", {}, "act_alphas", {}, {{"value_floats", "activation_alphas", kFloats}});
  add(f, "Constant", {}, "act_betas", {}, {{"value_floats", "activation_betas", kFloats}});
  int64s(f, "act_rest", {-1});
  add(f, "Concat", {"num_dirs", "act_rest"}, "act_dims", {{"axis", int64_t{0}}});
  add(f, "Reshape", {"act_kinds", "act_dims"}, "act_kinds_dirs");
  for (const char* v : {"act_alphas", "act_betas"})
    add(f, "Reshape", {add(f, "Cast", {v}, std::string(v) + "_f64", {{"to", kDouble}}), "act_dims"},
        std::string(v) + "_dirs");
}

// In a direction's body: function k's scalars act<k>_kind, act<k>_alpha, act<k>_beta (activation()) from the
// direction's kinds_d, alphas_d and betas_d [F].
void direction_functions(Function& d, int64_t count) {
  for (int64_t k = 0; k < count; ++k) {
    const std::string fn = "act" + std::to_string(k);
    add(d, "Constant", {}, fn + "_at", {{"value", TensorData::scalar<int64_t>(k)}});
    add(d, "Gather", {"kinds_d", fn + "_at"}, fn + "_kind");
    add(d, "Gather", {"alphas_d", fn + "_at"}, fn + "_alpha");
    add(d, "Gather", {"betas_d", fn + "_at"}, fn + "_beta");
  }
}

// Which directions run backwards in time, "flips" [D] (bool, D is W's first dim). The int attribute `reverse`
// (the rule writes it beside the string direction, which a body cannot compare before opset 19) says it of the
// first direction; a second one (bidirectional) always runs backwards, and the rule writes reverse 0 there. So
// [reverse] for one direction, [0, 1] for bidirectional.
void direction_flips(Function& f) {
  fused_body::caller_attribute(f, "rev_i", "reverse", fused_body::kInt);
  add(f, "Constant", {}, "rev_one", {{"value", TensorData::scalar<int64_t>(1)}});
  add(f, "Equal", {"rev_i", "rev_one"}, "rev");
  int64s(f, "dirs_0", {0});
  int64s(f, "dirs_1", {1});
  add(f, "Unsqueeze", {"rev", "dirs_0"}, "first_flips");
  const bool backwards = true;
  add(f, "Constant", {}, "second_flips", {{"value", TensorData::from<bool>({1}, std::span<const bool>(&backwards, 1))}});
  add(f, "Concat", {"first_flips", "second_flips"}, "both_flips", {{"axis", int64_t{0}}});
  add(f, "Shape", {"W"}, "w_dims");
  add(f, "Slice", {"w_dims", "dirs_0", "dirs_1"}, "num_dirs");
  add(f, "Slice", {"both_flips", "dirs_0", "num_dirs"}, "flips");
}

// Which steps each batch row runs, "active" [S, D, B, 1] (bool): a row of length L (sequence_lens) runs steps
// 0 .. L - 1 in time order, whichever way its direction goes; without sequence_lens, every step. A body cannot test
// whether an optional input is present, so it asks the standard op, which reads sequence_lens either way: a
// one-unit RNN whose pre-activation is the constant 2 (no weights, biases 1) outputs tanh(2) on the steps it
// runs and, past a row's length, zero.
void active_steps(Function& f) {
  int64s(f, "live_one", {1});
  int64s(f, "live_two", {2});
  int64s(f, "live_three", {3});
  add(f, "Shape", {"X_l0"}, "x_dims");
  add(f, "Slice", {"x_dims", "live_two", "live_three"}, "input_size");
  add(f, "Concat", {"num_dirs", "live_one", "input_size"}, "live_w_dims", {{"axis", int64_t{0}}});
  add(f, "Concat", {"num_dirs", "live_one", "live_one"}, "live_r_dims", {{"axis", int64_t{0}}});
  add(f, "Concat", {"num_dirs", "live_two"}, "live_b_dims", {{"axis", int64_t{0}}});
  const float zero = 0, one = 1;
  const auto filled = [&](const std::string& dims, float v, const std::string& out) {
    add(f, "ConstantOfShape", {dims}, out + "_f", {{"value", TensorData::from<float>({1}, std::span<const float>(&v, 1))}});
    return add(f, "CastLike", {out + "_f", "X_l0"}, out);
  };
  filled("live_w_dims", zero, "live_w");
  filled("live_r_dims", zero, "live_r");
  filled("live_b_dims", one, "live_b");
  Node rnn = fused_body::op("live_rnn", "RNN", {"X_l0", "live_w", "live_r", "live_b", "sequence_lens"}, "live_y",
                            {{"hidden_size", int64_t{1}}});
  rnn.attribute_refs["direction"] = {"direction", fused_body::kString};
  f.nodes.push_back(std::move(rnn));
  add(f, "CastLike", {add(f, "Constant", {}, "live_zero_d", {{"value", TensorData::scalar<double>(0.0)}}), "X_l0"},
      "live_zero");
  add(f, "Not", {add(f, "Equal", {"live_y", "live_zero"}, "live_idle")}, "active");
}

// In a direction's body: the direction works in step order, i.e. on time-major tensors flipped along time when
// it runs backwards (`flag`, a bool scalar): step k reads time k, or S - 1 - k. A Gather along time, whose
// indices the flag chooses, flips or copies (a Slice would need its steps before the body runs, which the flag,
// one per direction, is not).
void flip_setup(Function& d, const std::string& flag) {
  int64s(d, "fl_axis", {0});
  int64s(d, "fl_one_1", {1});
  add(d, "Constant", {}, "fl_zero", {{"value", TensorData::scalar<int64_t>(0)}});
  add(d, "Constant", {}, "fl_one", {{"value", TensorData::scalar<int64_t>(1)}});
  add(d, "Shape", {"x_t"}, "fl_x_dims");
  add(d, "Squeeze", {add(d, "Slice", {"fl_x_dims", "fl_axis", "fl_one_1"}, "fl_len_1"), "fl_axis"}, "fl_len");
  add(d, "Range", {"fl_zero", "fl_len", "fl_one"}, "fl_forwards");  // 0 .. S - 1
  add(d, "Sub", {add(d, "Sub", {"fl_len", "fl_one"}, "fl_last"), "fl_forwards"}, "fl_backwards");
  add(d, "Where", {flag, "fl_backwards", "fl_forwards"}, "fl_times");
}
std::string flip(Function& d, const std::string& in, const std::string& out) {
  return add(d, "Gather", {in, "fl_times"}, out, {{"axis", int64_t{0}}});
}

// In a direction's body (RNN, GRU): "h_prev", the state entering each step [S, B, H] in step order, from the
// rerun's states y_d and the steps that run, live_d [S, B, 1]: initial_h, then the state after the step before if
// that step ran, else still initial_h (a direction that runs backwards meets a row's steps past its length
// first, where Y is zero).
void states_entering(Function& d) {
  add(d, "Slice", {"y_d", "ax0", "minus1", "ax0"}, "y_head");
  add(d, "Slice", {"live_d", "ax0", "minus1", "ax0"}, "live_head");
  add(d, "Unsqueeze", {"h0_d", "ax0"}, "h0_3");
  add(d, "Where", {"live_head", "y_head", "h0_3"}, "h_after");
  add(d, "Concat", {"h0_3", "h_after"}, "h_prev", {{"axis", int64_t{0}}});
}

// In a direction's body (GRU, LSTM): "xw", the input projections of every step at once, x_d W^T + "wb"
// [S, B, gates H], as one Gemm over the flattened steps and batch; also "x2", x_d flattened to [S B, I].
void input_projections(Function& d) {
  add(d, "Flatten", {"x_d"}, "x2", {{"axis", int64_t{2}}});
  add(d, "Gemm", {"x2", "w_d", "wb"}, "xw2", {{"transB", int64_t{1}}});
  add(d, "Shape", {"x_d"}, "x_shape");
  add(d, "Slice", {"x_shape", "ax0", "ax2"}, "sb");
  add(d, "Concat", {"sb", "minus1"}, "sb_1", {{"axis", int64_t{0}}});
  add(d, "Reshape", {"xw2", "sb_1"}, "xw");
}

// A value a direction's body reads: `outer` in the function, `inner` in the body; `axis`, for a value sliced
// per direction, is its direction axis (0 for W, R, B and the states, 1 for Y and dY).
struct Slot {
  std::string outer, inner;
  int64_t axis = 0;
  TypeInfo type = kF64;
};

// The direction's activation functions, scanned like its weights (activation_setup, direction_functions).
const std::vector<Slot> kFunctionSlots{
    {"act_kinds_dirs", "kinds_d", 0, kI64}, {"act_alphas_dirs", "alphas_d"}, {"act_betas_dirs", "betas_d"}};

// `scanned` and the activation functions' slots.
std::vector<Slot> with_functions(std::vector<Slot> scanned) {
  scanned.insert(scanned.end(), kFunctionSlots.begin(), kFunctionSlots.end());
  return scanned;
}

// How every recurrent body ends. `dir` holds one direction's BPTT (a node list built with the same helpers as
// the function; as a subgraph it reads nothing from the enclosing scope, since the inliner renames only the
// function's own names); a Scan over the direction axis runs it once per direction. `carried` are values every
// direction reads whole (X, clip, flags), passed through as states; `scanned` the direction's flip flag and
// slices. `grads` names the body's results (value -> function output), dX last ("dX", in time order): the Scan
// stacks them on a new axis, the direction axis of dW, dR, dB, dP and the initial states' gradients, and dX, to
// which every direction contributes, is their sum over it. All are cast to X's type, and dX and the initial
// states' gradients moved back to the caller's layout; sequence_lens gets an empty gradient.
void over_directions(Function& f, Function dir, const std::vector<Slot>& carried, const std::vector<Slot>& scanned,
                     const std::vector<std::pair<std::string, std::string>>& grads) {
  auto body = std::make_shared<Graph>();
  body->name = f.name + "_direction";
  std::vector<std::string> ins, outs;
  std::vector<int64_t> axes;
  for (const Slot& s : carried) {
    add(dir, "Identity", {s.inner}, s.inner + "_carried");
    body->inputs.push_back({s.inner, s.type});
    body->outputs.push_back({s.inner + "_carried", s.type});
    ins.push_back(s.outer);
    outs.push_back(s.outer + "_carried");
  }
  for (const Slot& s : scanned) {
    body->inputs.push_back({s.inner, s.type});
    ins.push_back(s.outer);
    axes.push_back(s.axis);
  }
  for (const auto& [v, name] : grads) {
    body->outputs.push_back({v, kF64});
    outs.push_back(name + "_dirs");
  }
  body->nodes = std::move(dir.nodes);
  Node scan = fused_body::op("directions", "Scan", ins, outs.front());
  scan.outputs = outs;
  scan.attributes = {{"body", body},
                     {"num_scan_inputs", static_cast<int64_t>(scanned.size())},
                     {"scan_input_axes", axes}};
  f.nodes.push_back(std::move(scan));
  for (const auto& [v, name] : grads) {
    if (name == "dX")
      add(f, "ReduceSum", {"dX_dirs", "dirs_0"}, "dX_sum", {{"keepdims", int64_t{0}}});
    const bool by_batch = name == "dX" || name == "dinitial_h" || name == "dinitial_c";
    add(f, "CastLike", {name == "dX" ? "dX_sum" : name + "_dirs", "X"}, by_batch ? name + "_l0" : name);
    if (by_batch) by_layout(f, name + "_l0", {1, 0, 2}, name);  // [S, B, I] / [D, B, H] back to batch-major
  }
  add(f, "Constant", {}, "dsequence_lens", {{"value", TensorData::from<int64_t>({0}, std::span<const int64_t>())}});
}

// Cast to float64, which every Scan body works in.
void to_f64(Function& f, const std::vector<std::string>& values) {
  for (const std::string& v : values) add(f, "Cast", {v}, v + "_f64", {{"to", kDouble}});
}

// The standard op `op` rerun on the layout-0 inputs for the states Y [S, D, B, H] ("Y_all"), with the caller's
// attributes that shape its result (not layout: its inputs are in layout 0 already).
void rerun_forward(Function& f, const std::string& op, const std::vector<std::string>& refs) {
  Node n = fused_body::op(op + "_rerun", op, {"X_l0", "W", "R", "B", "sequence_lens", "initial_h_l0"}, "Y_all");
  for (const std::string& a : refs)
    n.attribute_refs[a] = {a, a == "direction"     ? fused_body::kString
                              : a == "clip"        ? fused_body::kFloat
                              : a == "activations" ? kStrings
                              : a.starts_with("activation_") ? kFloats
                                                             : fused_body::kInt};
  f.nodes.push_back(std::move(n));
}

Function rnn_grad() {
  Function f = fused_body::function(
      "RNNGrad", {"X", "W", "R", "B", "sequence_lens", "initial_h", "dY", "dY_h"},
      {"dX", "dW", "dR", "dB", "dsequence_lens", "dinitial_h"},
      "Gradient of RNN (every direction, sequence_lens or none, layout 0 or 1, clip or none, any activation; B, "
      "initial_h, dY and dY_h given) with respect to X, W, R, B and initial_h: the forward RNN rerun for the states, "
      "then per direction (a Scan over the direction axis) the pre-activations recomputed and a reverse Scan "
      "carrying dH in float64 that emits da_t = (dY_t + dH) f'(clip(a_t)) (zero where clipped), dH <- da_t R (on "
      "the steps that run); the weight gradients are products of the stacked da, dX the sum over directions of "
      "da W.",
      {"hidden_size", "direction", "reverse", "layout", "clip", "clip_bound", "activations", "activation_alpha",
       "activation_beta", "activation_kinds", "activation_alphas", "activation_betas"});
  prologue(f, {"initial_h", "dY_h"});
  rerun_forward(f, "RNN", {"hidden_size", "direction", "clip", "activations", "activation_alpha", "activation_beta"});
  direction_flips(f);
  activation_setup(f);
  active_steps(f);
  to_f64(f, {"X_l0", "W", "R", "B", "initial_h_l0", "Y_all", "dY_l0", "dY_h_l0"});

  // One direction: x_t [S, B, I], w_d [H, I], r_d [H, H], b_d [2H], h0_d and dyh_d [B, H], dy_t and y_t
  // [S, B, H], live_t [S, B, 1], clip.
  Function d;
  const Nodes e{d.nodes};
  flip_setup(d, "flip");
  int64s(d, "ax0", {0});
  int64s(d, "ax1", {1});
  int64s(d, "ax2", {2});
  int64s(d, "big", {std::numeric_limits<int64_t>::max()});
  int64s(d, "minus1", {-1});
  e("Constant", {}, "one", {{"value", TensorData::scalar<double>(1.0)}});
  e("Constant", {}, "zero", {{"value", TensorData::scalar<double>(0.0)}});
  flip(d, "y_t", "y_d");    // step order
  flip(d, "dy_t", "dy_d");
  flip(d, "x_t", "x_d");
  flip(d, "live_t", "live_d");
  add(d, "Shape", {"r_d"}, "r_shape");
  add(d, "Slice", {"r_shape", "ax1", "ax2"}, "H1");  // [H]
  add(d, "Slice", {"b_d", "ax0", "H1", "ax0"}, "wb");
  add(d, "Slice", {"b_d", "H1", "big", "ax0"}, "rb");
  input_projections(d);  // xw2 [S B, H], x2 [S B, I]
  states_entering(d);
  add(d, "Flatten", {"h_prev"}, "hp2", {{"axis", int64_t{2}}});    // [S B, H]
  // Every step's pre-activation and slope at once (the states are known): a_t = x_t W^T + Wb + h_{t-1} R^T + Rb.
  add(d, "Gemm", {"hp2", "r_d", "rb"}, "hr2", {{"transB", int64_t{1}}});
  add(d, "Add", {"xw2", "hr2"}, "a2");
  direction_functions(d, 1);
  activation(e, "a2", "act", "act0", "clip");
  add(d, "Reshape", {"act_slope", "sb_1"}, "slope_d");  // [S, B, H]

  // The reverse Scan's body, in float64.
  auto body = std::make_shared<Graph>();
  body->name = "rnn_bptt_step";
  body->inputs = {{"dh_in", kF64}, {"r_in", kF64}, {"dy_t", kF64}, {"slope_t", kF64}, {"live", kBool}};
  body->outputs = {{"dh_out", kF64}, {"r_out", kF64}, {"da_out", kF64}};
  const Nodes step{body->nodes};
  step("Constant", {}, "zero_step", {{"value", TensorData::scalar<double>(0.0)}});
  step("Add", {"dy_t", "dh_in"}, "g");
  step("Mul", {"g", "slope_t"}, "da_run");
  // A step past the row's length (sequence_lens) did not run: no gradient, and dH passes through it.
  step("Where", {"live", "da_run", "zero_step"}, "da");
  step("MatMul", {"da", "r_in"}, "dh_run");
  step("Where", {"live", "dh_run", "dh_in"}, "dh_out");
  step("Identity", {"r_in"}, "r_out");
  step("Identity", {"da"}, "da_out");
  Node scan = fused_body::op("bptt", "Scan", {"dyh_d", "r_d", "dy_d", "slope_d", "live_d"}, "dh0_d");
  scan.outputs = {"dh0_d", "r_last", "da"};  // da [S, B, H], in step order
  scan.attributes = {{"body", body},
                     {"num_scan_inputs", int64_t{3}},
                     {"scan_input_directions", std::vector<int64_t>{1, 1, 1}},
                     {"scan_output_directions", std::vector<int64_t>{1}}};
  d.nodes.push_back(std::move(scan));

  add(d, "Flatten", {"da"}, "da2", {{"axis", int64_t{2}}});        // [S B, H]
  // Gemm with transA rather than Transpose + MatMul, which onnxruntime fuses into a FusedMatMul that has no
  // float64 kernel.
  add(d, "Gemm", {"da2", "x2"}, "dw_d", {{"transA", int64_t{1}}});
  add(d, "Gemm", {"da2", "hp2"}, "dr_d", {{"transA", int64_t{1}}});
  add(d, "ReduceSum", {"da2", "ax0"}, "db_half", {{"keepdims", int64_t{0}}});
  add(d, "Concat", {"db_half", "db_half"}, "db_d", {{"axis", int64_t{0}}});
  add(d, "MatMul", {"da", "w_d"}, "dx_d");
  flip(d, "dx_d", "dx");  // time order
  over_directions(f, std::move(d), {{"X_l0_f64", "x_t"}, {"clip_f64", "clip"}},
                  with_functions({{"flips", "flip", 0, kBool}, {"W_f64", "w_d"}, {"R_f64", "r_d"}, {"B_f64", "b_d"},
                                  {"initial_h_l0_f64", "h0_d"}, {"dY_h_l0_f64", "dyh_d"}, {"dY_l0_f64", "dy_t", 1},
                                  {"Y_all_f64", "y_t", 1}, {"active", "live_t", 1, kBool}}),
                  {{"dw_d", "dW"}, {"dr_d", "dR"}, {"db_d", "dB"}, {"dh0_d", "dinitial_h"}, {"dx", "dX"}});
  return f;
}
// GRUGrad, the same cases (linear_before_reset 0 or 1, read by reference; the rule always writes it): the
// forward GRU rerun for the states h_t; per direction, the input projections X W^T + Wb once for all steps, then a
// reverse Scan (float64) whose body recomputes the step's gates z, r and h~ from h_{t-1} and carries dH. Per step it
// emits the gates' pre-activation gradients (da_z, da_r, da_h) and the two factors of R_h's gradient (da_h and
// r h_{t-1} without linear_before_reset; r da_h and h_{t-1} with it), whose products after the Scan give dW,
// dR, dB and dX. Gemm with transB rather than Transpose + MatMul (which onnxruntime fuses into a FusedMatMul
// without a float64 kernel).
Function gru_grad() {
  Function f = fused_body::function(
      "GRUGrad", {"X", "W", "R", "B", "sequence_lens", "initial_h", "dY", "dY_h"},
      {"dX", "dW", "dR", "dB", "dsequence_lens", "dinitial_h"},
      "Gradient of GRU (every direction, sequence_lens or none, layout 0 or 1, clip or none, any activations; B, "
      "initial_h, dY and dY_h given; linear_before_reset 0 or 1) with respect to X, W, R, B and initial_h: the "
      "forward GRU rerun for the states, then per direction (a Scan over the direction axis) a reverse Scan in "
      "float64 that recomputes each step's gates and carries dH.",
      {"hidden_size", "linear_before_reset", "direction", "reverse", "layout", "clip", "clip_bound", "activations",
       "activation_alpha", "activation_beta", "activation_kinds", "activation_alphas", "activation_betas"});
  prologue(f, {"initial_h", "dY_h"});
  rerun_forward(f, "GRU", {"hidden_size", "linear_before_reset", "direction", "clip", "activations",
                           "activation_alpha", "activation_beta"});  // Y_all [S, D, B, H]
  direction_flips(f);
  activation_setup(f);
  active_steps(f);
  fused_body::caller_attribute(f, "lbr_i", "linear_before_reset", fused_body::kInt);
  add(f, "Constant", {}, "one_i", {{"value", TensorData::scalar<int64_t>(1)}});
  add(f, "Equal", {"lbr_i", "one_i"}, "lbr_flag");
  to_f64(f, {"X_l0", "W", "R", "B", "initial_h_l0", "Y_all", "dY_l0", "dY_h_l0"});

  // One direction: x_t [S, B, I], w_d [3H, I], r_d [3H, H], b_d [6H], h0_d and dyh_d [B, H], dy_t and y_t
  // [S, B, H], lbr (bool), clip.
  Function d;
  flip_setup(d, "flip");
  int64s(d, "ax0", {0});
  int64s(d, "ax1", {1});
  int64s(d, "ax2", {2});
  int64s(d, "big", {std::numeric_limits<int64_t>::max()});
  int64s(d, "minus1", {-1});
  flip(d, "y_t", "y_d");  // step order
  flip(d, "dy_t", "dy_d");
  flip(d, "x_t", "x_d");
  flip(d, "live_t", "live_d");
  // Gate blocks: rows [k H, (k + 1) H) of W, R and the biases.
  add(d, "Shape", {"r_d"}, "r_shape");
  add(d, "Slice", {"r_shape", "ax1", "ax2"}, "H1");  // [H]
  add(d, "Add", {"H1", "H1"}, "H2");
  add(d, "Add", {"H2", "H1"}, "H3");
  add(d, "Add", {"H3", "H1"}, "H4");
  add(d, "Add", {"H4", "H1"}, "H5");
  const char* starts[] = {"ax0", "H1", "H2", "H3", "H4", "H5"};
  const char* ends[] = {"H1", "H2", "H3", "H4", "H5", "big"};
  for (int k = 0; k < 3; ++k) {
    add(d, "Slice", {"r_d", starts[k], ends[k], "ax0"}, std::string("r_") + "zrh"[k]);
    add(d, "Slice", {"b_d", starts[3 + k], ends[3 + k], "ax0"}, std::string("rb_") + "zrh"[k]);
  }
  add(d, "Slice", {"b_d", "ax0", "H3", "ax0"}, "wb");
  input_projections(d);  // [S, B, 3H], split by gate below
  for (int k = 0; k < 3; ++k)
    add(d, "Slice", {"xw", starts[k], ends[k], "ax2"}, std::string("x_") + "zrh"[k]);
  states_entering(d);
  direction_functions(d, 2);

  auto body = std::make_shared<Graph>();
  body->name = "gru_bptt_step";
  body->inputs = {{"dh_in", kF64},  {"rz_in", kF64}, {"rr_in", kF64}, {"rh_in", kF64}, {"bz_in", kF64},
                  {"br_in", kF64},  {"bh_in", kF64}, {"lbr_in", kBool}, {"clip_in", kF64},
                  {"fn0_kind", kI64}, {"fn0_alpha", kF64}, {"fn0_beta", kF64},
                  {"fn1_kind", kI64}, {"fn1_alpha", kF64}, {"fn1_beta", kF64},
                  {"dy_t", kF64},   {"xz_t", kF64},  {"xr_t", kF64},  {"xh_t", kF64},  {"hp", kF64},
                  {"live", kBool}};
  body->outputs = {{"dh_out", kF64}, {"rz_out", kF64}, {"rr_out", kF64}, {"rh_out", kF64}, {"bz_out", kF64},
                   {"br_out", kF64}, {"bh_out", kF64}, {"lbr_out", kBool}, {"clip_out", kF64},
                   {"fn0_kind_out", kI64}, {"fn0_alpha_out", kF64}, {"fn0_beta_out", kF64},
                   {"fn1_kind_out", kI64}, {"fn1_alpha_out", kF64}, {"fn1_beta_out", kF64},
                   {"daz", kF64},    {"dar", kF64},    {"dah", kF64},    {"left", kF64},   {"right", kF64}};
  const Nodes step{body->nodes};
  const std::map<std::string, Attribute> tb{{"transB", int64_t{1}}};
  step("Constant", {}, "one", {{"value", TensorData::scalar<double>(1.0)}});
  step("Constant", {}, "zero", {{"value", TensorData::scalar<double>(0.0)}});
  // A step past the row's length (sequence_lens) did not run: no gradient (all below is linear in g), and dH
  // passes through it.
  step("Add", {"dy_t", "dh_in"}, "g_run");
  step("Where", {"live", "g_run", "zero"}, "g");
  step("Gemm", {"hp", "rz_in", "bz_in"}, "hz", tb);
  step("Add", {"xz_t", "hz"}, "az");
  activation(step, "az", "z", "fn0", "clip_in");
  step("Gemm", {"hp", "rr_in", "br_in"}, "hr", tb);
  step("Add", {"xr_t", "hr"}, "ar");
  activation(step, "ar", "r", "fn0", "clip_in");
  step("Gemm", {"hp", "rh_in", "bh_in"}, "u", tb);  // linear_before_reset: h_{t-1} R_h^T + Rb_h
  step("Mul", {"r", "u"}, "ru");
  step("Mul", {"r", "hp"}, "q");                      // otherwise: (r h_{t-1}) R_h^T + Rb_h
  step("Gemm", {"q", "rh_in", "bh_in"}, "qh", tb);
  step("Where", {"lbr_in", "ru", "qh"}, "hh_rec");
  step("Add", {"xh_t", "hh_rec"}, "ah");
  activation(step, "ah", "ht", "fn1", "clip_in");
  step("Sub", {"one", "z"}, "one_z");
  step("Mul", {"g", "one_z"}, "dht");
  step("Sub", {"hp", "ht"}, "hp_ht");
  step("Mul", {"g", "hp_ht"}, "dz");
  step("Mul", {"g", "z"}, "dhp_direct");
  step("Mul", {"dht", "ht_slope"}, "dah");
  step("Mul", {"dz", "z_slope"}, "daz");
  step("Mul", {"dah", "u"}, "dr1");
  step("Mul", {"dah", "r"}, "du");
  step("MatMul", {"du", "rh_in"}, "dhp1");
  step("MatMul", {"dah", "rh_in"}, "dq");
  step("Mul", {"dq", "hp"}, "dr0");
  step("Mul", {"dq", "r"}, "dhp0");
  step("Where", {"lbr_in", "dr1", "dr0"}, "dr");
  step("Mul", {"dr", "r_slope"}, "dar");
  step("Where", {"lbr_in", "du", "dah"}, "left");
  step("Where", {"lbr_in", "hp", "q"}, "right");
  step("Where", {"lbr_in", "dhp1", "dhp0"}, "dhp_h");
  step("MatMul", {"daz", "rz_in"}, "dhp_z");
  step("MatMul", {"dar", "rr_in"}, "dhp_r");
  step("Sum", {"dhp_direct", "dhp_h", "dhp_z", "dhp_r"}, "dh_run");
  step("Where", {"live", "dh_run", "dh_in"}, "dh_out");
  for (const char* st : {"rz", "rr", "rh", "bz", "br", "bh", "lbr"})
    step("Identity", {std::string(st) + "_in"}, std::string(st) + "_out");
  step("Identity", {"clip_in"}, "clip_out");
  for (const char* v : {"fn0_kind", "fn0_alpha", "fn0_beta", "fn1_kind", "fn1_alpha", "fn1_beta"})
    step("Identity", {v}, std::string(v) + "_out");
  Node scan = fused_body::op("bptt", "Scan",
                             {"dyh_d", "r_z", "r_r", "r_h", "rb_z", "rb_r", "rb_h", "lbr", "clip", "act0_kind",
                              "act0_alpha", "act0_beta", "act1_kind", "act1_alpha", "act1_beta", "dy_d", "x_z", "x_r",
                              "x_h", "h_prev", "live_d"},
                             "dh0_d");
  scan.outputs = {"dh0_d", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11", "s12", "s13", "s14", "DZ", "DR", "DH", "L", "RT"};
  scan.attributes = {{"body", body},
                     {"num_scan_inputs", int64_t{6}},
                     {"scan_input_directions", std::vector<int64_t>{1, 1, 1, 1, 1, 1}},
                     {"scan_output_directions", std::vector<int64_t>{1, 1, 1, 1, 1}}};
  d.nodes.push_back(std::move(scan));

  add(d, "Concat", {"DZ", "DR", "DH"}, "da", {{"axis", int64_t{2}}});  // [S, B, 3H]
  const auto flat = [&](const std::string& v) { return add(d, "Flatten", {v}, v + "_2", {{"axis", int64_t{2}}}); };
  flat("da");
  flat("DZ");
  flat("DR");
  flat("L");
  flat("RT");
  flat("h_prev");
  const std::map<std::string, Attribute> ta{{"transA", int64_t{1}}};
  add(d, "Gemm", {"da_2", "x2"}, "dw_d", ta);
  add(d, "Gemm", {"DZ_2", "h_prev_2"}, "drz", ta);
  add(d, "Gemm", {"DR_2", "h_prev_2"}, "drr", ta);
  add(d, "Gemm", {"L_2", "RT_2"}, "drh", ta);
  add(d, "Concat", {"drz", "drr", "drh"}, "dr_d", {{"axis", int64_t{0}}});
  add(d, "ReduceSum", {"da_2", "ax0"}, "dwb", {{"keepdims", int64_t{0}}});
  add(d, "ReduceSum", {"DZ_2", "ax0"}, "drbz", {{"keepdims", int64_t{0}}});
  add(d, "ReduceSum", {"DR_2", "ax0"}, "drbr", {{"keepdims", int64_t{0}}});
  add(d, "ReduceSum", {"L_2", "ax0"}, "drbh", {{"keepdims", int64_t{0}}});
  add(d, "Concat", {"dwb", "drbz", "drbr", "drbh"}, "db_d", {{"axis", int64_t{0}}});
  add(d, "MatMul", {"da", "w_d"}, "dx_d");
  flip(d, "dx_d", "dx");  // time order
  over_directions(f, std::move(d), {{"X_l0_f64", "x_t"}, {"lbr_flag", "lbr", 0, kBool}, {"clip_f64", "clip"}},
                  with_functions({{"flips", "flip", 0, kBool}, {"W_f64", "w_d"}, {"R_f64", "r_d"}, {"B_f64", "b_d"},
                   {"initial_h_l0_f64", "h0_d"}, {"dY_h_l0_f64", "dyh_d"},
                   {"dY_l0_f64", "dy_t", 1}, {"Y_all_f64", "y_t", 1},
                   {"active", "live_t", 1, kBool}}),
                  {{"dw_d", "dW"}, {"dr_d", "dR"}, {"db_d", "dB"}, {"dh0_d", "dinitial_h"}, {"dx", "dX"}});
  return f;
}

// LSTMGrad, the same cases, and peepholes P (the rule passes zeros without) and input_forget (f = 1 - i, read as
// an int; the rule always writes it): the standard LSTM outputs no per-step cell states, so per direction a
// forward Scan (float64) reruns the cell from the input projections and emits the states entering each step
// (h_{t-1}, c_{t-1}) and the cell state after it (c_t); the reverse Scan recomputes each step's gates from them
// and carries dH and dC, emitting the gates' pre-activation gradients [B, 4H] (order i, o, f, c, as W's rows),
// whose products after the Scan give dW, dR, dB and dX, and, with the cell states, dP.
Function lstm_grad() {
  Function f = fused_body::function(
      "LSTMGrad",
      {"X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P", "dY", "dY_h", "dY_c"},
      {"dX", "dW", "dR", "dB", "dsequence_lens", "dinitial_h", "dinitial_c", "dP"},
      "Gradient of LSTM (every direction, sequence_lens or none, layout 0 or 1, clip or none, peepholes, "
      "input_forget 0 or 1, any activations; B, initial_h, initial_c, P, dY, dY_h and dY_c given) with respect "
      "to X, W, R, B, initial_h, initial_c and P: per direction (a Scan over the direction axis), a forward Scan in "
      "float64 reruns the cell for its states, a reverse Scan recomputes the gates and carries dH and dC.",
      {"direction", "reverse", "layout", "clip_bound", "input_forget", "activation_kinds", "activation_alphas",
       "activation_betas"});
  prologue(f, {"initial_h", "initial_c", "dY_h", "dY_c"});
  direction_flips(f);
  activation_setup(f);
  active_steps(f);
  fused_body::caller_attribute(f, "if_i", "input_forget", fused_body::kInt);
  add(f, "Constant", {}, "if_one", {{"value", TensorData::scalar<int64_t>(1)}});
  add(f, "Equal", {"if_i", "if_one"}, "if_flag");
  to_f64(f, {"X_l0", "W", "R", "B", "P", "initial_h_l0", "initial_c_l0", "dY_l0", "dY_h_l0", "dY_c_l0"});

  // One direction: x_t [S, B, I], w_d [4H, I], r_d [4H, H], b_d [8H], p_d [3H], h0_d, c0_d, dyh_d and dyc_d
  // [B, H], dy_t [S, B, H], clip, input_forget (bool).
  Function d;
  flip_setup(d, "flip");
  int64s(d, "ax0", {0});
  int64s(d, "ax1", {1});
  int64s(d, "ax2", {2});
  int64s(d, "ax01", {0, 1});
  int64s(d, "minus1", {-1});
  int64s(d, "big", {std::numeric_limits<int64_t>::max()});
  flip(d, "dy_t", "dy_d");  // step order
  flip(d, "x_t", "x_d");
  flip(d, "live_t", "live_d");
  add(d, "Shape", {"w_d"}, "w_shape");
  add(d, "Slice", {"w_shape", "ax0", "ax1"}, "H4");  // [4H]
  add(d, "Slice", {"b_d", "ax0", "H4", "ax0"}, "wb");
  add(d, "Slice", {"b_d", "H4", "big", "ax0"}, "rb");
  input_projections(d);  // [S, B, 4H]
  direction_functions(d, 3);  // f for the gates i, o, f; g for c~; h for h(c)

  // The cell from the states entering a step (hp, cp) and the step's projections: gates i, o, f, c~ and the new
  // c (ct), each gate with its slope (activation()). Peepholes add p_i c_{t-1} and p_f c_{t-1} to the input and
  // forget gates' pre-activations and p_o c_t to the output gate's; input_forget replaces f by 1 - i.
  const auto cell = [&](Graph& g) {
    const Nodes step{g.nodes};
    step("Constant", {}, "one", {{"value", TensorData::scalar<double>(1.0)}});
    step("Constant", {}, "zero", {{"value", TensorData::scalar<double>(0.0)}});
    step("Constant", {}, "no_clip", {{"value", TensorData::scalar<double>(std::numeric_limits<double>::infinity())}});
    step("Constant", {}, "c0", {{"value", TensorData::from<int64_t>({1}, std::span<const int64_t>(std::vector<int64_t>{0}))}});
    step("Constant", {}, "c1", {{"value", TensorData::from<int64_t>({1}, std::span<const int64_t>(std::vector<int64_t>{1}))}});
    step("Constant", {}, "c2", {{"value", TensorData::from<int64_t>({1}, std::span<const int64_t>(std::vector<int64_t>{2}))}});
    step("Shape", {"hp"}, "hp_shape");
    step("Slice", {"hp_shape", "c1", "c2"}, "h1");
    step("Add", {"h1", "h1"}, "h2");
    step("Add", {"h2", "h1"}, "h3");
    step("Add", {"h3", "h1"}, "h4");
    step("Gemm", {"hp", "r_in", "rb_in"}, "hr", {{"transB", int64_t{1}}});
    step("Add", {"xw_t", "hr"}, "a");  // [B, 4H]
    step("Slice", {"a", "c0", "h1", "c1"}, "a_i");
    step("Slice", {"a", "h1", "h2", "c1"}, "a_o");
    step("Slice", {"a", "h2", "h3", "c1"}, "a_f");
    step("Slice", {"a", "h3", "h4", "c1"}, "a_c");
    step("Slice", {"p_in", "c0", "h1", "c0"}, "p_i");
    step("Slice", {"p_in", "h1", "h2", "c0"}, "p_o");
    step("Slice", {"p_in", "h2", "h3", "c0"}, "p_f");
    step("Add", {"a_i", step("Mul", {"p_i", "cp"}, "pi_cp")}, "a_ip");
    step("Add", {"a_f", step("Mul", {"p_f", "cp"}, "pf_cp")}, "a_fp");
    activation(step, "a_ip", "gi", "fn0", "clip_in");
    activation(step, "a_fp", "gf_own", "fn0", "clip_in");
    step("Sub", {"one", "gi"}, "gi_coupled");
    step("Where", {"if_in", "gi_coupled", "gf_own"}, "gf");
    activation(step, "a_c", "gc", "fn1", "clip_in");
    step("Mul", {"gf", "cp"}, "f_cp");
    step("Mul", {"gi", "gc"}, "i_gc");
    step("Add", {"f_cp", "i_gc"}, "ct");
    step("Add", {"a_o", step("Mul", {"p_o", "ct"}, "po_ct")}, "a_op");
    activation(step, "a_op", "go", "fn0", "clip_in");
    activation(step, "ct", "tct", "fn2", "no_clip");  // h(C) is not clipped
    return step;
  };
  // What rides along both Scans unchanged: R, Rb, P, clip, input_forget and the activation functions, as
  // (name in the Scan bodies, name in the direction's body, type).
  struct Riding {
    std::string inner, outer;
    TypeInfo type;
  };
  std::vector<Riding> riding{{"r_in", "r_d", kF64}, {"rb_in", "rb", kF64}, {"p_in", "p_d", kF64},
                             {"clip_in", "clip", kF64}, {"if_in", "if_d", kBool}};
  for (const char* k : {"0", "1", "2"})
    for (const auto& [part, t] : {std::pair<std::string, TypeInfo>{"_kind", kI64}, {"_alpha", kF64}, {"_beta", kF64}})
      riding.push_back({"fn" + std::string(k) + part, "act" + std::string(k) + part, t});
  const auto ride = [&](Graph& g, const Nodes& step) {
    for (const Riding& v : riding) {
      g.inputs.push_back({v.inner, v.type});
      g.outputs.push_back({v.inner + "_out", v.type});
      step("Identity", {v.inner}, v.inner + "_out");
    }
  };
  std::vector<std::string> riding_d;
  for (const Riding& v : riding) riding_d.push_back(v.outer);
  const auto ride_outs = [&](const std::string& prefix) {
    std::vector<std::string> o;
    for (const Riding& v : riding) o.push_back(prefix + v.inner);
    return o;
  };

  // Forward: states h, c; emits the states entering each step and the cell state after it. A step past the row's
  // length (sequence_lens) does not run: the states stay.
  auto fwd = std::make_shared<Graph>();
  fwd->name = "lstm_states";
  fwd->inputs = {{"hp", kF64}, {"cp", kF64}};
  fwd->outputs = {{"h_out", kF64}, {"c_out", kF64}};
  {
    const Nodes step = cell(*fwd);
    ride(*fwd, step);
    fwd->inputs.insert(fwd->inputs.end(), {{"xw_t", kF64}, {"live", kBool}});
    fwd->outputs.insert(fwd->outputs.end(), {{"hp_out", kF64}, {"cp_out", kF64}, {"cn_out", kF64}});
    step("Mul", {"go", "tct"}, "h_run");
    step("Where", {"live", "h_run", "hp"}, "h_out");
    step("Where", {"live", "ct", "cp"}, "c_out");
    step("Identity", {"hp"}, "hp_out");
    step("Identity", {"cp"}, "cp_out");
    step("Identity", {"c_out"}, "cn_out");
  }
  std::vector<std::string> fins{"h0_d", "c0_d"};
  fins.insert(fins.end(), riding_d.begin(), riding_d.end());
  fins.insert(fins.end(), {"xw", "live_d"});
  Node fscan = fused_body::op("states", "Scan", fins, "h_last");
  fscan.outputs = {"h_last", "c_last"};
  for (const std::string& o : ride_outs("f_")) fscan.outputs.push_back(o);
  fscan.outputs.insert(fscan.outputs.end(), {"h_prev", "c_prev", "c_next"});
  fscan.attributes = {{"body", fwd}, {"num_scan_inputs", int64_t{2}}};
  d.nodes.push_back(std::move(fscan));

  // Backward: dH, dC carried; emits the gates' pre-activation gradients. A step that did not run has none (all
  // below is linear in dh and dc), and dH and dC pass through it.
  auto bwd = std::make_shared<Graph>();
  bwd->name = "lstm_bptt_step";
  bwd->inputs = {{"dh_in", kF64}, {"dc_in", kF64}};
  bwd->outputs = {{"dh_out", kF64}, {"dc_out", kF64}};
  {
    const Nodes step = cell(*bwd);
    ride(*bwd, step);
    bwd->inputs.insert(bwd->inputs.end(),
                       {{"dy_t", kF64}, {"xw_t", kF64}, {"hp", kF64}, {"cp", kF64}, {"live", kBool}});
    bwd->outputs.push_back({"da", kF64});
    step("Add", {"dy_t", "dh_in"}, "dh_run");
    step("Where", {"live", "dh_run", "zero"}, "dh");
    step("Mul", {step("Mul", {"dh", "tct"}, "do"), "go_slope"}, "da_o");
    step("Mul", {"dh", "go"}, "dh_o");
    step("Mul", {"dh_o", "tct_slope"}, "dc_from_h");
    step("Mul", {"da_o", "p_o"}, "dc_from_po");
    step("Sum", {"dc_in", "dc_from_h", "dc_from_po"}, "dc_run");
    step("Where", {"live", "dc_run", "zero"}, "dc");
    step("Mul", {"dc", "gc"}, "di_own");
    step("Mul", {"dc", "cp"}, "df_own");
    step("Mul", {"dc", "gi"}, "dgc");
    // input_forget: f = 1 - i, so f's gradient goes to i, negated, and f's own pre-activation gets none.
    step("Where", {"if_in", step("Sub", {"di_own", "df_own"}, "di_coupled"), "di_own"}, "di");
    step("Where", {"if_in", "zero", "df_own"}, "df");
    step("Mul", {"di", "gi_slope"}, "da_i");
    step("Mul", {"df", "gf_own_slope"}, "da_f");
    step("Mul", {"dgc", "gc_slope"}, "da_c");
    step("Mul", {"dc", "gf"}, "dc_via_f");
    step("Mul", {"da_i", "p_i"}, "dc_via_pi");
    step("Mul", {"da_f", "p_f"}, "dc_via_pf");
    step("Sum", {"dc_via_f", "dc_via_pi", "dc_via_pf"}, "dc_step");
    step("Where", {"live", "dc_step", "dc_in"}, "dc_out");
    step("Concat", {"da_i", "da_o", "da_f", "da_c"}, "da", {{"axis", int64_t{1}}});
    step("MatMul", {"da", "r_in"}, "dh_step");
    step("Where", {"live", "dh_step", "dh_in"}, "dh_out");
  }
  std::vector<std::string> bins{"dyh_d", "dyc_d"};
  bins.insert(bins.end(), riding_d.begin(), riding_d.end());
  bins.insert(bins.end(), {"dy_d", "xw", "h_prev", "c_prev", "live_d"});
  Node bscan = fused_body::op("bptt", "Scan", bins, "dh0_d");
  bscan.outputs = {"dh0_d", "dc0_d"};
  for (const std::string& o : ride_outs("b_")) bscan.outputs.push_back(o);
  bscan.outputs.push_back("DA");
  bscan.attributes = {{"body", bwd},
                      {"num_scan_inputs", int64_t{5}},
                      {"scan_input_directions", std::vector<int64_t>{1, 1, 1, 1, 1}},
                      {"scan_output_directions", std::vector<int64_t>{1}}};
  d.nodes.push_back(std::move(bscan));

  add(d, "Flatten", {"DA"}, "da2", {{"axis", int64_t{2}}});
  add(d, "Flatten", {"h_prev"}, "hp2", {{"axis", int64_t{2}}});
  const std::map<std::string, Attribute> ta{{"transA", int64_t{1}}};
  add(d, "Gemm", {"da2", "x2"}, "dw_d", ta);
  add(d, "Gemm", {"da2", "hp2"}, "dr_d", ta);
  add(d, "ReduceSum", {"da2", "ax0"}, "db_half", {{"keepdims", int64_t{0}}});
  add(d, "Concat", {"db_half", "db_half"}, "db_d", {{"axis", int64_t{0}}});
  // dP: p_i and p_f multiply c_{t-1}, p_o multiplies c_t (zero terms on the steps that did not run, whose DA is 0).
  add(d, "Shape", {"r_d"}, "r_shape");
  add(d, "Slice", {"r_shape", "ax1", "ax2"}, "dp_h1");
  add(d, "Add", {"dp_h1", "dp_h1"}, "dp_h2");
  add(d, "Add", {"dp_h2", "dp_h1"}, "dp_h3");
  add(d, "Slice", {"DA", "ax0", "dp_h1", "ax2"}, "DA_i");
  add(d, "Slice", {"DA", "dp_h1", "dp_h2", "ax2"}, "DA_o");
  add(d, "Slice", {"DA", "dp_h2", "dp_h3", "ax2"}, "DA_f");
  const auto peephole = [&](const std::string& da, const std::string& c, const std::string& out) {
    add(d, "ReduceSum", {add(d, "Mul", {da, c}, out + "_terms"), "ax01"}, out, {{"keepdims", int64_t{0}}});
  };
  peephole("DA_i", "c_prev", "dp_i");
  peephole("DA_o", "c_next", "dp_o");
  peephole("DA_f", "c_prev", "dp_f");
  add(d, "Concat", {"dp_i", "dp_o", "dp_f"}, "dp_d", {{"axis", int64_t{0}}});  // [3H], P's order i, o, f
  add(d, "MatMul", {"DA", "w_d"}, "dx_d");
  flip(d, "dx_d", "dx");  // time order
  over_directions(f, std::move(d), {{"X_l0_f64", "x_t"}, {"clip_f64", "clip"}, {"if_flag", "if_d", 0, kBool}},
                  with_functions({{"flips", "flip", 0, kBool}, {"W_f64", "w_d"}, {"R_f64", "r_d"}, {"B_f64", "b_d"},
                   {"P_f64", "p_d"}, {"initial_h_l0_f64", "h0_d"}, {"initial_c_l0_f64", "c0_d"},
                   {"dY_h_l0_f64", "dyh_d"}, {"dY_c_l0_f64", "dyc_d"}, {"dY_l0_f64", "dy_t", 1},
                   {"active", "live_t", 1, kBool}}),
                  {{"dw_d", "dW"}, {"dr_d", "dR"}, {"db_d", "dB"}, {"dh0_d", "dinitial_h"}, {"dc0_d", "dinitial_c"},
                   {"dp_d", "dP"}, {"dx", "dX"}});
  return f;
}

}  // namespace

std::string fused_body_refusal(const Node& n) {
  if (n.domain != kFusedGradDomain) return "";
  if (n.op_type == "RNNGrad" || n.op_type == "GRUGrad" || n.op_type == "LSTMGrad") {
    const bool gru = n.op_type == "GRUGrad", lstm = n.op_type == "LSTMGrad";
    const std::string op = n.op_type;
    const std::string direction = n.attr_string("direction", "forward");
    if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
      return "attribute 'direction' is '" + direction + "': " + op + "'s function body serves 'forward', "
             "'reverse' and 'bidirectional'";
    if (!n.has_attr("reverse") || n.attr_int("reverse", -1) != (direction == "reverse" ? 1 : 0))
      return "attribute 'reverse' must be " + std::string(direction == "reverse" ? "1" : "0") + " for direction '" +
             direction + "' (" + op + "'s function body reads it; the rule writes it)";
    // The body reads the activation functions as ints and floats the rule writes beside the strings (the kernel
    // checks that they agree): F functions (3 for LSTM, 2 for GRU, 1 for RNN) per direction.
    const size_t count = (lstm ? 3 : gru ? 2 : 1) * (direction == "bidirectional" ? 2 : 1);
    const auto listed = [&](const char* a, auto kind) {
      auto it = n.attributes.find(a);
      const auto* v = it == n.attributes.end() ? nullptr : std::get_if<decltype(kind)>(&it->second);
      return v && v->size() == count;
    };
    if (!listed("activation_kinds", std::vector<int64_t>{}) || !listed("activation_alphas", std::vector<float>{}) ||
        !listed("activation_betas", std::vector<float>{}))
      return "attributes 'activation_kinds', 'activation_alphas' and 'activation_betas' must each list " +
             std::to_string(count) + " values (" + op + "'s function body reads them; the rule writes them)";
    for (int64_t k : n.attr_ints("activation_kinds"))
      if (k < 0 || k >= kActCodes)
        return "attribute 'activation_kinds' holds " + std::to_string(k) + ", which codes no activation function";
    // The body reads the clip as clip_bound, which the rule writes beside the optional clip (a body cannot read an
    // attribute its caller may leave out): the clip, or the largest float for none.
    const float clip = n.has_attr("clip") ? n.attr_float("clip", 0) : kNoClip;
    if (!n.has_attr("clip_bound") || n.attr_float("clip_bound", 0) != clip)
      return "attribute 'clip_bound' must be " +
             (n.has_attr("clip") ? "the clip, " + std::to_string(clip) : std::string("the largest float (no clip)")) +
             " (" + op + "'s function body reads it; the rule writes it)";
    if (!n.has_attr("layout") || (n.attr_int("layout", 0) != 0 && n.attr_int("layout", 0) != 1))
      return "attribute 'layout' must be set to 0 or 1 (" + op + "'s function body reads it; the rule writes it)";
    if (!n.has_attr("hidden_size"))
      return "attribute 'hidden_size' is not set (" + op + "'s function body reruns the forward op with it)";
    if (gru && !n.has_attr("linear_before_reset"))
      return "attribute 'linear_before_reset' is not set (GRUGrad's function body reads it; the GRU rule writes it)";
    const auto given = [&](size_t i) { return i < n.inputs.size() && !n.inputs[i].empty(); };
    if (!given(3)) return "B is absent (" + op + "'s function body needs it; the rule passes zeros)";
    if (lstm) {
      if (!n.has_attr("input_forget"))
        return "attribute 'input_forget' is not set (LSTMGrad's function body reads it; the rule writes it)";
      if (!given(5) || !given(6) || !given(7) || !given(8) || !given(9) || !given(10))
        return "initial_h, initial_c, P, dY, dY_h or dY_c is absent (LSTMGrad's function body needs them; the rule "
               "passes zeros)";
    } else if (!given(5) || !given(6) || !given(7)) {
      return "initial_h, dY or dY_h is absent (" + op + "'s function body needs all three; the rule passes zeros)";
    }
  }
  if (n.op_type == "GridSampleGrad" && (!n.has_attr("interpolation") || !n.has_attr("padding") ||
                                       !n.has_attr("align_corners")))
    return "attributes 'interpolation', 'padding' and 'align_corners' are not all set (GridSampleGrad's function body reads them; the "
           "GridSample rule writes them)";
  if (n.op_type == "MaxRoiPoolGrad" && (!n.has_attr("pooled_shape") || !n.has_attr("spatial_scale")))
    return "attributes 'pooled_shape' and 'spatial_scale' must both be set (MaxRoiPoolGrad's function body reads them)";
  return "";
}

std::vector<Function> fused_recurrent_functions() { return {rnn_grad(), gru_grad(), lstm_grad()}; }

}  // namespace onnxtrain
