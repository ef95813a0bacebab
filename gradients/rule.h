#pragma once
// A gradient rule sees the forward node through RuleContext and emits the input gradients as Exprs:
//   reg.add("Tanh", [](RuleContext& c) { c.set_dX(0, c.dY(0) * (1.0 - c.Y(0) * c.Y(0))); });
// The engine (builder.h) does the shared work: it decides which inputs need gradients, sums gradients of
// values with several consumers, and sums a gradient back to its input's shape after broadcasting, so a
// rule may return a gradient in the broadcast (output) shape.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "graph/expr.h"

namespace onnxtrain {

class RuleContext {
 public:
  RuleContext(GraphBuilder& b, const Node& node, int64_t opset, std::vector<Expr> x, std::vector<Expr> y,
              std::vector<Expr> dy, std::vector<bool> needs);

  Expr X(size_t i) const;   // forward input i
  Expr Y(size_t i) const;   // forward output i
  Expr dY(size_t i) const;  // incoming gradient of output i (zeros when that output is unused)
  bool needs_dX(size_t i) const { return i < needs_.size() && needs_[i]; }
  bool has_input(size_t i) const { return node_.has_input(i); }
  size_t num_inputs() const { return node_.inputs.size(); }
  size_t num_outputs() const { return node_.outputs.size(); }
  const Node& node() const { return node_; }
  int64_t opset() const { return opset_; }
  GraphBuilder& builder() { return b_; }

  void set_dX(size_t i, Expr g);  // ignored when !needs_dX(i)
  const std::vector<std::optional<Expr>>& results() const { return dx_; }
  // Values of the forward graph this rule read (for the memory planner).
  const std::vector<std::string>& reads() const { return reads_; }

  [[noreturn]] void fail(const std::string& what) const;

 private:
  GraphBuilder& b_;
  const Node& node_;
  int64_t opset_;
  std::vector<Expr> x_, y_, dy_;
  std::vector<bool> needs_;
  std::vector<std::optional<Expr>> dx_;
  mutable std::vector<std::string> reads_;
};

using GradientRule = std::function<void(RuleContext&)>;

class GradientRegistry {
 public:
  void add(const std::string& op_type, GradientRule rule, const std::string& domain = {});
  const GradientRule* find(const std::string& domain, const std::string& op_type) const;
  // Every op with a rule, sorted: (domain, op). Tests and docs enumerate this list.
  std::vector<std::pair<std::string, std::string>> ops() const;

 private:
  std::map<std::pair<std::string, std::string>, GradientRule> rules_;
};

// The registry with every built-in rule.
const GradientRegistry& default_rules();

// One per file in gradients/rules/, named by the family as in executor/cpu/ and executor/cuda/ (docs/executor.md).
void register_elementwise_rules(GradientRegistry& r);
void register_activation_rules(GradientRegistry& r);
void register_softmax_rules(GradientRegistry& r);    // Softmax, LogSoftmax
void register_matmul_rules(GradientRegistry& r);
void register_reduce_rules(GradientRegistry& r);
void register_shape_rules(GradientRegistry& r);
void register_index_rules(GradientRegistry& r);     // Gather/ScatterElements, Gather/ScatterND
void register_norm_rules(GradientRegistry& r);
void register_conv_rules(GradientRegistry& r);
void register_pool_rules(GradientRegistry& r);
void register_unary_rules(GradientRegistry& r);    // Clip
void register_dropout_rules(GradientRegistry& r);
void register_einsum_rules(GradientRegistry& r);
void register_loss_rules(GradientRegistry& r);      // NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss
void register_resize_rules(GradientRegistry& r);
void register_recurrent_rules(GradientRegistry& r);  // LSTM, GRU, RNN
void register_spatial_rules(GradientRegistry& r);    // GridSample, Col2Im, MaxRoiPool, MaxUnpool
void register_control_flow_rules(GradientRegistry& r);  // If (Loop, Scan: see the file)
void register_linalg_rules(GradientRegistry& r);     // Det

// The ai.onnx ops whose ONNX schema (the latest version at or below the newest opset the linked ONNX knows)
// is not deprecated and tags an input Differentiable, sorted; `opset` receives that newest opset. docs/ops.md's
// coverage line counts how many of them have a rule or a stated zero gradient, so the number cannot drift.
std::vector<std::string> schema_differentiable_ops(int64_t* opset = nullptr);

// Ops whose outputs never carry a gradient (comparisons, Shape, ...): the engine stops there without a rule.
bool is_non_differentiable_op(const std::string& domain, const std::string& op_type);

}  // namespace onnxtrain
