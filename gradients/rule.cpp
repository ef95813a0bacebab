#include "gradients/rule.h"

#include <onnx/defs/schema.h>

#include <algorithm>
#include <set>

#include "graph/error.h"

namespace onnxtrain {

RuleContext::RuleContext(GraphBuilder& b, const Node& node, int64_t opset, std::vector<Expr> x, std::vector<Expr> y,
                         std::vector<Expr> dy, std::vector<bool> needs)
    : b_(b),
      node_(node),
      opset_(opset),
      x_(std::move(x)),
      y_(std::move(y)),
      dy_(std::move(dy)),
      needs_(std::move(needs)),
      dx_(node.inputs.size()) {}

Expr RuleContext::X(size_t i) const {
  if (i >= x_.size() || !x_[i].valid())
    fail("input " + std::to_string(i) + " is absent or has no known type, but the gradient needs it");
  if (std::find(reads_.begin(), reads_.end(), x_[i].name) == reads_.end()) reads_.push_back(x_[i].name);
  return x_[i];
}

Expr RuleContext::Y(size_t i) const {
  if (i >= y_.size() || !y_[i].valid())
    fail("output " + std::to_string(i) + " is absent or has no known type, but the gradient needs it");
  if (std::find(reads_.begin(), reads_.end(), y_[i].name) == reads_.end()) reads_.push_back(y_[i].name);
  return y_[i];
}

Expr RuleContext::dY(size_t i) const {
  if (i >= dy_.size() || !dy_[i].valid()) fail("no incoming gradient for output " + std::to_string(i));
  return dy_[i];
}

void RuleContext::set_dX(size_t i, Expr g) {
  if (!needs_dX(i)) return;
  if (i >= dx_.size()) fail("gradient set for input " + std::to_string(i) + ", but the node has " +
                            std::to_string(dx_.size()) + " inputs");
  if (!g.valid()) fail("the gradient of input " + std::to_string(i) + " is an empty Expr");
  dx_[i] = std::move(g);
}

void RuleContext::fail(const std::string& what) const { onnxtrain::fail("gradient of " + node_.describe(), what); }

void GradientRegistry::add(const std::string& op_type, GradientRule rule, const std::string& domain) {
  const std::string d = domain == "ai.onnx" ? std::string() : domain;
  if (!rules_.emplace(std::make_pair(d, op_type), std::move(rule)).second)
    onnxtrain::fail("GradientRegistry", "a rule for " + (d.empty() ? op_type : d + "." + op_type) +
                                            " is already registered");
}

const GradientRule* GradientRegistry::find(const std::string& domain, const std::string& op_type) const {
  const std::string d = domain == "ai.onnx" ? std::string() : domain;
  auto it = rules_.find({d, op_type});
  return it == rules_.end() ? nullptr : &it->second;
}

std::vector<std::pair<std::string, std::string>> GradientRegistry::ops() const {
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(rules_.size());
  for (const auto& [key, rule] : rules_) out.push_back(key);
  return out;
}

const GradientRegistry& default_rules() {
  // Built on first use, from explicit calls rather than static self-registration (linkers may drop that).
  static const GradientRegistry registry = [] {
    GradientRegistry r;
    register_elementwise_rules(r);
    register_activation_rules(r);
    register_softmax_rules(r);
    register_matmul_rules(r);
    register_reduce_rules(r);
    register_shape_rules(r);
    register_index_rules(r);
    register_norm_rules(r);
    register_conv_rules(r);
    register_pool_rules(r);
    register_unary_rules(r);
    register_dropout_rules(r);
    register_einsum_rules(r);
    register_loss_rules(r);
    register_resize_rules(r);
    register_recurrent_rules(r);
    register_spatial_rules(r);
    register_control_flow_rules(r);
    register_linalg_rules(r);
    return r;
  }();
  return registry;
}

bool is_non_differentiable_op(const std::string& domain, const std::string& op_type) {
  if (!domain.empty() && domain != "ai.onnx") return false;
  // Outputs that are booleans, integers derived from shapes or indices, random samples, or piecewise
  // constant functions (whose derivative is zero almost everywhere).
  static const std::set<std::string> ops = {
      "Equal",       "Less",         "LessOrEqual",  "Greater",       "GreaterOrEqual", "Not",
      "And",         "Or",           "Xor",          "IsNaN",         "IsInf",          "Shape",
      "Size",        "ArgMax",       "ArgMin",       "NonZero",       "Constant",       "ConstantOfShape",
      "EyeLike",     "Range",        "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
      "Bernoulli",   "Multinomial",  "Sign",         "Floor",         "Ceil",           "Round",
      "BitShift",    "BitwiseAnd",   "BitwiseOr",    "BitwiseXor",    "BitwiseNot",     "NonMaxSuppression",
      "Hardmax",  // a one-hot of the argmax
  };
  return ops.count(op_type) != 0;
}

std::vector<std::string> schema_differentiable_ops(int64_t* opset) {
  const auto& ranges = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  const int64_t newest = ranges.at(onnx::ONNX_DOMAIN).second;
  if (opset) *opset = newest;
  std::set<std::string> names;
  for (const onnx::OpSchema& s : onnx::OpSchemaRegistry::get_all_schemas_with_history())
    if (s.domain() == onnx::ONNX_DOMAIN && s.SinceVersion() <= newest) names.insert(s.Name());
  std::vector<std::string> out;
  for (const std::string& name : names) {
    const onnx::OpSchema* s = onnx::OpSchemaRegistry::Schema(name, static_cast<int>(newest), onnx::ONNX_DOMAIN);
    if (!s || s->Deprecated()) continue;
    const auto& in = s->inputs();
    if (std::any_of(in.begin(), in.end(), [](const onnx::OpSchema::FormalParameter& p) {
          return p.GetDifferentiationCategory() == onnx::OpSchema::Differentiable;
        }))
      out.push_back(name);
  }
  return out;
}

}  // namespace onnxtrain
