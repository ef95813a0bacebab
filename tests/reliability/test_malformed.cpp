// Malformed inputs the issue lists that the graph suites do not already cover (truncated/random bytes, cycles
// and missing inputs live in tests/graph/test_load.cpp): each gives a clear Error, never a crash.
#include <gtest/gtest.h>

#include <onnx/onnx_pb.h>

#include <cmath>

#include "graph/graph_test_util.h"
#include "graph/model_io.h"
#include "reliability/models.h"
#include "training/session.h"

namespace onnxtrain {
namespace {

using test::expect_error;

// A valid one-node model as a protobuf, to be broken by each test.
onnx::ModelProto matmul_proto() {
  onnx::ModelProto p;
  p.set_ir_version(8);
  p.add_opset_import()->set_version(17);
  onnx::GraphProto* g = p.mutable_graph();
  g->set_name("g");
  auto value = [](onnx::ValueInfoProto* v, const char* name, std::vector<int64_t> dims) {
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->mutable_shape()->add_dim()->set_dim_value(d);
  };
  value(g->add_input(), "x", {2, 4});
  value(g->add_output(), "y", {2, 4});
  onnx::TensorProto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(4);
  w->add_dims(4);
  w->set_raw_data(std::string(64, '\0'));
  onnx::NodeProto* n = g->add_node();
  n->set_name("mm");
  n->set_op_type("MatMul");
  n->add_input("x");
  n->add_input("w");
  n->add_output("y");
  return p;
}

std::string bytes_of(const onnx::ModelProto& p) { return p.SerializeAsString(); }

TEST(Malformed, BaselineModelLoads) { EXPECT_NO_THROW(load_model_from_bytes(bytes_of(matmul_proto()), "ok.onnx")); }

TEST(Malformed, InitializerRawDataShorterThanItsShape) {
  onnx::ModelProto p = matmul_proto();
  p.mutable_graph()->mutable_initializer(0)->set_raw_data(std::string(40, '\0'));
  expect_error([&] { load_model_from_bytes(bytes_of(p), "short.onnx"); },
               {"short.onnx", "tensor 'w'", "raw_data holds 40 bytes", "needs 64"});
}

TEST(Malformed, InitializerTypedDataShorterThanItsShape) {
  onnx::ModelProto p = matmul_proto();
  onnx::TensorProto* w = p.mutable_graph()->mutable_initializer(0);
  w->clear_raw_data();
  for (int i = 0; i < 5; ++i) w->add_float_data(1.0f);
  expect_error([&] { load_model_from_bytes(bytes_of(p), "short_typed.onnx"); }, {"short_typed.onnx", "tensor 'w'", "float_data"});
}

TEST(Malformed, InitializerWithNegativeOrHugeDims) {
  onnx::ModelProto p = matmul_proto();
  p.mutable_graph()->mutable_initializer(0)->set_dims(0, -4);
  expect_error([&] { load_model_from_bytes(bytes_of(p), "neg.onnx"); }, {"neg.onnx", "tensor 'w'", "negative"});
  // Dimensions whose product overflows int64 must not wrap around to a size that happens to match.
  onnx::ModelProto q = matmul_proto();
  q.mutable_graph()->mutable_initializer(0)->set_dims(0, int64_t{1} << 40);
  q.mutable_graph()->mutable_initializer(0)->set_dims(1, int64_t{1} << 40);
  expect_error([&] { load_model_from_bytes(bytes_of(q), "huge.onnx"); }, {"huge.onnx", "tensor 'w'", "too large"});
  // ... also when the data is empty, which a wrapped-around size of 0 would have accepted.
  q.mutable_graph()->mutable_initializer(0)->set_dims(1, int64_t{1} << 24);
  q.mutable_graph()->mutable_initializer(0)->set_raw_data("");
  expect_error([&] { load_model_from_bytes(bytes_of(q), "huge0.onnx"); }, {"huge0.onnx", "tensor 'w'", "too large"});
}

TEST(Malformed, UnknownOpDomainIsNamedWhenTraining) {
  onnx::ModelProto p = matmul_proto();
  onnx::OperatorSetIdProto* o = p.add_opset_import();
  o->set_domain("com.example");
  o->set_version(1);
  onnx::NodeProto* n = p.mutable_graph()->mutable_node(0);
  n->set_op_type("Frobnicate");
  n->set_domain("com.example");
  // ONNX itself cannot check an op it does not know, so loading succeeds; training needs a kernel and a rule.
  Model m = load_model_from_bytes(bytes_of(p), "custom.onnx");
  expect_error([&] { TrainingSession(m, {}); }, {"Frobnicate", "com.example"});
}

TEST(Malformed, OpDomainWithoutOpsetImport) {
  onnx::ModelProto p = matmul_proto();
  onnx::NodeProto* n = p.mutable_graph()->mutable_node(0);
  n->set_op_type("Frobnicate");
  n->set_domain("com.unimported");
  expect_error([&] { load_model_from_bytes(bytes_of(p), "noimport.onnx"); }, {"noimport.onnx", "com.unimported"});
}

TEST(Malformed, CrossEntropyLabelsOutOfRange) {
  TrainingConfig c;
  c.loss.kind = "cross_entropy";
  TrainingSession s(test::linear_model(3, 4), c);
  Feeds f{{"x", test::filled({3, 3}, 0.1f, 0.3f)}, {s.target_name(), test::labels({0, 3, 1})}};
  EXPECT_TRUE(std::isfinite(s.train_step(f)));
  const auto w = s.get_weight("fc.weight");
  f[s.target_name()] = test::labels({0, 4, 1});
  expect_error([&] { s.train_step(f); },
               {"target '" + s.target_name() + "'", "class index 4 at flat position 1", "4 classes", "0..3",
                "ignore_index -100"});
  f[s.target_name()] = test::labels({-1, 0, 1});
  expect_error([&] { s.gradients(f); }, {"class index -1 at flat position 0"});
  EXPECT_EQ(s.step(), 1);
  // torch's ignore_index stays accepted.
  f[s.target_name()] = test::labels({-100, 0, 1});
  EXPECT_TRUE(std::isfinite(s.train_step(f)));
  // nll reads indices the same way; without ignore_index, -100 is out of range too.
  TrainingConfig n;
  n.loss.kind = "nll";
  n.loss.ignore_index.reset();
  TrainingSession t(test::linear_model(3, 4), n);
  expect_error([&] { t.train_step(f); }, {"class index -100", "expected 0..3"});
}

TEST(Malformed, WrongFeedDtypeAndShape) {
  TrainingSession s(test::linear_model(3, 1), {});
  Feeds f{{"x", test::filled({4, 3}, 0.1f, 0.2f)}, {s.target_name(), test::filled({4, 1}, 0.0f, 0.1f)}};
  Feeds wrong_rank = f;
  wrong_rank["x"] = test::filled({4, 3, 1}, 0.1f, 0.2f);
  expect_error([&] { s.train_step(wrong_rank); }, {"input 'x'", "expected shape"});
  Feeds wrong_dtype = f;
  wrong_dtype["x"] = Tensor::from_vector<double>({4, 3}, std::vector<double>(12, 0.5));
  expect_error([&] { s.train_step(wrong_dtype); }, {"input 'x'", "expected dtype float32, got float64"});
  Feeds missing = f;
  missing.erase("x");
  expect_error([&] { s.train_step(missing); }, {"input 'x'", "missing"});
}

}  // namespace
}  // namespace onnxtrain
