// schema_differentiable_ops (gradients/rule.h), which docs/ops.md's coverage line counts, reads the ONNX schemas:
// ops with a differentiable input are in, comparisons and shape queries are out, and deprecated ops are out.
#include <gtest/gtest.h>
#include <onnx/defs/schema.h>

#include <algorithm>

#include "gradients/rule.h"

namespace onnxtrain {
namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); }

TEST(GradientCoverage, SchemaDifferentiableOpsComeFromTheOnnxSchemas) {
  int64_t opset = 0;
  const std::vector<std::string> ops = schema_differentiable_ops(&opset);
  EXPECT_GE(opset, 21);  // ONNX 1.16 knows opset 21
  EXPECT_TRUE(std::is_sorted(ops.begin(), ops.end()));
  for (const char* op : {"MatMul", "Conv", "Softmax", "LSTM", "GridSample", "Hardmax"}) EXPECT_TRUE(contains(ops, op)) << op;
  // No differentiable input: a boolean output, a shape, an index; Upsample is deprecated (Resize replaced it).
  for (const char* op : {"Equal", "Shape", "ArgMax", "Upsample", "NonZero"}) EXPECT_FALSE(contains(ops, op)) << op;
}

TEST(GradientCoverage, EveryRuleOfAnOnnxOpIsForAnOpTheSchemasKnow) {
  // A rule under a misspelt name would count nothing. (Some ops with rules carry no differentiability tags in
  // their schema, LayerNormalization among them: they count beside the coverage line, not in it.)
  int64_t opset = 0;
  schema_differentiable_ops(&opset);
  for (const auto& [domain, op] : default_rules().ops())
    if (domain.empty()) {
      EXPECT_NE(onnx::OpSchemaRegistry::Schema(op, static_cast<int>(opset), ""), nullptr) << op;
    }
}

// Issue 24's "done means": every op the schemas tag differentiable has a rule, or a stated zero gradient. A newer
// ONNX with a new differentiable op fails here, naming it, until it gets a rule.
TEST(GradientCoverage, EverySchemaDifferentiableOpHasARuleOrAStatedZero) {
  for (const std::string& op : schema_differentiable_ops())
    EXPECT_TRUE(default_rules().find("", op) || is_non_differentiable_op("", op)) << op << " has no gradient rule";
  // Control flow carries no differentiability tags in its schemas but is differentiated.
  for (const char* op : {"If", "Loop", "Scan"}) EXPECT_NE(default_rules().find("", op), nullptr) << op;
}

}  // namespace
}  // namespace onnxtrain
