// GPU parity: each case runs one graph on the CPU and on CUDA with the same inputs and compares the results.
// Needs a CUDA device; without one every case skips, saying so. On a GPU machine run it with
//   ctest --test-dir build/release -R CudaParity --output-on-failure
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "executor/device.h"
#include "executor/executor.h"
#include "executor/half.h"

namespace onnxtrain {
namespace {

struct Case {
  std::string name;
  Node node;
  int64_t opset;
  std::vector<Tensor> inputs;  // fed (x0, x1, ...)
  std::map<std::string, TensorData> constants;  // initializers (shapes, axes, ...)
};

// Test names and failure messages show the case's name, not its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

Tensor randn(std::vector<int64_t> shape, uint32_t seed, DType t = DType::Float32) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> d;
  Tensor x = Tensor::empty(t, std::move(shape));
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (t == DType::Float32) x.ptr<float>()[i] = static_cast<float>(d(rng));
    else if (t == DType::Float64) x.ptr<double>()[i] = d(rng);
    else if (t == DType::Int64) x.ptr<int64_t>()[i] = static_cast<int64_t>(std::abs(d(rng)) * 2);
  }
  return x;
}

Node node(const std::string& op, std::vector<std::string> in, size_t n_out = 1, std::map<std::string, Attribute> a = {},
          const std::string& domain = "") {
  Node n;
  n.name = "n_" + op;
  n.op_type = op;
  n.domain = domain;
  n.inputs = std::move(in);
  for (size_t i = 0; i < n_out; ++i) n.outputs.push_back("y" + std::to_string(i));
  n.attributes = std::move(a);
  return n;
}

// randn rounded to float16 or bfloat16.
Tensor randh(std::vector<int64_t> shape, uint32_t seed, DType t) {
  const Tensor x = randn(shape, seed);
  Tensor h = Tensor::empty(t, std::move(shape));
  for (int64_t i = 0; i < x.numel(); ++i)
    h.ptr<uint16_t>()[i] = t == DType::Float16 ? FloatToHalf{}(x.ptr<float>()[i]) : FloatToBFloat16{}(x.ptr<float>()[i]);
  return h;
}

float half_value(const Tensor& t, int64_t i) {
  const uint16_t v = t.ptr<uint16_t>()[i];
  return t.dtype == DType::Float16 ? HalfToFloat{}(v) : BFloat16ToFloat{}(v);
}

std::vector<Tensor> run_on(Device d, const Case& c) {
  Graph g;
  g.nodes = {c.node};
  for (size_t i = 0; i < c.inputs.size(); ++i) g.inputs.push_back({"x" + std::to_string(i), {c.inputs[i].dtype, std::nullopt}});
  for (const std::string& o : c.node.outputs) g.outputs.push_back({o, {DType::Undefined, std::nullopt}});
  g.initializers = c.constants;
  ExecutorOptions o;
  o.device = d;
  Executor ex(g, {{"", c.opset}, {"onnxtrain", 1}, {"ai.onnx.preview.training", 1}}, std::make_shared<TensorStore>(), o);
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < c.inputs.size(); ++i) feeds["x" + std::to_string(i)] = c.inputs[i];
  return ex.run(feeds);  // host tensors on both devices
}

std::vector<Case> cases() {
  std::vector<Case> v;
  auto ints = [](std::vector<int64_t> x) { return TensorData::from<int64_t>({static_cast<int64_t>(x.size())}, x); };
  v.push_back({"AddBroadcast", node("Add", {"x0", "x1"}), 17, {randn({4, 1, 5}, 1), randn({3, 1}, 2)}, {}});
  v.push_back({"DivInt", node("Div", {"x0", "x1"}), 17, {randn({6}, 3, DType::Int64), randn({6}, 4, DType::Int64)}, {}});
  v.push_back({"PowMixed", node("Pow", {"x0", "x1"}), 17, {randn({8}, 5), randn({1}, 6)}, {}});
  v.push_back({"Where", node("Where", {"c", "x0", "x1"}), 17, {randn({3, 4}, 7), randn({4}, 8)}, {}});
  v.push_back({"SumOfThree", node("Sum", {"x0", "x1", "x2"}), 17, {randn({2, 3}, 9), randn({3}, 10), randn({2, 1}, 11)}, {}});
  v.push_back({"Sigmoid", node("Sigmoid", {"x0"}), 17, {randn({1000}, 12)}, {}});
  v.push_back({"GeluTanh", node("Gelu", {"x0"}, 1, {{"approximate", std::string("tanh")}}), 20, {randn({77}, 13)}, {}});
  v.push_back({"LeakyRelu", node("LeakyRelu", {"x0"}, 1, {{"alpha", 0.2f}}), 17, {randn({64}, 14)}, {}});
  v.push_back({"CastToInt", node("Cast", {"x0"}, 1, {{"to", int64_t{7}}}), 17, {randn({10}, 15)}, {}});
  v.push_back({"TanhGrad", node("TanhGrad", {"x0", "x1"}, 1, {}, "onnxtrain"), 17, {randn({33}, 16), randn({33}, 17)}, {}});
  v.push_back({"MatMulBatched", node("MatMul", {"x0", "x1"}), 17, {randn({2, 3, 4, 5}, 18), randn({5, 6}, 19)}, {}});
  v.push_back({"MatMulBroadcastBatch", node("MatMul", {"x0", "x1"}), 17, {randn({2, 1, 4, 5}, 20), randn({3, 5, 2}, 21)}, {}});
  v.push_back({"GemmTransBias", node("Gemm", {"x0", "x1", "x2"}, 1, {{"transB", int64_t{1}}, {"alpha", 0.5f}, {"beta", 2.0f}}), 17,
               {randn({4, 5}, 22), randn({3, 5}, 23), randn({3}, 24)}, {}});
  v.push_back({"Transpose", node("Transpose", {"x0"}, 1, {{"perm", std::vector<int64_t>{2, 0, 1}}}), 17, {randn({2, 3, 4}, 25)}, {}});
  v.push_back({"Slice", node("Slice", {"x0", "s", "e", "a", "st"}), 17, {randn({5, 6}, 26)},
               {{"s", ints({1, -1})}, {"e", ints({5, 0})}, {"a", ints({0, 1})}, {"st", ints({2, -2})}}});
  v.push_back({"Concat", node("Concat", {"x0", "x1"}, 1, {{"axis", int64_t{1}}}), 17, {randn({2, 3}, 27), randn({2, 2}, 28)}, {}});
  v.push_back({"Split", node("Split", {"x0"}, 2, {{"axis", int64_t{0}}}), 17, {randn({4, 3}, 29)}, {}});
  v.push_back({"PadConstant", node("Pad", {"x0", "p", "x1"}), 17, {randn({2, 3}, 30), randn({}, 31)}, {{"p", ints({1, 0, 0, 2})}}});
  v.push_back({"Tile", node("Tile", {"x0", "r"}), 17, {randn({2, 3}, 32)}, {{"r", ints({2, 2})}}});
  v.push_back({"Gather", node("Gather", {"x0", "x1"}, 1, {{"axis", int64_t{1}}}), 17,
               {randn({3, 5, 2}, 33), Tensor::from_vector<int64_t>({4}, {4, 0, -1, 2})}, {}});
  v.push_back({"Adam", node("Adam", {"r", "t", "x0", "x1", "x2", "x3"}, 3, {}, "ai.onnx.preview.training"), 17,
               {randn({10}, 34), randn({10}, 35), randn({10}, 36), Tensor::from_vector<float>({10}, std::vector<float>(10, 0.5f))},
               {{"r", TensorData::from<float>({}, std::vector<float>{0.1f})}, {"t", TensorData::from<int64_t>({}, std::vector<int64_t>{3})}}});
  // Mixed precision's half-precision products (cuBLAS GemmEx with float32 accumulation vs the CPU's emulation).
  for (DType h : {DType::Float16, DType::BFloat16}) {
    const std::string t = h == DType::Float16 ? "Float16" : "BFloat16";
    v.push_back({"MatMulBatched" + t, node("MatMul", {"x0", "x1"}), 17, {randh({2, 3, 4, 5}, 40, h), randh({5, 6}, 41, h)}, {}});
    v.push_back({"MatMulBroadcastBatch" + t, node("MatMul", {"x0", "x1"}), 17,
                 {randh({2, 1, 4, 5}, 42, h), randh({3, 5, 2}, 43, h)}, {}});
    v.push_back({"GemmTransBias" + t, node("Gemm", {"x0", "x1", "x2"}, 1, {{"transA", int64_t{1}}, {"alpha", 0.5f}, {"beta", 2.0f}}),
                 17, {randh({5, 4}, 44, h), randh({5, 3}, 45, h), randh({3}, 46, h)}, {}});
  }
  // Where's condition is fed as a bool tensor.
  Tensor c = Tensor::empty(DType::Bool, {3, 4});
  for (int64_t i = 0; i < 12; ++i) c.ptr<bool>()[i] = i % 3 == 0;
  v[3].inputs.insert(v[3].inputs.begin(), c);
  v[3].node.inputs = {"x0", "x1", "x2"};
  return v;
}

class CudaParity : public testing::TestWithParam<Case> {};

TEST_P(CudaParity, MatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA here (" << cuda_unavailable_reason() << "): GPU parity not run";
  const Case& c = GetParam();
  std::vector<Tensor> want = run_on(Device::CPU, c), got = run_on(Device::CUDA, c);
  ASSERT_EQ(want.size(), got.size());
  for (size_t o = 0; o < want.size(); ++o) {
    ASSERT_EQ(want[o].dtype, got[o].dtype);
    ASSERT_EQ(want[o].shape, got[o].shape);
    for (int64_t i = 0; i < want[o].numel(); ++i) {
      if (want[o].dtype == DType::Float32)
        EXPECT_NEAR(got[o].ptr<float>()[i], want[o].ptr<float>()[i], 1e-5 * (1 + std::abs(want[o].ptr<float>()[i])))
            << c.name << " output " << o << " element " << i;
      else if (want[o].dtype == DType::Float16 || want[o].dtype == DType::BFloat16)
        // Summation order may differ: allow one rounding step of the half type.
        EXPECT_NEAR(half_value(got[o], i), half_value(want[o], i),
                    (want[o].dtype == DType::Float16 ? 2e-3 : 1.6e-2) * (1 + std::abs(half_value(want[o], i))))
            << c.name << " output " << o << " element " << i;
      else
        EXPECT_EQ(0, std::memcmp(static_cast<const char*>(got[o].data) + i * dtype_size(got[o].dtype),
                                 static_cast<const char*>(want[o].data) + i * dtype_size(want[o].dtype),
                                 dtype_size(want[o].dtype)))
            << c.name << " output " << o << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaParity, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace onnxtrain
