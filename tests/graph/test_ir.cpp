// The IR's small helpers: dtypes, TensorData, attribute accessors, node descriptions, type lookup.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "graph/error.h"
#include "graph/graph_test_util.h"
#include "graph/ir.h"

namespace onnxtrain {
namespace {

using test::expect_error;

template <class T>
T scalar_value(const TensorData& d) {
  EXPECT_EQ(d.bytes.size(), sizeof(T));
  T v{};
  std::memcpy(&v, d.bytes.data(), sizeof(T));
  return v;
}

TEST(DType, SizesNamesAndFloatingKinds) {
  EXPECT_EQ(dtype_size(DType::Float32), 4u);
  EXPECT_EQ(dtype_size(DType::Float64), 8u);
  EXPECT_EQ(dtype_size(DType::BFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::Bool), 1u);
  EXPECT_EQ(dtype_size(DType::UInt64), 8u);
  EXPECT_EQ(dtype_size(DType::String), 0u);
  EXPECT_EQ(dtype_name(DType::Int64), "int64");
  EXPECT_EQ(dtype_name(DType::Float16), "float16");
  EXPECT_TRUE(is_floating(DType::BFloat16));
  EXPECT_TRUE(is_floating(DType::Float64));
  EXPECT_FALSE(is_floating(DType::Int32));
  EXPECT_FALSE(is_floating(DType::Bool));
}

TEST(Shape, ToStringShowsValuesSymbolsAndUnknowns) {
  EXPECT_EQ(to_string(Shape{Dim::sym("batch"), Dim::of(64), Dim{}}), "[batch, 64, ?]");
  EXPECT_EQ(to_string(Shape{}), "[]");
}

TEST(TensorData, FromScalarAndNumel) {
  std::vector<int64_t> v{1, 2, 3, 4, 5, 6};
  auto t = TensorData::from<int64_t>({2, 3}, v);
  EXPECT_EQ(t.dtype, DType::Int64);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.bytes.size(), 48u);
  EXPECT_EQ(t.as<int64_t>()[4], 5);

  auto s = TensorData::scalar<float>(2.5f);
  EXPECT_TRUE(s.dims.empty());
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.as<float>()[0], 2.5f);

  auto b = TensorData::scalar<bool>(true);
  EXPECT_EQ(b.dtype, DType::Bool);
  EXPECT_EQ(b.bytes.size(), 1u);

  auto empty = TensorData::from<float>({0, 3}, std::span<const float>());
  EXPECT_EQ(empty.numel(), 0);

  std::vector<float> three{1, 2, 3};
  expect_error([&] { TensorData::from<float>({2, 2}, three); }, {"[2, 2]", "4", "3 values"});
}

TEST(TensorData, ScalarAsConvertsToEveryNumericType) {
  EXPECT_EQ(scalar_value<float>(TensorData::scalar_as(DType::Float32, 0.1)), 0.1f);
  EXPECT_EQ(scalar_value<double>(TensorData::scalar_as(DType::Float64, 0.1)), 0.1);
  EXPECT_EQ(scalar_value<int64_t>(TensorData::scalar_as(DType::Int64, -3.0)), -3);
  EXPECT_EQ(scalar_value<int32_t>(TensorData::scalar_as(DType::Int32, 7.0)), 7);
  EXPECT_EQ(scalar_value<int8_t>(TensorData::scalar_as(DType::Int8, -128.0)), -128);
  EXPECT_EQ(scalar_value<uint8_t>(TensorData::scalar_as(DType::UInt8, 255.0)), 255);
  EXPECT_EQ(scalar_value<uint8_t>(TensorData::scalar_as(DType::Bool, 0.5)), 1);
  EXPECT_EQ(scalar_value<uint8_t>(TensorData::scalar_as(DType::Bool, 0.0)), 0);
  EXPECT_EQ(TensorData::scalar_as(DType::UInt16, 3).dtype, DType::UInt16);

  // IEEE half: 1.5 = 0 01111 1000000000; the largest finite is 65504; below 2^-24 rounds to even.
  EXPECT_EQ(scalar_value<uint16_t>(TensorData::scalar_as(DType::Float16, 1.5)), 0x3E00);
  EXPECT_EQ(scalar_value<uint16_t>(TensorData::scalar_as(DType::Float16, -2.0)), 0xC000);
  EXPECT_EQ(scalar_value<uint16_t>(TensorData::scalar_as(DType::Float16, 65504.0)), 0x7BFF);
  EXPECT_EQ(scalar_value<uint16_t>(TensorData::scalar_as(DType::Float16, 1e6)), 0x7C00);
  EXPECT_EQ(scalar_value<uint16_t>(TensorData::scalar_as(DType::Float16, std::ldexp(1.0, -24))), 0x0001);
  EXPECT_EQ(scalar_value<uint16_t>(TensorData::scalar_as(DType::Float16, std::ldexp(1.0, -25))), 0x0000);
  EXPECT_EQ(scalar_value<uint16_t>(TensorData::scalar_as(DType::Float16, std::ldexp(1.5, -24))), 0x0002);
  // bfloat16 keeps float's top 16 bits, rounding to nearest even.
  EXPECT_EQ(scalar_value<uint16_t>(TensorData::scalar_as(DType::BFloat16, 1.5)), 0x3FC0);
  EXPECT_EQ(scalar_value<uint16_t>(TensorData::scalar_as(DType::BFloat16, 1.0 + 1.0 / 256)), 0x3F80);
  EXPECT_EQ(scalar_value<uint16_t>(TensorData::scalar_as(DType::BFloat16, 1.0 + 3.0 / 256)), 0x3F82);

  expect_error([] { TensorData::scalar_as(DType::UInt8, 256.0); }, {"uint8"});
  expect_error([] { TensorData::scalar_as(DType::Int32, std::nan("")); }, {"int32"});
  expect_error([] { TensorData::scalar_as(DType::String, 1.0); }, {"string"});
}

TEST(Node, AttributeAccessorsAndDescribe) {
  Node n;
  n.name = "fc1/Gemm";
  n.op_type = "Gemm";
  n.outputs = {"h"};
  n.attributes["alpha"] = 0.5f;
  n.attributes["transB"] = int64_t{1};
  n.attributes["mode"] = std::string("constant");
  n.attributes["perm"] = std::vector<int64_t>{1, 0};
  n.attributes["value"] = TensorData::scalar<float>(1.0f);
  EXPECT_EQ(n.attr_int("transB", 0), 1);
  EXPECT_EQ(n.attr_int("transA", 0), 0);
  EXPECT_EQ(n.attr_float("alpha", 1.0f), 0.5f);
  EXPECT_EQ(n.attr_float("beta", 1.0f), 1.0f);
  EXPECT_EQ(n.attr_string("mode", "reflect"), "constant");
  EXPECT_EQ(n.attr_ints("perm"), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(n.attr_ints("axes", {7}), (std::vector<int64_t>{7}));
  ASSERT_NE(n.attr_tensor("value"), nullptr);
  EXPECT_EQ(n.attr_tensor("other"), nullptr);
  EXPECT_EQ(n.describe(), "node 'fc1/Gemm' (Gemm)");
  expect_error([&] { n.attr_int("alpha", 0); }, {"node 'fc1/Gemm' (Gemm)", "'alpha'", "float", "expected int"});
  expect_error([&] { n.attr_tensor("perm"); }, {"'perm'", "ints", "expected tensor"});

  Node unnamed;
  unnamed.op_type = "Yield";
  unnamed.domain = "onnxtrain";
  unnamed.outputs = {"", "g0"};
  EXPECT_EQ(unnamed.describe(), "node 'g0' (onnxtrain.Yield)");
}

TEST(Model, OpsetTreatsEmptyAndAiOnnxAlike) {
  Model m;
  m.opset_imports[""] = 17;
  m.opset_imports["onnxtrain"] = 1;
  EXPECT_EQ(m.opset(""), 17);
  EXPECT_EQ(m.opset("ai.onnx"), 17);
  EXPECT_EQ(m.opset("onnxtrain"), 1);
  EXPECT_EQ(m.opset("com.microsoft"), 0);
  Model n;
  n.opset_imports["ai.onnx"] = 21;
  EXPECT_EQ(n.opset(""), 21);

  Function f;
  f.name = "ReluGrad";
  f.domain = "onnxtrain";
  m.functions.push_back(f);
  EXPECT_NE(m.find_function("onnxtrain", "ReluGrad"), nullptr);
  EXPECT_EQ(m.find_function("", "ReluGrad"), nullptr);
  EXPECT_EQ(m.find_function("onnxtrain", "Other"), nullptr);
}

TEST(Graph, TypeOfPrefersTheMostSpecificDeclaration) {
  Graph g;
  g.inputs.push_back({"x", {DType::Float32, Shape{Dim::sym("batch"), Dim::of(3)}}});
  g.outputs.push_back({"y", {DType::Float32, std::nullopt}});
  g.initializers["w"] = TensorData::from<double>({3, 2}, std::vector<double>(6, 1.0));
  g.value_info["h"] = {DType::Int64, Shape{Dim::of(5)}};
  g.value_info["y"] = {DType::Float32, Shape{Dim::sym("batch"), Dim::of(2)}};

  ASSERT_NE(g.type_of("x"), nullptr);
  EXPECT_EQ(g.type_of("x")->shape->at(0).symbol, "batch");
  const TypeInfo* w = g.type_of("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::Float64);
  EXPECT_EQ(*w->shape, (Shape{Dim::of(3), Dim::of(2)}));
  EXPECT_EQ(g.type_of("h")->dtype, DType::Int64);
  // The declared output has no shape; the inferred entry does.
  ASSERT_TRUE(g.type_of("y")->shape.has_value());
  EXPECT_EQ(g.type_of("y")->shape->size(), 2u);
  EXPECT_EQ(g.type_of("nothing"), nullptr);
  EXPECT_NE(g.find_input("x"), nullptr);
  EXPECT_EQ(g.find_input("w"), nullptr);
}

}  // namespace
}  // namespace onnxtrain
