// Standard-ONNX body of onnxtrain.RNNGrad (native kernel: executor/cpu/recurrent.cpp; the design is in
// gradients/rules/recurrent.cpp). The body serves the common case only: one forward direction, the default
// activation (Tanh), no clip, layout 0, no sequence_lens, and initial_h, Y and Y_h present (the rule passes
// zeros for an absent initial_h and for the incoming gradient of an output nobody reads).
// rnn_body_refusal() names what a node has outside that case; TrainingSession::export_gradient_model refuses
// such a node rather than export a body that would compute something else.
//
// The body reruns the forward RNN (the standard op, with the caller's hidden_size) for the states h_t, then
// runs backpropagation through time as a reverse Scan carrying dH (R rides along as a second state, so the
// Scan body reads nothing from the enclosing scope) and emitting da_t = (dY_t + dH) * (1 - h_t^2); dH becomes
// da_t R. The weight gradients come after the Scan from the stacked da: dW = da^T X, dR = da^T h_{t-1},
// dB = (sum da, sum da), dX = da W, d initial_h the final dH. The Scan and the products run in float64 (cast
// in and out), so its body has one concrete type whatever the caller's, as ONNX requires of a graph's inputs.
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

Function rnn_grad() {
  Function f = fused_body::function(
      "RNNGrad", {"X", "W", "R", "B", "sequence_lens", "initial_h", "dY", "dY_h"},
      {"dX", "dW", "dR", "dB", "dsequence_lens", "dinitial_h"},
      "Gradient of RNN (one forward direction, Tanh, no clip, layout 0, no sequence_lens; initial_h, dY and dY_h "
      "given) with respect to X, W, R, B and initial_h: the forward RNN rerun for the states, then a reverse "
      "Scan carrying dH in float64 that emits da_t = (dY_t + dH) (1 - h_t^2), dH <- da_t R; the weight "
      "gradients are products of the stacked da.",
      {"hidden_size"});
  // Forward states Y [S, 1, B, H].
  Node rnn = fused_body::op("rnn", "RNN", {"X", "W", "R", "B", "sequence_lens", "initial_h"}, "Y_all");
  rnn.attribute_refs["hidden_size"] = {"hidden_size", fused_body::kInt};
  f.nodes.push_back(std::move(rnn));
  int64s(f, "ax0", {0});
  int64s(f, "ax1", {1});
  const auto dbl = [&](const std::string& in, const std::string& out) {
    return add(f, "Cast", {in}, out, {{"to", kDouble}});
  };
  dbl(add(f, "Squeeze", {"Y_all", "ax1"}, "y3"), "y_d");         // [S, B, H]
  dbl(add(f, "Squeeze", {"dY", "ax1"}, "dy3"), "dy_d");          // [S, B, H]
  dbl(add(f, "Squeeze", {"dY_h", "ax0"}, "dyh2"), "dyh_d");      // [B, H]
  dbl(add(f, "Squeeze", {"R", "ax0"}, "r2"), "r_d");             // [H, H]
  dbl(add(f, "Squeeze", {"W", "ax0"}, "w2"), "w_d");             // [H, I]
  dbl(add(f, "Squeeze", {"initial_h", "ax0"}, "h02"), "h0_d");   // [B, H]
  dbl("X", "x_d");                                               // [S, B, I]

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
  const auto out = [&](const std::string& v, const std::string& name, bool unsqueeze) {
    const std::string cast = add(f, "CastLike", {v, "X"}, name + (unsqueeze ? "_2" : ""));
    if (unsqueeze) add(f, "Unsqueeze", {cast, "ax0"}, name);
  };
  out("dx_d", "dX", false);
  out("dw_d", "dW", true);
  out("dr_d", "dR", true);
  out("db_d", "dB", true);
  out("dh0_d", "dinitial_h", true);
  add(f, "Constant", {}, "dsequence_lens", {{"value", TensorData::from<int64_t>({0}, std::span<const int64_t>())}});
  return f;
}

}  // namespace

std::string fused_body_refusal(const Node& n) {
  if (n.domain != kFusedGradDomain) return "";
  if (n.op_type == "RNNGrad") {
    const std::string direction = n.attr_string("direction", "forward");
    if (direction != "forward")
      return "attribute 'direction' is '" + direction + "': RNNGrad's function body serves direction 'forward' "
             "only (the native kernel serves every direction)";
    if (n.has_attr("activations")) {
      const auto acts = std::get<std::vector<std::string>>(n.attributes.at("activations"));
      if (acts.size() != 1 || (acts[0] != "Tanh" && acts[0] != "tanh"))
        return "attribute 'activations' is not ['Tanh']: RNNGrad's function body serves the default activation only";
    }
    if (n.has_attr("clip")) return "attribute 'clip' is set: RNNGrad's function body has no clip";
    if (n.attr_int("layout", 0) != 0) return "attribute 'layout' is 1: RNNGrad's function body serves layout 0 only";
    if (!n.has_attr("hidden_size")) return "attribute 'hidden_size' is not set (RNNGrad's function body reruns RNN with it)";
    const auto given = [&](size_t i) { return i < n.inputs.size() && !n.inputs[i].empty(); };
    if (given(4)) return "input 'sequence_lens' is given: RNNGrad's function body serves full-length sequences only";
    if (!given(5) || !given(6) || !given(7))
      return "initial_h, dY or dY_h is absent (RNNGrad's function body needs all three; the rule passes zeros)";
  }
  if (n.op_type == "GridSampleGrad" && (!n.has_attr("interpolation") || !n.has_attr("padding") ||
                                       !n.has_attr("align_corners")))
    return "attributes 'interpolation', 'padding' and 'align_corners' are not all set (GridSampleGrad's function body reads them; the "
           "GridSample rule writes them)";
  if (n.op_type == "MaxRoiPoolGrad" && (!n.has_attr("pooled_shape") || !n.has_attr("spatial_scale")))
    return "attributes 'pooled_shape' and 'spatial_scale' must both be set (MaxRoiPoolGrad's function body reads them)";
  return "";
}

std::vector<Function> fused_recurrent_functions() { return {rnn_grad()}; }

}  // namespace onnxtrain
