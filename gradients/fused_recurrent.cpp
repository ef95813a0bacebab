// Standard-ONNX bodies of onnxtrain.RNNGrad, GRUGrad and LSTMGrad (native kernels: executor/cpu/recurrent.cpp; the
// design is in gradients/rules/recurrent.cpp). They serve the common case only: one direction (forward, or
// reverse by flipping time, see flip_setup), the default activations, no clip, layout 0, no sequence_lens, no
// peepholes, and B (GRU, LSTM), the initial states and every incoming gradient present (the rule passes zeros
// for absent ones).
// fused_body_refusal() names what a node has outside that case; TrainingSession::export_gradient_model refuses
// such a node rather than export a body that would compute something else.
//
// RNNGrad:
// The body reruns the forward RNN (the standard op, with the caller's hidden_size) for the states h_t, then
// runs backpropagation through time as a reverse Scan carrying dH (R rides along as a second state, so the
// Scan body reads nothing from the enclosing scope) and emitting da_t = (dY_t + dH) * (1 - h_t^2); dH becomes
// da_t R. The weight gradients come after the Scan from the stacked da: dW = da^T X, dR = da^T h_{t-1},
// dB = (sum da, sum da), dX = da W, d initial_h the final dH. The Scan and the products run in float64 (cast
// in and out), so its body has one concrete type whatever the caller's, as ONNX requires of a graph's inputs.
#include <cctype>
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

// direction 'reverse' (the rule writes the int attribute `reverse` beside the string, which a body cannot
// compare): the body works in step order, i.e. on time-major tensors flipped along time when reversed. One Slice
// whose starts, ends and steps are chosen by the flag flips or copies.
void flip_setup(Function& f) {
  fused_body::caller_attribute(f, "rev_i", "reverse", fused_body::kInt);
  add(f, "Constant", {}, "rev_one", {{"value", TensorData::scalar<int64_t>(1)}});
  add(f, "Equal", {"rev_i", "rev_one"}, "rev");
  int64s(f, "fl_m1", {-1});
  int64s(f, "fl_0", {0});
  int64s(f, "fl_1", {1});
  int64s(f, "fl_min", {std::numeric_limits<int64_t>::min()});
  int64s(f, "fl_max", {std::numeric_limits<int64_t>::max()});
  add(f, "Where", {"rev", "fl_m1", "fl_0"}, "fl_starts");
  add(f, "Where", {"rev", "fl_min", "fl_max"}, "fl_ends");
  add(f, "Where", {"rev", "fl_m1", "fl_1"}, "fl_steps");
}
std::string flip(Function& f, const std::string& in, const std::string& out) {
  return add(f, "Slice", {in, "fl_starts", "fl_ends", "fl_0", "fl_steps"}, out);
}

// How every recurrent body ends: dX ("dx_d", in step order) flipped back to time order, the per-direction
// gradients (named in `directed` as value -> output) given back their direction axis, all cast to X's type,
// and an empty gradient for sequence_lens.
void emit_outputs(Function& f, const std::vector<std::pair<std::string, std::string>>& directed) {
  flip(f, "dx_d", "dx_time");
  add(f, "CastLike", {"dx_time", "X"}, "dX");
  for (const auto& [v, name] : directed) add(f, "Unsqueeze", {add(f, "CastLike", {v, "X"}, name + "_2"), "ax0"}, name);
  add(f, "Constant", {}, "dsequence_lens", {{"value", TensorData::from<int64_t>({0}, std::span<const int64_t>())}});
}

Function rnn_grad() {
  Function f = fused_body::function(
      "RNNGrad", {"X", "W", "R", "B", "sequence_lens", "initial_h", "dY", "dY_h"},
      {"dX", "dW", "dR", "dB", "dsequence_lens", "dinitial_h"},
      "Gradient of RNN (one forward direction, Tanh, no clip, layout 0, no sequence_lens; initial_h, dY and dY_h "
      "given) with respect to X, W, R, B and initial_h: the forward RNN rerun for the states, then a reverse "
      "Scan carrying dH in float64 that emits da_t = (dY_t + dH) (1 - h_t^2), dH <- da_t R; the weight "
      "gradients are products of the stacked da.",
      {"hidden_size", "direction", "reverse"});
  // Forward states Y [S, 1, B, H].
  Node rnn = fused_body::op("rnn", "RNN", {"X", "W", "R", "B", "sequence_lens", "initial_h"}, "Y_all");
  rnn.attribute_refs["hidden_size"] = {"hidden_size", fused_body::kInt};
  rnn.attribute_refs["direction"] = {"direction", fused_body::kString};
  f.nodes.push_back(std::move(rnn));
  flip_setup(f);
  int64s(f, "ax0", {0});
  int64s(f, "ax1", {1});
  const auto dbl = [&](const std::string& in, const std::string& out) {
    return add(f, "Cast", {in}, out, {{"to", kDouble}});
  };
  flip(f, dbl(add(f, "Squeeze", {"Y_all", "ax1"}, "y3"), "y_t"), "y_d");  // [S, B, H], step order
  flip(f, dbl(add(f, "Squeeze", {"dY", "ax1"}, "dy3"), "dy_t"), "dy_d");  // [S, B, H]
  dbl(add(f, "Squeeze", {"dY_h", "ax0"}, "dyh2"), "dyh_d");      // [B, H]
  dbl(add(f, "Squeeze", {"R", "ax0"}, "r2"), "r_d");             // [H, H]
  dbl(add(f, "Squeeze", {"W", "ax0"}, "w2"), "w_d");             // [H, I]
  dbl(add(f, "Squeeze", {"initial_h", "ax0"}, "h02"), "h0_d");   // [B, H]
  flip(f, dbl("X", "x_t"), "x_d");                               // [S, B, I]

  // The reverse Scan's body, in float64.
  auto body = std::make_shared<Graph>();
  body->name = "rnn_bptt_step";
  const TypeInfo d{DType::Float64, std::nullopt};
  body->inputs = {{"dh_in", d}, {"r_in", d}, {"dy_t", d}, {"y_t", d}};
  body->outputs = {{"dh_out", d}, {"r_out", d}, {"da_out", d}};
  const auto step = [&](std::string type, std::vector<std::string> in, std::string out,
                        std::map<std::string, Attribute> attrs = {}) {
    body->nodes.push_back(fused_body::op(out, std::move(type), std::move(in), out, std::move(attrs)));
  };
  step("Constant", {}, "one", {{"value", TensorData::scalar<double>(1.0)}});
  step("Add", {"dy_t", "dh_in"}, "g");
  step("Mul", {"y_t", "y_t"}, "y2");
  step("Sub", {"one", "y2"}, "slope");
  step("Mul", {"g", "slope"}, "da");
  step("MatMul", {"da", "r_in"}, "dh_out");
  step("Identity", {"r_in"}, "r_out");
  step("Identity", {"da"}, "da_out");
  Node scan = fused_body::op("bptt", "Scan", {"dyh_d", "r_d", "dy_d", "y_d"}, "dh0_d");
  scan.outputs = {"dh0_d", "r_last", "da"};  // da [S, B, H], in time order
  scan.attributes = {{"body", body},
                     {"num_scan_inputs", int64_t{2}},
                     {"scan_input_directions", std::vector<int64_t>{1, 1}},
                     {"scan_output_directions", std::vector<int64_t>{1}}};
  f.nodes.push_back(std::move(scan));

  // h_{t-1}: initial_h, then Y without its last step.
  int64s(f, "minus1", {-1});
  add(f, "Slice", {"y_d", "ax0", "minus1", "ax0"}, "y_head");
  add(f, "Unsqueeze", {"h0_d", "ax0"}, "h0_3");
  add(f, "Concat", {"h0_3", "y_head"}, "h_prev", {{"axis", int64_t{0}}});
  add(f, "Flatten", {"da"}, "da2", {{"axis", int64_t{2}}});        // [S B, H]
  add(f, "Flatten", {"x_d"}, "x2", {{"axis", int64_t{2}}});        // [S B, I]
  add(f, "Flatten", {"h_prev"}, "hp2", {{"axis", int64_t{2}}});    // [S B, H]
  // Gemm with transA rather than Transpose + MatMul, which onnxruntime fuses into a FusedMatMul that has no
  // float64 kernel.
  add(f, "Gemm", {"da2", "x2"}, "dw_d", {{"transA", int64_t{1}}});
  add(f, "Gemm", {"da2", "hp2"}, "dr_d", {{"transA", int64_t{1}}});
  add(f, "ReduceSum", {"da2", "ax0"}, "db_half", {{"keepdims", int64_t{0}}});
  add(f, "Concat", {"db_half", "db_half"}, "db_d", {{"axis", int64_t{0}}});
  add(f, "MatMul", {"da", "w_d"}, "dx_d");
  emit_outputs(f, {{"dw_d", "dW"}, {"dr_d", "dR"}, {"db_d", "dB"}, {"dh0_d", "dinitial_h"}});
  return f;
}

// GRUGrad, the same common case (linear_before_reset 0 or 1, read by reference; the rule always writes it): the
// forward GRU rerun for the states h_t, the input projections X W^T + Wb once for all steps, then a reverse
// Scan (float64) whose body recomputes the step's gates z, r and h~ from h_{t-1} and carries dH. Per step it
// emits the gates' pre-activation gradients (da_z, da_r, da_h) and the two factors of R_h's gradient (da_h and
// r h_{t-1} without linear_before_reset; r da_h and h_{t-1} with it), whose products after the Scan give dW,
// dR, dB and dX. Gemm with transB rather than Transpose + MatMul (which onnxruntime fuses into a FusedMatMul
// without a float64 kernel).
Function gru_grad() {
  Function f = fused_body::function(
      "GRUGrad", {"X", "W", "R", "B", "sequence_lens", "initial_h", "dY", "dY_h"},
      {"dX", "dW", "dR", "dB", "dsequence_lens", "dinitial_h"},
      "Gradient of GRU (one forward direction, default activations Sigmoid/Tanh, no clip, layout 0, no "
      "sequence_lens; B, initial_h, dY and dY_h given; linear_before_reset 0 or 1) with respect to X, W, R, B and "
      "initial_h: the forward GRU rerun for the states, then a reverse Scan in float64 that recomputes each "
      "step's gates and carries dH.",
      {"hidden_size", "linear_before_reset", "direction", "reverse"});
  Node gru = fused_body::op("gru", "GRU", {"X", "W", "R", "B", "sequence_lens", "initial_h"}, "Y_all");
  gru.attribute_refs["hidden_size"] = {"hidden_size", fused_body::kInt};
  gru.attribute_refs["linear_before_reset"] = {"linear_before_reset", fused_body::kInt};
  gru.attribute_refs["direction"] = {"direction", fused_body::kString};
  f.nodes.push_back(std::move(gru));
  flip_setup(f);
  fused_body::caller_attribute(f, "lbr_i", "linear_before_reset", fused_body::kInt);
  add(f, "Constant", {}, "one_i", {{"value", TensorData::scalar<int64_t>(1)}});
  add(f, "Equal", {"lbr_i", "one_i"}, "lbr");
  int64s(f, "ax0", {0});
  int64s(f, "ax1", {1});
  int64s(f, "ax2", {2});
  int64s(f, "big", {std::numeric_limits<int64_t>::max()});
  int64s(f, "minus1", {-1});
  const auto dbl = [&](const std::string& in, const std::string& out) {
    return add(f, "Cast", {in}, out, {{"to", kDouble}});
  };
  flip(f, dbl(add(f, "Squeeze", {"Y_all", "ax1"}, "y3"), "y_t"), "y_d");  // step order
  flip(f, dbl(add(f, "Squeeze", {"dY", "ax1"}, "dy3"), "dy_t"), "dy_d");
  dbl(add(f, "Squeeze", {"dY_h", "ax0"}, "dyh2"), "dyh_d");
  dbl(add(f, "Squeeze", {"R", "ax0"}, "r2"), "r_d");            // [3H, H]
  dbl(add(f, "Squeeze", {"W", "ax0"}, "w2"), "w_d");            // [3H, I]
  dbl(add(f, "Squeeze", {"B", "ax0"}, "b2"), "b_d");            // [6H]
  dbl(add(f, "Squeeze", {"initial_h", "ax0"}, "h02"), "h0_d");  // [B, H]
  flip(f, dbl("X", "x_t"), "x_d");
  // Gate blocks: rows [k H, (k + 1) H) of W, R and the biases.
  add(f, "Shape", {"r_d"}, "r_shape");
  add(f, "Slice", {"r_shape", "ax1", "ax2"}, "H1");  // [H]
  add(f, "Add", {"H1", "H1"}, "H2");
  add(f, "Add", {"H2", "H1"}, "H3");
  add(f, "Add", {"H3", "H1"}, "H4");
  add(f, "Add", {"H4", "H1"}, "H5");
  const char* starts[] = {"ax0", "H1", "H2", "H3", "H4", "H5"};
  const char* ends[] = {"H1", "H2", "H3", "H4", "H5", "big"};
  for (int k = 0; k < 3; ++k) {
    add(f, "Slice", {"r_d", starts[k], ends[k], "ax0"}, std::string("r_") + "zrh"[k]);
    add(f, "Slice", {"b_d", starts[3 + k], ends[3 + k], "ax0"}, std::string("rb_") + "zrh"[k]);
  }
  add(f, "Slice", {"b_d", "ax0", "H3", "ax0"}, "wb");
  // Input projections for every step: [S, B, 3H], split by gate.
  add(f, "Flatten", {"x_d"}, "x2", {{"axis", int64_t{2}}});
  add(f, "Gemm", {"x2", "w_d", "wb"}, "xw2", {{"transB", int64_t{1}}});
  add(f, "Shape", {"x_d"}, "x_shape");
  add(f, "Slice", {"x_shape", "ax0", "ax2"}, "sb");
  add(f, "Concat", {"sb", "minus1"}, "sb_1", {{"axis", int64_t{0}}});
  add(f, "Reshape", {"xw2", "sb_1"}, "xw");
  for (int k = 0; k < 3; ++k)
    add(f, "Slice", {"xw", starts[k], ends[k], "ax2"}, std::string("x_") + "zrh"[k]);
  add(f, "Slice", {"y_d", "ax0", "minus1", "ax0"}, "y_head");
  add(f, "Unsqueeze", {"h0_d", "ax0"}, "h0_3");
  add(f, "Concat", {"h0_3", "y_head"}, "h_prev", {{"axis", int64_t{0}}});

  auto body = std::make_shared<Graph>();
  body->name = "gru_bptt_step";
  const TypeInfo d{DType::Float64, std::nullopt};
  body->inputs = {{"dh_in", d},  {"rz_in", d}, {"rr_in", d}, {"rh_in", d}, {"bz_in", d},
                  {"br_in", d},  {"bh_in", d}, {"lbr_in", {DType::Bool, std::nullopt}},
                  {"dy_t", d},   {"xz_t", d},  {"xr_t", d},  {"xh_t", d},  {"hp", d}};
  body->outputs = {{"dh_out", d}, {"rz_out", d}, {"rr_out", d}, {"rh_out", d}, {"bz_out", d},
                   {"br_out", d}, {"bh_out", d}, {"lbr_out", {DType::Bool, std::nullopt}},
                   {"daz", d},    {"dar", d},    {"dah", d},    {"left", d},   {"right", d}};
  const auto step = [&](std::string type, std::vector<std::string> in, std::string out,
                        std::map<std::string, Attribute> attrs = {}) {
    body->nodes.push_back(fused_body::op(out, std::move(type), std::move(in), out, std::move(attrs)));
  };
  const std::map<std::string, Attribute> tb{{"transB", int64_t{1}}};
  step("Constant", {}, "one", {{"value", TensorData::scalar<double>(1.0)}});
  step("Add", {"dy_t", "dh_in"}, "g");
  step("Gemm", {"hp", "rz_in", "bz_in"}, "hz", tb);
  step("Add", {"xz_t", "hz"}, "az");
  step("Sigmoid", {"az"}, "z");
  step("Gemm", {"hp", "rr_in", "br_in"}, "hr", tb);
  step("Add", {"xr_t", "hr"}, "ar");
  step("Sigmoid", {"ar"}, "r");
  step("Gemm", {"hp", "rh_in", "bh_in"}, "u", tb);  // linear_before_reset: h_{t-1} R_h^T + Rb_h
  step("Mul", {"r", "u"}, "ru");
  step("Mul", {"r", "hp"}, "q");                      // otherwise: (r h_{t-1}) R_h^T + Rb_h
  step("Gemm", {"q", "rh_in", "bh_in"}, "qh", tb);
  step("Where", {"lbr_in", "ru", "qh"}, "hh_rec");
  step("Add", {"xh_t", "hh_rec"}, "ah");
  step("Tanh", {"ah"}, "ht");
  step("Sub", {"one", "z"}, "one_z");
  step("Mul", {"g", "one_z"}, "dht");
  step("Sub", {"hp", "ht"}, "hp_ht");
  step("Mul", {"g", "hp_ht"}, "dz");
  step("Mul", {"g", "z"}, "dhp_direct");
  step("Mul", {"ht", "ht"}, "ht2");
  step("Sub", {"one", "ht2"}, "tanh_slope");
  step("Mul", {"dht", "tanh_slope"}, "dah");
  step("Mul", {"z", "one_z"}, "z_slope");
  step("Mul", {"dz", "z_slope"}, "daz");
  step("Mul", {"dah", "u"}, "dr1");
  step("Mul", {"dah", "r"}, "du");
  step("MatMul", {"du", "rh_in"}, "dhp1");
  step("MatMul", {"dah", "rh_in"}, "dq");
  step("Mul", {"dq", "hp"}, "dr0");
  step("Mul", {"dq", "r"}, "dhp0");
  step("Where", {"lbr_in", "dr1", "dr0"}, "dr");
  step("Sub", {"one", "r"}, "one_r");
  step("Mul", {"r", "one_r"}, "r_slope");
  step("Mul", {"dr", "r_slope"}, "dar");
  step("Where", {"lbr_in", "du", "dah"}, "left");
  step("Where", {"lbr_in", "hp", "q"}, "right");
  step("Where", {"lbr_in", "dhp1", "dhp0"}, "dhp_h");
  step("MatMul", {"daz", "rz_in"}, "dhp_z");
  step("MatMul", {"dar", "rr_in"}, "dhp_r");
  step("Sum", {"dhp_direct", "dhp_h", "dhp_z", "dhp_r"}, "dh_out");
  for (const char* st : {"rz", "rr", "rh", "bz", "br", "bh", "lbr"})
    step("Identity", {std::string(st) + "_in"}, std::string(st) + "_out");
  Node scan = fused_body::op("bptt", "Scan",
                             {"dyh_d", "r_z", "r_r", "r_h", "rb_z", "rb_r", "rb_h", "lbr", "dy_d", "x_z", "x_r",
                              "x_h", "h_prev"},
                             "dh0_d");
  scan.outputs = {"dh0_d", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "DZ", "DR", "DH", "L", "RT"};
  scan.attributes = {{"body", body},
                     {"num_scan_inputs", int64_t{5}},
                     {"scan_input_directions", std::vector<int64_t>{1, 1, 1, 1, 1}},
                     {"scan_output_directions", std::vector<int64_t>{1, 1, 1, 1, 1}}};
  f.nodes.push_back(std::move(scan));

  add(f, "Concat", {"DZ", "DR", "DH"}, "da", {{"axis", int64_t{2}}});  // [S, B, 3H]
  const auto flat = [&](const std::string& v) { return add(f, "Flatten", {v}, v + "_2", {{"axis", int64_t{2}}}); };
  flat("da");
  flat("DZ");
  flat("DR");
  flat("L");
  flat("RT");
  flat("h_prev");
  const std::map<std::string, Attribute> ta{{"transA", int64_t{1}}};
  add(f, "Gemm", {"da_2", "x2"}, "dw_d", ta);
  add(f, "Gemm", {"DZ_2", "h_prev_2"}, "drz", ta);
  add(f, "Gemm", {"DR_2", "h_prev_2"}, "drr", ta);
  add(f, "Gemm", {"L_2", "RT_2"}, "drh", ta);
  add(f, "Concat", {"drz", "drr", "drh"}, "dr_d", {{"axis", int64_t{0}}});
  add(f, "ReduceSum", {"da_2", "ax0"}, "dwb", {{"keepdims", int64_t{0}}});
  add(f, "ReduceSum", {"DZ_2", "ax0"}, "drbz", {{"keepdims", int64_t{0}}});
  add(f, "ReduceSum", {"DR_2", "ax0"}, "drbr", {{"keepdims", int64_t{0}}});
  add(f, "ReduceSum", {"L_2", "ax0"}, "drbh", {{"keepdims", int64_t{0}}});
  add(f, "Concat", {"dwb", "drbz", "drbr", "drbh"}, "db_d", {{"axis", int64_t{0}}});
  add(f, "MatMul", {"da", "w_d"}, "dx_d");
  emit_outputs(f, {{"dw_d", "dW"}, {"dr_d", "dR"}, {"db_d", "dB"}, {"dh0_d", "dinitial_h"}});
  return f;
}

// LSTMGrad, the same common case (default activations Sigmoid/Tanh/Tanh, no peepholes, input_forget 0, B given):
// the standard LSTM outputs no per-step cell states, so a forward Scan (float64) reruns the cell from the input
// projections and emits the states entering each step (h_{t-1}, c_{t-1}); the reverse Scan recomputes each
// step's gates from them and carries dH and dC, emitting the gates' pre-activation gradients [B, 4H] (order
// i, o, f, c, as W's rows), whose products after the Scan give dW, dR, dB and dX.
Function lstm_grad() {
  Function f = fused_body::function(
      "LSTMGrad",
      {"X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P", "dY", "dY_h", "dY_c"},
      {"dX", "dW", "dR", "dB", "dsequence_lens", "dinitial_h", "dinitial_c", "dP"},
      "Gradient of LSTM (one forward direction, default activations, no clip, layout 0, no sequence_lens, no "
      "peepholes, input_forget 0; B, initial_h, initial_c, dY, dY_h and dY_c given) with respect to X, W, R, B, "
      "initial_h and initial_c: a forward Scan in float64 reruns the cell for the states entering each step, a "
      "reverse Scan recomputes the gates and carries dH and dC.",
      {"reverse"});
  flip_setup(f);
  int64s(f, "ax0", {0});
  int64s(f, "ax1", {1});
  int64s(f, "ax2", {2});
  int64s(f, "minus1", {-1});
  int64s(f, "big", {std::numeric_limits<int64_t>::max()});
  const auto dbl = [&](const std::string& in, const std::string& out) {
    return add(f, "Cast", {in}, out, {{"to", kDouble}});
  };
  flip(f, dbl(add(f, "Squeeze", {"dY", "ax1"}, "dy3"), "dy_t"), "dy_d");  // step order
  dbl(add(f, "Squeeze", {"dY_h", "ax0"}, "dyh2"), "dyh_d");
  dbl(add(f, "Squeeze", {"dY_c", "ax0"}, "dyc2"), "dyc_d");
  dbl(add(f, "Squeeze", {"R", "ax0"}, "r2"), "r_d");            // [4H, H]
  dbl(add(f, "Squeeze", {"W", "ax0"}, "w2"), "w_d");            // [4H, I]
  dbl(add(f, "Squeeze", {"B", "ax0"}, "b2"), "b_d");            // [8H]
  dbl(add(f, "Squeeze", {"initial_h", "ax0"}, "h02"), "h0_d");  // [B, H]
  dbl(add(f, "Squeeze", {"initial_c", "ax0"}, "c02"), "c0_d");  // [B, H]
  flip(f, dbl("X", "x_t"), "x_d");
  add(f, "Shape", {"w_d"}, "w_shape");
  add(f, "Slice", {"w_shape", "ax0", "ax1"}, "H4");  // [4H]
  add(f, "Slice", {"b_d", "ax0", "H4", "ax0"}, "wb");
  add(f, "Slice", {"b_d", "H4", "big", "ax0"}, "rb");
  add(f, "Flatten", {"x_d"}, "x2", {{"axis", int64_t{2}}});
  add(f, "Gemm", {"x2", "w_d", "wb"}, "xw2", {{"transB", int64_t{1}}});
  add(f, "Shape", {"x_d"}, "x_shape");
  add(f, "Slice", {"x_shape", "ax0", "ax2"}, "sb");
  add(f, "Concat", {"sb", "minus1"}, "sb_1", {{"axis", int64_t{0}}});
  add(f, "Reshape", {"xw2", "sb_1"}, "xw");  // [S, B, 4H]

  const TypeInfo d{DType::Float64, std::nullopt};
  // The cell from the states entering a step and the step's projections: gates i, o, f, c~ and the new c.
  const auto cell = [&](Graph& g) {
    const auto step = [&](std::string type, std::vector<std::string> in, std::string out,
                          std::map<std::string, Attribute> attrs = {}) {
      g.nodes.push_back(fused_body::op(out, std::move(type), std::move(in), out, std::move(attrs)));
    };
    step("Constant", {}, "one", {{"value", TensorData::scalar<double>(1.0)}});
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
    step("Sigmoid", {"a_i"}, "gi");
    step("Sigmoid", {"a_o"}, "go");
    step("Sigmoid", {"a_f"}, "gf");
    step("Tanh", {"a_c"}, "gc");
    step("Mul", {"gf", "cp"}, "f_cp");
    step("Mul", {"gi", "gc"}, "i_gc");
    step("Add", {"f_cp", "i_gc"}, "ct");
    step("Tanh", {"ct"}, "tct");
    return step;
  };
  // Forward: states h, c (and R, Rb riding along); emits the states entering each step.
  auto fwd = std::make_shared<Graph>();
  fwd->name = "lstm_states";
  fwd->inputs = {{"hp", d}, {"cp", d}, {"r_in", d}, {"rb_in", d}, {"xw_t", d}};
  fwd->outputs = {{"h_out", d}, {"c_out", d}, {"r_out", d}, {"rb_out", d}, {"hp_out", d}, {"cp_out", d}};
  {
    auto step = cell(*fwd);
    step("Mul", {"go", "tct"}, "h_out");
    step("Identity", {"ct"}, "c_out");
    step("Identity", {"r_in"}, "r_out");
    step("Identity", {"rb_in"}, "rb_out");
    step("Identity", {"hp"}, "hp_out");
    step("Identity", {"cp"}, "cp_out");
  }
  Node fscan = fused_body::op("states", "Scan", {"h0_d", "c0_d", "r_d", "rb", "xw"}, "h_last");
  fscan.outputs = {"h_last", "c_last", "f_r", "f_rb", "h_prev", "c_prev"};
  fscan.attributes = {{"body", fwd}, {"num_scan_inputs", int64_t{1}}};
  f.nodes.push_back(std::move(fscan));

  // Backward: dH, dC carried; emits the gates' pre-activation gradients.
  auto bwd = std::make_shared<Graph>();
  bwd->name = "lstm_bptt_step";
  bwd->inputs = {{"dh_in", d}, {"dc_in", d}, {"r_in", d}, {"rb_in", d},
                 {"dy_t", d},  {"xw_t", d},  {"hp", d},   {"cp", d}};
  bwd->outputs = {{"dh_out", d}, {"dc_out", d}, {"r_out", d}, {"rb_out", d}, {"da", d}};
  {
    auto step = cell(*bwd);
    step("Add", {"dy_t", "dh_in"}, "dh");
    step("Mul", {"dh", "tct"}, "do");
    step("Mul", {"tct", "tct"}, "tct2");
    step("Sub", {"one", "tct2"}, "tct_slope");
    step("Mul", {"dh", "go"}, "dh_o");
    step("Mul", {"dh_o", "tct_slope"}, "dc_from_h");
    step("Add", {"dc_in", "dc_from_h"}, "dc");
    step("Mul", {"dc", "gc"}, "di");
    step("Mul", {"dc", "cp"}, "df");
    step("Mul", {"dc", "gi"}, "dgc");
    step("Mul", {"dc", "gf"}, "dc_out");
    const auto sig_grad = [&](const std::string& dg, const std::string& g, const std::string& out) {
      step("Sub", {"one", g}, g + "_1m");
      step("Mul", {g, g + "_1m"}, g + "_slope");
      step("Mul", {dg, g + "_slope"}, out);
    };
    sig_grad("di", "gi", "da_i");
    sig_grad("do", "go", "da_o");
    sig_grad("df", "gf", "da_f");
    step("Mul", {"gc", "gc"}, "gc2");
    step("Sub", {"one", "gc2"}, "gc_slope");
    step("Mul", {"dgc", "gc_slope"}, "da_c");
    step("Concat", {"da_i", "da_o", "da_f", "da_c"}, "da", {{"axis", int64_t{1}}});
    step("MatMul", {"da", "r_in"}, "dh_out");
    step("Identity", {"r_in"}, "r_out");
    step("Identity", {"rb_in"}, "rb_out");
  }
  Node bscan = fused_body::op("bptt", "Scan", {"dyh_d", "dyc_d", "r_d", "rb", "dy_d", "xw", "h_prev", "c_prev"},
                              "dh0_d");
  bscan.outputs = {"dh0_d", "dc0_d", "b_r", "b_rb", "DA"};
  bscan.attributes = {{"body", bwd},
                      {"num_scan_inputs", int64_t{4}},
                      {"scan_input_directions", std::vector<int64_t>{1, 1, 1, 1}},
                      {"scan_output_directions", std::vector<int64_t>{1}}};
  f.nodes.push_back(std::move(bscan));

  add(f, "Flatten", {"DA"}, "da2", {{"axis", int64_t{2}}});
  add(f, "Flatten", {"h_prev"}, "hp2", {{"axis", int64_t{2}}});
  const std::map<std::string, Attribute> ta{{"transA", int64_t{1}}};
  add(f, "Gemm", {"da2", "x2"}, "dw_d", ta);
  add(f, "Gemm", {"da2", "hp2"}, "dr_d", ta);
  add(f, "ReduceSum", {"da2", "ax0"}, "db_half", {{"keepdims", int64_t{0}}});
  add(f, "Concat", {"db_half", "db_half"}, "db_d", {{"axis", int64_t{0}}});
  add(f, "MatMul", {"DA", "w_d"}, "dx_d");
  emit_outputs(f, {{"dw_d", "dW"}, {"dr_d", "dR"}, {"db_d", "dB"}, {"dh0_d", "dinitial_h"}, {"dc0_d", "dinitial_c"}});
  // No peepholes: P is refused at export (fused_body_refusal); its slot gets an empty tensor of X's type.
  add(f, "Slice", {"dX", "ax0", "ax0", "ax0"}, "dP");
  return f;
}

}  // namespace

std::string fused_body_refusal(const Node& n) {
  if (n.domain != kFusedGradDomain) return "";
  if (n.op_type == "RNNGrad" || n.op_type == "GRUGrad" || n.op_type == "LSTMGrad") {
    const bool gru = n.op_type == "GRUGrad", lstm = n.op_type == "LSTMGrad";
    const std::string op = n.op_type;
    const std::string direction = n.attr_string("direction", "forward");
    if (direction != "forward" && direction != "reverse")
      return "attribute 'direction' is '" + direction + "': " + op + "'s function body serves one direction, "
             "'forward' or 'reverse' (the native kernel serves every direction)";
    if (!n.has_attr("reverse") || n.attr_int("reverse", -1) != (direction == "reverse" ? 1 : 0))
      return "attribute 'reverse' must be " + std::string(direction == "reverse" ? "1" : "0") + " for direction '" +
             direction + "' (" + op + "'s function body reads it; the rule writes it)";
    if (n.has_attr("activations")) {
      std::vector<std::string> acts = std::get<std::vector<std::string>>(n.attributes.at("activations"));
      for (std::string& a : acts)
        for (char& ch : a) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      const std::vector<std::string> fine = lstm  ? std::vector<std::string>{"sigmoid", "tanh", "tanh"}
                                            : gru ? std::vector<std::string>{"sigmoid", "tanh"}
                                                  : std::vector<std::string>{"tanh"};
      if (acts != fine)
        return "attribute 'activations' is not the default (" +
               std::string(lstm ? "Sigmoid, Tanh, Tanh" : gru ? "Sigmoid, Tanh" : "Tanh") + "): " +
               op + "'s function body serves the default activations only";
    }
    if (n.has_attr("clip")) return "attribute 'clip' is set: " + op + "'s function body has no clip";
    if (n.attr_int("layout", 0) != 0) return "attribute 'layout' is 1: " + op + "'s function body serves layout 0 only";
    if (!n.has_attr("hidden_size"))
      return "attribute 'hidden_size' is not set (" + op + "'s function body reruns the forward op with it)";
    if (gru && !n.has_attr("linear_before_reset"))
      return "attribute 'linear_before_reset' is not set (GRUGrad's function body reads it; the GRU rule writes it)";
    const auto given = [&](size_t i) { return i < n.inputs.size() && !n.inputs[i].empty(); };
    if (given(4))
      return "input 'sequence_lens' is given: " + op + "'s function body serves full-length sequences only";
    if ((gru || lstm) && !given(3))
      return "B is absent (" + op + "'s function body needs it; the rule passes zeros)";
    if (lstm) {
      if (n.attr_int("input_forget", 0) != 0)
        return "attribute 'input_forget' is 1: LSTMGrad's function body serves input_forget 0 only";
      if (given(7)) return "input 'P' (peepholes) is given: LSTMGrad's function body has no peepholes";
      if (!given(5) || !given(6) || !given(8) || !given(9) || !given(10))
        return "initial_h, initial_c, dY, dY_h or dY_c is absent (LSTMGrad's function body needs them; the rule "
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
