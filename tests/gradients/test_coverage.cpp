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
    if (domain.empty()) EXPECT_NE(onnx::OpSchemaRegistry::Schema(op, static_cast<int>(opset), ""), nullptr) << op;
}

}  // namespace
}  // namespace onnxtrain
