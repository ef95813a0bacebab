// Function bodies that take attributes from their caller (ONNX ref_attr_name), which MaxPoolGrad's body needs:
// the reference survives a proto round trip, and inlining substitutes the caller's value or leaves it out.
#include <gtest/gtest.h>

#include "graph/inline.h"
#include "graph/proto.h"

namespace onnxtrain {
namespace {

Function pool_function() {
  Function f;
  f.name = "Pool";
  f.domain = "test";
  f.inputs = {"X"};
  f.outputs = {"Y"};
  f.attributes = {"kernel_shape", "strides"};
  f.opset_imports[""] = 17;
  Node n;
  n.op_type = "MaxPool";
  n.inputs = {"X"};
  n.outputs = {"Y"};
  n.attribute_refs["kernel_shape"] = {"kernel_shape", 7};
  n.attribute_refs["strides"] = {"strides", 7};
  n.attributes["ceil_mode"] = int64_t{1};
  f.nodes.push_back(n);
  return f;
}

TEST(AttributeRefs, SurviveAProtoRoundTrip) {
  Model m;
  m.opset_imports = {{"", 17}, {"test", 1}};
  m.functions.push_back(pool_function());
  const onnx::ModelProto p = to_proto(m);
  const auto& a = p.functions(0).node(0).attribute();
  int refs = 0;
  for (const auto& at : a)
    if (!at.ref_attr_name().empty()) {
      ++refs;
      EXPECT_EQ(at.ref_attr_name(), at.name());
      EXPECT_EQ(at.type(), onnx::AttributeProto::INTS);
    }
  EXPECT_EQ(refs, 2);
  const Model back = from_proto(p);
  ASSERT_EQ(back.functions.size(), 1u);
  EXPECT_EQ(back.functions[0].nodes[0].attribute_refs, m.functions[0].nodes[0].attribute_refs);
  EXPECT_EQ(back.functions[0].nodes[0].attributes.size(), 1u);  // ceil_mode, a plain attribute
}

TEST(AttributeRefs, InliningTakesTheCallersValuesAndOmitsTheRest) {
  Graph g;
  Node call;
  call.name = "call";
  call.op_type = "Pool";
  call.domain = "test";
  call.inputs = {"x"};
  call.outputs = {"y"};
  call.attributes["kernel_shape"] = std::vector<int64_t>{2, 2};  // no strides: the body's MaxPool gets none
  g.nodes.push_back(call);
  inline_functions(g, {pool_function()});
  ASSERT_EQ(g.nodes.size(), 1u);
  const Node& n = g.nodes[0];
  EXPECT_EQ(n.op_type, "MaxPool");
  EXPECT_TRUE(n.attribute_refs.empty());
  EXPECT_EQ(n.attr_ints("kernel_shape"), (std::vector<int64_t>{2, 2}));
  EXPECT_FALSE(n.has_attr("strides"));
  EXPECT_EQ(n.attr_int("ceil_mode", 0), 1);
}

}  // namespace
}  // namespace onnxtrain
