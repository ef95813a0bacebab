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
// Why not standard ONNX: expressing BPTT in ONNX ops needs either a static unroll (only when seq_length is
// known, and O(S) nodes) or a reverse Loop/Scan carrying dH, dC and the weight-gradient accumulators. The project
// rule is that fused gradient ops also carry a standard-ONNX function body (gradients/fused.h). These three do
// NOT have one yet: a Loop-based body is the honest form and is left as follow-up work, so a gradient graph
// exported with them (TrainingSession::export_gradient_model) runs in onnxtrain but not in another runtime.
// They are therefore not listed in fused_grad_uses(), which promises a body.
//
// Correctness conditions the kernel implements: every direction (bidirectional sums dX over both), sequence_lens
// (steps past a batch entry's length contribute nothing; Y is zero there and Y_h is the last active step's
// state), clip (zero gradient where a pre-activation was clipped), peepholes and input_forget (LSTM),
// linear_before_reset (GRU), layout, and the activation functions of the forward kernel.
#include "gradients/fused.h"
#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

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
  std::vector<Expr> g = apply_n(c.builder(), grad_op, ins, types, c.node().attributes, kFusedGradDomain);
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
