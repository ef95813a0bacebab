// IR <-> ModelProto conversion: every attribute kind and initializer dtype, symbolic dims, typed data fields,
// external data.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "common/test_env.h"
#include "graph/error.h"
#include "graph/graph_test_util.h"
#include "graph/model_io.h"
#include "graph/proto.h"
#include "graph/validate.h"

namespace onnxtrain {
namespace {

using test::diff;
using test::expect_error;

TensorData raw(DType t, std::vector<int64_t> dims, std::vector<uint8_t> bytes) {
  TensorData d;
  d.dtype = t;
  d.dims = std::move(dims);
  for (auto b : bytes) d.bytes.push_back(std::byte(b));
  return d;
}

// A model touching every feature the conversion must carry.
Model everything_model() {
  Model m;
  m.ir_version = 9;
  m.opset_imports[""] = 18;
  m.opset_imports["onnxtrain"] = 1;
  m.producer_name = "test";
  m.producer_version = "0.1";
  m.domain = "org.test";
  m.model_version = 3;
  m.doc = "doc";
  m.metadata = {{"lr", "0.01"}, {"onnxtrain.version", "0.1.0"}};

  Graph& g = m.graph;
  g.name = "main";
  g.inputs.push_back({"x", {DType::Float32, Shape{Dim::sym("batch"), Dim::of(4), Dim{}}}});
  g.inputs.push_back({"flag", {DType::Bool, Shape{}}});
  g.outputs.push_back({"y", {DType::Float32, Shape{Dim::sym("batch"), Dim::of(4), Dim{}}}});
  g.value_info["h"] = {DType::Float32, Shape{Dim::sym("batch"), Dim::of(4), Dim::sym("seq")}};

  g.initializers["f32"] = TensorData::from<float>({2, 2}, std::vector<float>{1.5f, -2, 3, 4});
  g.initializers["f64"] = TensorData::from<double>({2}, std::vector<double>{1e-300, 2});
  g.initializers["i64"] = TensorData::from<int64_t>({3}, std::vector<int64_t>{-1, 0, INT64_MAX});
  g.initializers["i32"] = TensorData::from<int32_t>({1}, std::vector<int32_t>{-7});
  g.initializers["u8"] = TensorData::from<uint8_t>({2}, std::vector<uint8_t>{0, 255});
  g.initializers["i8"] = TensorData::from<int8_t>({2}, std::vector<int8_t>{-128, 127});
  std::vector<uint8_t> bools{1, 0, 1};
  g.initializers["b"] = raw(DType::Bool, {3}, bools);
  g.initializers["f16"] = raw(DType::Float16, {2}, {0x00, 0x3C, 0x00, 0xC0});
  g.initializers["bf16"] = raw(DType::BFloat16, {1}, {0x80, 0x3F});
  g.initializers["i16"] = raw(DType::Int16, {1}, {0xFF, 0xFF});
  g.initializers["u16"] = raw(DType::UInt16, {1}, {0x34, 0x12});
  g.initializers["u32"] = raw(DType::UInt32, {1}, {1, 2, 3, 4});
  g.initializers["u64"] = raw(DType::UInt64, {1}, {1, 2, 3, 4, 5, 6, 7, 8});
  g.initializers["scalar"] = TensorData::scalar<float>(3.0f);
  g.initializers["empty"] = TensorData::from<float>({0, 2}, std::span<const float>());

  auto then_g = std::make_shared<Graph>();
  then_g->name = "then";
  then_g->outputs.push_back({"t", {DType::Float32, std::nullopt}});
  Node t;
  t.name = "then_relu";
  t.op_type = "Relu";
  t.inputs = {"x"};
  t.outputs = {"t"};
  then_g->nodes.push_back(t);
  auto else_g = std::make_shared<Graph>();
  else_g->name = "else";
  else_g->outputs.push_back({"e", {}});
  Node e = t;
  e.name = "else_neg";
  e.op_type = "Neg";
  e.outputs = {"e"};
  e.attributes["sub"] = then_g;  // nested graph inside a subgraph (not valid ONNX; conversion only)
  else_g->nodes.push_back(e);

  Node n;
  n.name = "all_kinds";
  n.op_type = "AllKinds";
  n.domain = "onnxtrain";
  n.inputs = {"x", "", "f32"};
  n.outputs = {"h", ""};
  n.attributes["i"] = int64_t{-5};
  n.attributes["f"] = 0.25f;
  n.attributes["s"] = std::string("bytes\0inside", 12);
  n.attributes["ints"] = std::vector<int64_t>{1, -2, 3};
  n.attributes["floats"] = std::vector<float>{0.5f, -1.0f};
  n.attributes["strings"] = std::vector<std::string>{"a", "", "c"};
  n.attributes["empty_ints"] = std::vector<int64_t>{};
  n.attributes["t"] = TensorData::from<int64_t>({2}, std::vector<int64_t>{4, 5});
  n.attributes["then_branch"] = then_g;
  n.attributes["else_branch"] = else_g;
  g.nodes.push_back(n);
  Node r;
  r.name = "out";
  r.op_type = "Relu";
  r.inputs = {"h"};
  r.outputs = {"y"};
  g.nodes.push_back(r);

  Function f;
  f.name = "AllKinds";
  f.domain = "onnxtrain";
  f.inputs = {"X"};
  f.outputs = {"Y"};
  f.attributes = {"alpha"};
  f.opset_imports[""] = 18;
  f.doc = "fused";
  Node fn;
  fn.op_type = "Identity";
  fn.inputs = {"X"};
  fn.outputs = {"Y"};
  f.nodes.push_back(fn);
  m.functions.push_back(f);
  return m;
}

TEST(Proto, RoundtripKeepsEveryAttributeKindAndDtype) {
  const Model m = everything_model();
  const onnx::ModelProto p = to_proto(m);
  std::string bytes;
  ASSERT_TRUE(p.SerializeToString(&bytes));
  onnx::ModelProto q;
  ASSERT_TRUE(q.ParseFromString(bytes));
  const Model back = from_proto(q);
  EXPECT_EQ(diff(m, back), "");
  // The comparison must be able to fail: a changed nested attribute is noticed.
  Model changed = back;
  auto sub = std::get<std::shared_ptr<Graph>>(changed.graph.nodes[0].attributes.at("else_branch"));
  auto copy = std::make_shared<Graph>(*sub);
  copy->nodes[0].op_type = "Abs";
  changed.graph.nodes[0].attributes["else_branch"] = copy;
  EXPECT_NE(diff(m, changed), "");
}

TEST(Proto, WritesStandardFields) {
  const onnx::ModelProto p = to_proto(everything_model());
  EXPECT_EQ(p.ir_version(), 9);
  ASSERT_EQ(p.opset_import_size(), 2);
  EXPECT_EQ(p.opset_import(0).domain(), "");
  EXPECT_EQ(p.opset_import(0).version(), 18);
  EXPECT_EQ(p.metadata_props(1).key(), "onnxtrain.version");
  const auto& x = p.graph().input(0).type().tensor_type();
  EXPECT_EQ(x.elem_type(), onnx::TensorProto::FLOAT);
  ASSERT_EQ(x.shape().dim_size(), 3);
  EXPECT_EQ(x.shape().dim(0).dim_param(), "batch");
  EXPECT_EQ(x.shape().dim(1).dim_value(), 4);
  EXPECT_FALSE(x.shape().dim(2).has_dim_value());
  EXPECT_FALSE(x.shape().dim(2).has_dim_param());
  // A scalar input has a shape with no dims, which is different from no shape at all.
  EXPECT_TRUE(p.graph().input(1).type().tensor_type().has_shape());
  EXPECT_EQ(p.graph().input(1).type().tensor_type().shape().dim_size(), 0);

  const auto& node = p.graph().node(0);
  EXPECT_EQ(node.domain(), "onnxtrain");
  EXPECT_EQ(node.input(1), "");
  std::map<std::string, const onnx::AttributeProto*> attrs;
  for (const auto& a : node.attribute()) attrs[a.name()] = &a;
  EXPECT_EQ(attrs.at("i")->type(), onnx::AttributeProto::INT);
  EXPECT_EQ(attrs.at("i")->i(), -5);
  EXPECT_EQ(attrs.at("f")->type(), onnx::AttributeProto::FLOAT);
  EXPECT_EQ(attrs.at("s")->s().size(), 12u);
  EXPECT_EQ(attrs.at("strings")->type(), onnx::AttributeProto::STRINGS);
  EXPECT_EQ(attrs.at("empty_ints")->type(), onnx::AttributeProto::INTS);
  EXPECT_EQ(attrs.at("t")->type(), onnx::AttributeProto::TENSOR);
  EXPECT_EQ(attrs.at("t")->t().data_type(), onnx::TensorProto::INT64);
  EXPECT_EQ(attrs.at("then_branch")->type(), onnx::AttributeProto::GRAPH);
  EXPECT_EQ(attrs.at("then_branch")->g().node(0).op_type(), "Relu");

  for (const auto& t : p.graph().initializer())
    if (t.name() == "f32") {
      EXPECT_EQ(t.data_type(), onnx::TensorProto::FLOAT);
      ASSERT_EQ(t.raw_data().size(), 16u);
      float v;
      std::memcpy(&v, t.raw_data().data(), 4);
      EXPECT_EQ(v, 1.5f);
    }
  ASSERT_EQ(p.functions_size(), 1);
  EXPECT_EQ(p.functions(0).domain(), "onnxtrain");
  EXPECT_EQ(p.functions(0).attribute(0), "alpha");
}

TEST(Proto, ReadsTypedDataFields) {
  onnx::TensorProto t;
  t.set_name("f");
  t.set_data_type(onnx::TensorProto::FLOAT);
  t.add_dims(2);
  t.add_float_data(1.25f);
  t.add_float_data(-3.0f);
  auto f = tensor_from_proto(t);
  EXPECT_EQ(f.dtype, DType::Float32);
  EXPECT_EQ(f.as<float>()[0], 1.25f);
  EXPECT_EQ(f.as<float>()[1], -3.0f);

  onnx::TensorProto l;
  l.set_data_type(onnx::TensorProto::INT64);
  l.add_int64_data(-9);
  EXPECT_EQ(tensor_from_proto(l).as<int64_t>()[0], -9);  // no dims: a scalar

  onnx::TensorProto d;
  d.set_data_type(onnx::TensorProto::DOUBLE);
  d.add_dims(1);
  d.add_double_data(0.1);
  EXPECT_EQ(tensor_from_proto(d).as<double>()[0], 0.1);

  onnx::TensorProto i;
  i.set_data_type(onnx::TensorProto::INT32);
  i.add_dims(1);
  i.add_int32_data(-100000);
  EXPECT_EQ(tensor_from_proto(i).as<int32_t>()[0], -100000);

  // bool, int8, uint8, float16 live in int32_data, one element per entry.
  onnx::TensorProto b;
  b.set_data_type(onnx::TensorProto::BOOL);
  b.add_dims(3);
  for (int v : {1, 0, 1}) b.add_int32_data(v);
  auto bd = tensor_from_proto(b);
  ASSERT_EQ(bd.bytes.size(), 3u);
  EXPECT_EQ(bd.as<uint8_t>()[0], 1);
  EXPECT_EQ(bd.as<uint8_t>()[1], 0);

  onnx::TensorProto i8;
  i8.set_data_type(onnx::TensorProto::INT8);
  i8.add_dims(2);
  i8.add_int32_data(-5);
  i8.add_int32_data(100);
  EXPECT_EQ(tensor_from_proto(i8).as<int8_t>()[0], -5);
  EXPECT_EQ(tensor_from_proto(i8).as<int8_t>()[1], 100);

  onnx::TensorProto u8;
  u8.set_data_type(onnx::TensorProto::UINT8);
  u8.add_dims(1);
  u8.add_int32_data(200);
  EXPECT_EQ(tensor_from_proto(u8).as<uint8_t>()[0], 200);

  onnx::TensorProto h;
  h.set_data_type(onnx::TensorProto::FLOAT16);
  h.add_dims(1);
  h.add_int32_data(0x3C00);
  EXPECT_EQ(tensor_from_proto(h).as<uint16_t>()[0], 0x3C00);

  onnx::TensorProto u64;
  u64.set_data_type(onnx::TensorProto::UINT64);
  u64.add_dims(1);
  u64.add_uint64_data(UINT64_MAX);
  EXPECT_EQ(tensor_from_proto(u64).as<uint64_t>()[0], UINT64_MAX);
}

TEST(Proto, RejectsInconsistentTensors) {
  onnx::TensorProto t;
  t.set_name("w");
  t.set_data_type(onnx::TensorProto::FLOAT);
  t.add_dims(3);
  t.add_float_data(1);
  expect_error([&] { tensor_from_proto(t); }, {"tensor 'w'", "float_data", "1 values", "[3]"});
  t.clear_float_data();
  t.set_raw_data(std::string(8, '\0'));
  expect_error([&] { tensor_from_proto(t); }, {"tensor 'w'", "raw_data", "8 bytes", "12"});
  onnx::TensorProto s;
  s.set_name("names");
  s.set_data_type(onnx::TensorProto::STRING);
  expect_error([&] { tensor_from_proto(s); }, {"tensor 'names'", "STRING", "not supported"});
  onnx::TensorProto c;
  c.set_name("z");
  c.set_data_type(onnx::TensorProto::COMPLEX64);
  expect_error([&] { tensor_from_proto(c); }, {"tensor 'z'", "COMPLEX64"});
}

TEST(Proto, RejectsSparseInitializersAndUnsupportedAttributes) {
  onnx::GraphProto g;
  g.set_name("g");
  auto* sp = g.add_sparse_initializer();
  sp->mutable_values()->set_name("sparse_w");
  expect_error([&] { graph_from_proto(g); }, {"sparse initializer 'sparse_w'", "not supported"});

  onnx::GraphProto h;
  auto* n = h.add_node();
  n->set_name("split");
  n->set_op_type("SequenceOp");
  auto* a = n->add_attribute();
  a->set_name("tensors");
  a->set_type(onnx::AttributeProto::TENSORS);
  expect_error([&] { graph_from_proto(h); }, {"node 'split' (SequenceOp)", "'tensors'", "TENSORS", "not supported"});
}

TEST(Proto, ExternalDataIsReadRelativeToBaseDir) {
  const auto dir = test::temp_dir("proto_external");
  std::vector<float> values{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  {
    std::ofstream out(dir / "weights.bin", std::ios::binary);
    out.write("PADDING!", 8);  // the tensor starts at offset 8
    out.write(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  }
  onnx::TensorProto t;
  t.set_name("w");
  t.set_data_type(onnx::TensorProto::FLOAT);
  t.add_dims(2);
  t.add_dims(3);
  t.set_data_location(onnx::TensorProto::EXTERNAL);
  auto add = [&](const std::string& k, const std::string& v) {
    auto* e = t.add_external_data();
    e->set_key(k);
    e->set_value(v);
  };
  add("location", "weights.bin");
  add("offset", "8");
  add("length", "24");
  const TensorData d = tensor_from_proto(t, dir.string());
  EXPECT_EQ(d.dims, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(d.as<float>().size(), 6u);
  EXPECT_EQ(d.as<float>()[0], 1.0f);
  EXPECT_EQ(d.as<float>()[5], 6.0f);

  expect_error([&] { tensor_from_proto(t); }, {"tensor 'w'", "weights.bin", "loaded from a file"});
  expect_error([&] { tensor_from_proto(t, (dir / "elsewhere").string()); }, {"tensor 'w'", "weights.bin"});

  onnx::TensorProto past = t;
  past.mutable_external_data(1)->set_value("16");
  expect_error([&] { tensor_from_proto(past, dir.string()); }, {"tensor 'w'", "32 bytes", "runs past its end"});
  onnx::TensorProto wrong_len = t;
  wrong_len.mutable_external_data(2)->set_value("20");
  expect_error([&] { tensor_from_proto(wrong_len, dir.string()); }, {"tensor 'w'", "length 20", "24 bytes"});
  onnx::TensorProto escape = t;
  escape.mutable_external_data(0)->set_value("../etc/passwd");
  expect_error([&] { tensor_from_proto(escape, dir.string()); }, {"tensor 'w'", "must not leave"});
  onnx::TensorProto absolute = t;
  absolute.mutable_external_data(0)->set_value("/etc/passwd");
  expect_error([&] { tensor_from_proto(absolute, dir.string()); }, {"tensor 'w'", "relative"});
}

}  // namespace
}  // namespace onnxtrain
