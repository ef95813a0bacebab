// A fused op's standard-ONNX body travels with a model as a model-local function, which must import the model's
// ai.onnx opset. These tests pin which opsets each body is valid at (by the ONNX checker itself,
// function_error_at_opset), so that a checkpoint or gradient graph never carries a body its opset rejects.
#include <gtest/gtest.h>

#include "gradients/fused.h"
#include "graph/validate.h"

namespace onnxtrain {
namespace {

// Every body is written against opset 17; models exported today import 17 to 21 (torch's dynamo exporter writes
// 18), and each of those must be able to carry every body.
TEST(FusedOpsets, EveryBodyIsValidFromOpset17To21) {
  for (const Function& f : fused_grad_functions())
    for (int64_t opset = 17; opset <= 21; ++opset) EXPECT_EQ(function_error_at_opset(f, opset), "") << f.name << " at opset " << opset;
}

// The check can fail, and names the op: ReluGrad's body casts its zero with CastLike, which opset 15 introduced.
TEST(FusedOpsets, ABodyNeedingALaterOpsetIsNamed) {
  for (const Function& f : fused_grad_functions()) {
    if (f.name != "ReluGrad") continue;
    const std::string at13 = function_error_at_opset(f, 13);
    EXPECT_NE(at13.find("CastLike"), std::string::npos) << at13;
    EXPECT_EQ(function_error_at_opset(f, 15), "");
    return;
  }
  FAIL() << "no ReluGrad body";
}

}  // namespace
}  // namespace onnxtrain
