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
  // Mixed precision's half-precision products (cuBLAS GemmEx with float32 accumulation vs the CPU's emulation).
  for (DType h : {DType::Float16, DType::BFloat16}) {
    const std::string t = h == DType::Float16 ? "Float16" : "BFloat16";
    v.push_back({"MatMulBatched" + t, node("MatMul", {"x0", "x1"}), 17, {randh({2, 3, 4, 5}, 40, h), randh({5, 6}, 41, h)}, {}});
    v.push_back({"MatMulBroadcastBatch" + t, node("MatMul", {"x0", "x1"}), 17,
                 {randh({2, 1, 4, 5}, 42, h), randh({3, 5, 2}, 43, h)}, {}});
    v.push_back({"GemmTransBias" + t, node("Gemm", {"x0", "x1", "x2"}, 1, {{"transA", int64_t{1}}, {"alpha", 0.5f}, {"beta", 2.0f}}),
                 17, {randh({5, 4}, 44, h), randh({5, 3}, 45, h), randh({3}, 46, h)}, {}});
    // The bias gradient of a half Gemm (executor/cuda/reduce.cu's half ReduceSum).
    v.push_back({"ReduceSumColumns" + t, node("ReduceSum", {"x0", "ax"}), 18, {randh({8, 5}, 47, h)}, {{"ax", ints({0})}}});
  }
  // Where's condition is fed as a bool tensor.
  Tensor c = Tensor::empty(DType::Bool, {3, 4});
  for (int64_t i = 0; i < 12; ++i) c.ptr<bool>()[i] = i % 3 == 0;
  v[3].inputs.insert(v[3].inputs.begin(), c);
  v[3].node.inputs = {"x0", "x1", "x2"};

  // Reductions: the block path (long rows), the thread path (short ones), non-adjacent axes, every kind.
  auto attrs_axes = [](std::vector<int64_t> a, int64_t keep) {
    return std::map<std::string, Attribute>{{"axes", std::move(a)}, {"keepdims", keep}};
  };
  const std::map<std::string, Attribute> drop_dims = {{"keepdims", int64_t{0}}};
  v.push_back({"ReduceSumLongRows", node("ReduceSum", {"x0", "ax"}, 1, drop_dims), 18, {randn({4, 300, 3}, 40)}, {{"ax", ints({1})}}});
  v.push_back({"ReduceSumAll", node("ReduceSum", {"x0"}), 18, {randn({50, 70}, 41)}, {}});
  v.push_back({"ReduceMeanAxes0And2Attr", node("ReduceMean", {"x0"}, 1, attrs_axes({0, 2}, 1)), 13, {randn({3, 4, 5}, 42)}, {}});
  v.push_back({"ReduceMaxInt64", node("ReduceMax", {"x0", "ax"}), 18, {randn({6, 5}, 43, DType::Int64)}, {{"ax", ints({-1})}}});
  v.push_back({"ReduceMinCols", node("ReduceMin", {"x0", "ax"}), 18, {randn({200, 3}, 44)}, {{"ax", ints({0})}}});
  v.push_back({"ReduceProd", node("ReduceProd", {"x0", "ax"}), 18, {randn({3, 4}, 45)}, {{"ax", ints({1})}}});
  v.push_back({"ReduceSumSquare", node("ReduceSumSquare", {"x0", "ax"}), 18, {randn({3, 9}, 46)}, {{"ax", ints({1})}}});
  v.push_back({"ReduceL1", node("ReduceL1", {"x0", "ax"}), 18, {randn({3, 9}, 47)}, {{"ax", ints({0})}}});
  v.push_back({"ReduceL2", node("ReduceL2", {"x0", "ax"}), 18, {randn({3, 90}, 48)}, {{"ax", ints({1})}}});
  Tensor positive_sum = randn({3, 9}, 49);  // LogSum of a positive sum
  for (float& f : positive_sum.span<float>()) f = std::abs(f) + 0.1f;
  v.push_back({"ReduceLogSum", node("ReduceLogSum", {"x0", "ax"}), 18, {positive_sum}, {{"ax", ints({1})}}});
  v.push_back({"ReduceLogSumExp", node("ReduceLogSumExp", {"x0", "ax"}), 18, {randn({2, 100}, 50)}, {{"ax", ints({1})}}});
  v.push_back({"ReduceSumNoopEmptyAxes", node("ReduceSum", {"x0"}, 1, {{"noop_with_empty_axes", int64_t{1}}}), 18, {randn({3, 4}, 51)}, {}});
  v.push_back({"ArgMaxLast", node("ArgMax", {"x0"}, 1, {{"axis", int64_t{1}}, {"select_last_index", int64_t{1}}}), 13,
               {randn({3, 6, 2}, 52, DType::Int64)}, {}});
  v.push_back({"ArgMinNoKeep", node("ArgMin", {"x0"}, 1, {{"axis", int64_t{0}}, {"keepdims", int64_t{0}}}), 13, {randn({5, 4}, 53)}, {}});

  // Losses: weights, ignore_index, every reduction, the log_prob output, [N, C, d] inputs, int32 labels.
  auto labels = [](std::vector<int64_t> shape, std::vector<int64_t> l) { return Tensor::from_vector<int64_t>(std::move(shape), l); };
  v.push_back({"NllMeanWeightedIgnore", node("NegativeLogLikelihoodLoss", {"x0", "x1", "x2"}, 1, {{"ignore_index", int64_t{1}}}), 13,
               {randn({4, 3}, 54), labels({4}, {0, 1, 2, 2}), randn({3}, 55)}, {}});
  v.push_back({"NllNone3d", node("NegativeLogLikelihoodLoss", {"x0", "x1"}, 1, {{"reduction", std::string("none")}}), 13,
               {randn({2, 3, 4}, 56), labels({2, 4}, {0, 1, 2, 0, 2, 2, 1, 0})}, {}});
  v.push_back({"SceSumLogProb", node("SoftmaxCrossEntropyLoss", {"x0", "x1"}, 2, {{"reduction", std::string("sum")}}), 13,
               {randn({5, 4}, 57), labels({5}, {3, 0, 1, 2, 3})}, {}});
  Tensor l32 = Tensor::empty(DType::Int32, {2, 3});
  for (int32_t i = 0; i < 6; ++i) l32.ptr<int32_t>()[i] = i % 4;
  v.push_back({"SceMean3dInt32Ignore", node("SoftmaxCrossEntropyLoss", {"x0", "x1"}, 1, {{"ignore_index", int64_t{3}}}), 13,
               {randn({2, 4, 3}, 58), l32}, {}});

  // Index ops: negative indices, batch dims, duplicate indices under a reduction.
  v.push_back({"GatherElements", node("GatherElements", {"x0", "x1"}, 1, {{"axis", int64_t{1}}}), 13,
               {randn({2, 4}, 59), labels({2, 3}, {0, -1, 2, 3, 3, 1})}, {}});
  v.push_back({"GatherNDBatch", node("GatherND", {"x0", "x1"}, 1, {{"batch_dims", int64_t{1}}}), 13,
               {randn({2, 3, 4}, 60), labels({2, 2, 1}, {2, 0, -1, 1})}, {}});
  v.push_back({"ScatterElementsAddDuplicates", node("ScatterElements", {"x0", "x1", "x2"}, 1, {{"axis", int64_t{0}}, {"reduction", std::string("add")}}), 18,
               {randn({3, 2}, 61), labels({4, 2}, {0, 1, 0, 1, 2, 2, -3, 0}), randn({4, 2}, 62)}, {}});
  v.push_back({"ScatterElementsMax", node("ScatterElements", {"x0", "x1", "x2"}, 1, {{"axis", int64_t{1}}, {"reduction", std::string("max")}}), 18,
               {randn({2, 3}, 63), labels({2, 2}, {1, 1, 0, 2}), randn({2, 2}, 64)}, {}});
  v.push_back({"ScatterNDMul", node("ScatterND", {"x0", "x1", "x2"}, 1, {{"reduction", std::string("mul")}}), 18,
               {randn({4, 3}, 65), labels({2, 1}, {1, 1}), randn({2, 3}, 66)}, {}});
  v.push_back({"ScatterNDNone", node("ScatterND", {"x0", "x1", "x2"}), 13,
               {randn({4, 3}, 67), labels({2, 2}, {0, 1, 3, -1}), randn({2}, 68)}, {}});
  v.push_back({"CumSumExclusiveReverse", node("CumSum", {"x0", "ax"}, 1, {{"exclusive", int64_t{1}}, {"reverse", int64_t{1}}}), 14,
               {randn({3, 5, 2}, 69)}, {{"ax", ints({1})}}});
  v.push_back({"CumSumInt64", node("CumSum", {"x0", "ax"}), 14, {randn({7}, 70, DType::Int64)}, {{"ax", ints({0})}}});
  v.push_back({"TopKSmallest", node("TopK", {"x0", "k"}, 2, {{"axis", int64_t{1}}, {"largest", int64_t{0}}}), 11,
               {randn({3, 8, 2}, 71)}, {{"k", ints({3})}}});
  v.push_back({"TopKTiesInt64", node("TopK", {"x0", "k"}, 2), 11, {randn({4, 9}, 72, DType::Int64)}, {{"k", ints({4})}}});

  // Einsum: batched matmul, a diagonal, a full contraction.
  v.push_back({"EinsumBatchedMatMul", node("Einsum", {"x0", "x1"}, 1, {{"equation", std::string("bij,bjk->bik")}}), 12,
               {randn({2, 3, 4}, 73), randn({2, 4, 5}, 74)}, {}});
  v.push_back({"EinsumDiagonal", node("Einsum", {"x0"}, 1, {{"equation", std::string("ii->i")}}), 12, {randn({4, 4}, 75)}, {}});
  v.push_back({"EinsumImplicitSum", node("Einsum", {"x0", "x1"}, 1, {{"equation", std::string("ij,ij")}}), 12,
               {randn({3, 4}, 76), randn({3, 4}, 77)}, {}});

  // Resize: the taps of every mode the CPU plans, applied per axis.
  auto floats = [](std::vector<float> x) { return TensorData::from<float>({static_cast<int64_t>(x.size())}, x); };
  const TensorData no_roi = TensorData::from<float>({0}, std::vector<float>{});
  v.push_back({"ResizeLinearAlignCorners", node("Resize", {"x0", "roi", "sc"}, 1, {{"mode", std::string("linear")},
               {"coordinate_transformation_mode", std::string("align_corners")}}), 13, {randn({1, 2, 3, 4}, 78)},
               {{"roi", no_roi}, {"sc", floats({1, 1, 2, 1.5f})}}});
  v.push_back({"ResizeNearestFloorSizes", node("Resize", {"x0", "roi", "", "sz"}, 1, {{"coordinate_transformation_mode", std::string("asymmetric")},
               {"nearest_mode", std::string("floor")}}), 13, {randn({1, 1, 5, 3}, 79)}, {{"roi", no_roi}, {"sz", ints({1, 1, 3, 7})}}});
  v.push_back({"ResizeCubicHalfPixel", node("Resize", {"x0", "roi", "sc"}, 1, {{"mode", std::string("cubic")}}), 13,
               {randn({1, 1, 4, 4}, 80)}, {{"roi", no_roi}, {"sc", floats({1, 1, 1.75f, 0.5f})}}});
  v.push_back({"ResizeCropAndResize", node("Resize", {"x0", "roi", "sc"}, 1, {{"mode", std::string("linear")},
               {"coordinate_transformation_mode", std::string("tf_crop_and_resize")}, {"extrapolation_value", 2.5f}}), 13,
               {randn({1, 1, 4, 4}, 81)}, {{"roi", floats({0, 0, -0.2f, 0.1f, 1, 1, 0.9f, 1.3f})}, {"sc", floats({1, 1, 2, 2})}}});

  // Dropout outside training is the identity with an all-true mask on both devices (training: see below).
  v.push_back({"DropoutInference", node("Dropout", {"x0"}, 2), 13, {randn({40}, 82)}, {}});
  // LoRA's adapter dropout mask: counter-based with one formula, so the same mask on both devices.
  v.push_back({"DropoutMask", node("DropoutMask", {"x0", "step"}, 1, {{"ratio", 0.3f}, {"seed", int64_t{11}}}, "onnxtrain"),
               17, {randn({3, 333}, 87)}, {{"step", TensorData::from<int64_t>({}, std::vector<int64_t>{5})}}});

  // The GELU gradients from the shared functors.
  v.push_back({"GeluGrad", node("GeluGrad", {"x0", "x1"}, 1, {}, "onnxtrain"), 17, {randn({50}, 83), randn({50}, 84)}, {}});
  v.push_back({"GeluTanhGrad", node("GeluTanhGrad", {"x0", "x1"}, 1, {}, "onnxtrain"), 17, {randn({50}, 85), randn({50}, 86)}, {}});
  return v;
}

class CudaParity : public testing::TestWithParam<Case> {};

TEST_P(CudaParity, MatchesCpu) {
  const Case& c = GetParam();
  // The CPU half runs everywhere, so a case that is not a valid graph fails even without a GPU.
  std::vector<Tensor> want = run_on(Device::CPU, c);
  if (!cuda_available()) GTEST_SKIP() << "no CUDA here (" << cuda_unavailable_reason() << "): GPU parity not run";
  std::vector<Tensor> got = run_on(Device::CUDA, c);
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

// Dropout in training draws from a different stream on each device (docs/gpu.md), so the GPU mask is checked
// for its statistics and consistency instead of against the CPU's: the kept fraction is 1 - ratio within
// 5 sigma, kept elements are scaled by 1 / (1 - ratio), dropped ones are 0, and a seed fixes the mask.
TEST(CudaDropout, TrainingMaskHasTheRatioAndScales) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA here (" << cuda_unavailable_reason() << "): GPU Dropout not run";
  const int64_t n = 100000;
  const double ratio = 0.3;
  Case c{"DropoutTraining", node("Dropout", {"x0", "r", "t"}, 2, {{"seed", int64_t{7}}}), 13, {randn({n}, 90)},
         {{"r", TensorData::scalar<float>(static_cast<float>(ratio))}, {"t", TensorData::scalar<bool>(true)}}};
  const std::vector<Tensor> a = run_on(Device::CUDA, c), b = run_on(Device::CUDA, c);
  const float* x = c.inputs[0].ptr<float>();
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool k = a[1].ptr<bool>()[i];
    kept += k;
    EXPECT_EQ(k, b[1].ptr<bool>()[i]) << "a seeded mask differs between runs at " << i;
    EXPECT_FLOAT_EQ(a[0].ptr<float>()[i], k ? x[i] * static_cast<float>(1 / (1 - ratio)) : 0.0f) << i;
  }
  const double sigma = std::sqrt(n * ratio * (1 - ratio));
  EXPECT_NEAR(static_cast<double>(kept), n * (1 - ratio), 5 * sigma);
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaParity, testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace onnxtrain
