// Hostile models that ONNX's shape inference does not crash on (so its isolation in a child process does not
// stop them) must still give an Error, not a crash, in our own code downstream (the fuzz_gradients path).
#include <gtest/gtest.h>

#include "gradients/builder.h"
#include "graph/graph_test_util.h"
#include "graph/model_io.h"

namespace onnxtrain {
namespace {

using test::expect_error;

// x (a trainable [1, 2, 4, 4] initializer) -> GroupNormalization -> AveragePool with a zero stride -> y.
// ONNX 1.16 has no inference function for GroupNormalization, so it never sees MaxPool's input shape and
// never divides by the stride; infer_shapes then types the GroupNormalization output itself (infer_missing),
// and the AveragePool gradient rule, which computes the window geometry, gets a known shape and a zero stride.
Model group_norm_then_pool(std::vector<int64_t> strides) {
  Model m;
  m.opset_imports[""] = 18;
  m.graph.name = "g";
  auto tensor = [](std::vector<int64_t> dims, float v) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    std::vector<float> values(static_cast<size_t>(n), v);
    return TensorData::from<float>(dims, std::span<const float>(values));
  };
  m.graph.initializers["x"] = tensor({1, 2, 4, 4}, 0.5f);
  m.graph.initializers["scale"] = tensor({1}, 1.f);
  m.graph.initializers["bias"] = tensor({1}, 0.f);
  Node gn;
  gn.name = "gn";
  gn.op_type = "GroupNormalization";
  gn.inputs = {"x", "scale", "bias"};
  gn.outputs = {"g"};
  gn.attributes["num_groups"] = int64_t{1};
  m.graph.nodes.push_back(gn);
  Node p;
  p.name = "pool";
  p.op_type = "AveragePool";
  p.inputs = {"g"};
  p.outputs = {"y"};
  p.attributes["kernel_shape"] = std::vector<int64_t>{2, 2};
  p.attributes["strides"] = std::move(strides);
  m.graph.nodes.push_back(p);
  m.graph.outputs.push_back({"y", {DType::Float32, Shape{Dim::of(1), Dim::of(2), Dim::sym("h"), Dim::sym("w")}}});
  return m;
}

TEST(IsolatedInference, ZeroStrideOnlyOurGradientRuleSees) {
  for (auto strides : {std::vector<int64_t>{2, 2}, std::vector<int64_t>{0, 1}, std::vector<int64_t>{2, -1}}) {
    Model m = load_model_from_bytes(serialize_model(group_norm_then_pool(strides)), "pool.onnx");
    ASSERT_TRUE(m.graph.type_of("g") && m.graph.type_of("g")->shape) << "the rule needs g's shape";
    GradientRequest req;
    req.emit_yield = true;
    req.wrt = {"x"};
    req.outputs = {"y"};
    if (strides[0] == 2 && strides[1] == 2) {
      EXPECT_NO_THROW(build_gradients(m.graph, m.opset_imports, req));
      continue;
    }
    expect_error([&] { build_gradients(m.graph, m.opset_imports, req); },
                 {"node 'pool' (AveragePool)", "strides", "expected every value >= 1"});
  }
}

}  // namespace
}  // namespace onnxtrain
