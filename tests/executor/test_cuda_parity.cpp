// GPU parity: each case runs one graph on the CPU and on CUDA with the same inputs and compares the results.
// Needs a CUDA device; without one every case skips, saying so. On a GPU machine run it with
//   ctest --test-dir build/release -R CudaParity --output-on-failure
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "executor/device.h"
#include "executor/executor.h"

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
  // Normalisation and softmax (executor/cuda/norm.cu, softmax.cu). Variances fed to inference-mode
  // BatchNormalization must be positive.
  auto positive = [](std::vector<int64_t> shape, uint32_t seed) {
    Tensor t = randn(std::move(shape), seed);
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = 0.5f + std::abs(t.ptr<float>()[i]);
    return t;
  };
  const auto axis = [](int64_t a) { return std::map<std::string, Attribute>{{"axis", a}}; };
  v.push_back({"SoftmaxInnerAxis", node("Softmax", {"x0"}, 1, axis(1)), 17, {randn({2, 5, 3}, 40)}, {}});
  v.push_back({"LogSoftmaxLastAxis", node("LogSoftmax", {"x0"}, 1, axis(-1)), 17, {randn({4, 33}, 41)}, {}});
  v.push_back({"SoftmaxOpset11Coerced", node("Softmax", {"x0"}, 1, axis(1)), 11, {randn({2, 3, 4}, 42)}, {}});
  v.push_back({"SoftmaxGrad", node("SoftmaxGrad", {"x0", "x1"}, 1, axis(0), "onnxtrain"), 17,
               {randn({3, 4}, 43), positive({3, 4}, 44)}, {}});
  v.push_back({"LogSoftmaxGrad", node("LogSoftmaxGrad", {"x0", "x1"}, 1, {}, "onnxtrain"), 17,
               {randn({5, 7}, 45), randn({5, 7}, 46)}, {}});
  v.push_back({"LayerNormBroadcastScaleStats", node("LayerNormalization", {"x0", "x1", "x2"}, 3, axis(-2)), 17,
               {randn({2, 3, 4}, 47), randn({1, 4}, 48), randn({3, 1}, 49)}, {}});
  v.push_back({"InstanceNorm", node("InstanceNormalization", {"x0", "x1", "x2"}), 17,
               {randn({2, 3, 5}, 50), randn({3}, 51), randn({3}, 52)}, {}});
  v.push_back({"GroupNormOpset21", node("GroupNormalization", {"x0", "x1", "x2"}, 1, {{"num_groups", int64_t{2}}}), 21,
               {randn({2, 4, 3}, 53), randn({4}, 54), randn({4}, 55)}, {}});
  v.push_back({"BatchNormTraining", node("BatchNormalization", {"x0", "x1", "x2", "x3", "x4"}, 3,
                                         {{"training_mode", int64_t{1}}, {"momentum", 0.8f}}), 15,
               {randn({3, 2, 4, 5}, 56), randn({2}, 57), randn({2}, 58), randn({2}, 59), positive({2}, 60)}, {}});
  v.push_back({"BatchNormInference", node("BatchNormalization", {"x0", "x1", "x2", "x3", "x4"}), 15,
               {randn({3, 2, 4}, 61), randn({2}, 62), randn({2}, 63), randn({2}, 64), positive({2}, 65)}, {}});
  v.push_back({"LayerNormGrad", node("LayerNormalizationGrad", {"x0", "x1", "x2", "x3", "x4"}, 3, axis(1), "onnxtrain"),
               17, {randn({2, 3, 4}, 66), randn({2, 3, 4}, 67), randn({3, 4}, 68), randn({2, 1, 1}, 69),
                    positive({2, 1, 1}, 70)}, {}});
  v.push_back({"BatchNormGrad", node("BatchNormalizationGrad", {"x0", "x1", "x2"}, 3, {{"epsilon", 1e-3f}}, "onnxtrain"),
               17, {randn({4, 3, 2, 5}, 71), randn({4, 3, 2, 5}, 72), randn({3}, 73)}, {}});
  v.push_back({"GatherGrad", node("GatherGrad", {"x0", "x1", "s"}, 1, {{"axis", int64_t{1}}}, "onnxtrain"), 17,
               {randn({3, 6, 2}, 37), Tensor::from_vector<int64_t>({6}, {4, 0, -1, 4, 2, 4})}, {{"s", ints({3, 5, 2})}}});
  v.push_back({"SumToShape", node("SumToShape", {"x0", "s"}, 1, {}, "onnxtrain"), 17, {randn({2, 3, 4, 5}, 38)},
               {{"s", ints({3, 1, 5})}}});
  // The convolution family (executor/cuda/conv.cu), asymmetric pads, groups, strides and dilations included.
  using I = std::vector<int64_t>;
  const std::map<std::string, Attribute> conv_attrs{
      {"group", int64_t{2}}, {"strides", I{2, 1}}, {"dilations", I{1, 2}}, {"pads", I{1, 0, 0, 1}}};
  v.push_back({"ConvGroupStridedDilated", node("Conv", {"x0", "x1", "x2"}, 1, conv_attrs), 17,
               {randn({2, 4, 7, 6}, 40), randn({6, 2, 3, 2}, 41), randn({6}, 42)}, {}});
  v.push_back({"ConvGrad", node("ConvGrad", {"x0", "x1", "x2"}, 3, conv_attrs, "onnxtrain"), 17,
               {randn({2, 6, 3, 5}, 43), randn({2, 4, 7, 6}, 44), randn({6, 2, 3, 2}, 45)}, {}});
  v.push_back({"ConvTransposeOutputPadding",
               node("ConvTranspose", {"x0", "x1"}, 1,
                    {{"strides", I{2, 2}}, {"pads", I{1, 1, 0, 0}}, {"output_padding", I{1, 0}}, {"group", int64_t{2}}}),
               17, {randn({1, 4, 3, 3}, 46), randn({4, 3, 3, 3}, 47)}, {}});
  v.push_back({"MaxPoolIndicesCeil",
               node("MaxPool", {"x0"}, 2, {{"kernel_shape", I{3, 3}}, {"strides", I{2, 2}}, {"ceil_mode", int64_t{1}}}), 17,
               {randn({2, 3, 8, 7}, 48)}, {}});
  v.push_back({"MaxPoolGrad",
               node("MaxPoolGrad", {"x0", "x1"}, 1, {{"kernel_shape", I{3, 2}}, {"strides", I{2, 1}}, {"pads", I{1, 0, 1, 1}}},
                    "onnxtrain"),
               17, {randn({2, 3, 4, 6}, 49), randn({2, 3, 7, 6}, 50)}, {}});
  const std::map<std::string, Attribute> avg_attrs{{"kernel_shape", I{3, 2}}, {"strides", I{2, 2}}, {"pads", I{1, 0, 0, 0}},
                                                   {"ceil_mode", int64_t{1}}, {"count_include_pad", int64_t{1}}};
  v.push_back({"AveragePoolCeilIncludePad", node("AveragePool", {"x0"}, 1, avg_attrs), 17, {randn({1, 2, 8, 7}, 51)}, {}});
  v.push_back({"AveragePoolGrad", node("AveragePoolGrad", {"x0", "x1"}, 1, avg_attrs, "onnxtrain"), 17,
               {randn({1, 2, 4, 4}, 52), randn({1, 2, 8, 7}, 53)}, {}});
  v.push_back({"GlobalAveragePool3d", node("GlobalAveragePool", {"x0"}), 17, {randn({2, 3, 4, 3, 5}, 54)}, {}});
  v.push_back({"GlobalMaxPool", node("GlobalMaxPool", {"x0"}), 17, {randn({2, 3, 9}, 55)}, {}});
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
