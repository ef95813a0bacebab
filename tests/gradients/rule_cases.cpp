#include "gradients/rule_cases.h"

#include <cmath>
#include <limits>

namespace onnxtrain::test {

TensorData ints(const std::vector<int64_t>& v) {
  return TensorData::from<int64_t>({static_cast<int64_t>(v.size())}, std::span<const int64_t>(v));
}

TensorData bools(std::vector<int64_t> dims, const std::vector<bool>& v) {
  TensorData t;
  t.dtype = DType::Bool;
  t.dims = std::move(dims);
  for (bool b : v) t.bytes.push_back(std::byte{b ? uint8_t{1} : uint8_t{0}});
  return t;
}

RuleCase make(std::string label, std::string op, Shapes shapes, Attrs attrs, Ranges ranges, int64_t opset) {
  RuleCase c;
  c.label = std::move(label);
  c.op = std::move(op);
  c.input_shapes = std::move(shapes);
  c.attrs = std::move(attrs);
  c.ranges = std::move(ranges);
  c.opset = opset;
  return c;
}

RuleCase with_const(RuleCase c, size_t i, TensorData v) {
  c.const_inputs.resize(c.input_shapes.size());
  c.input_shapes[i] = v.dims;
  c.const_inputs[i] = std::move(v);
  return c;
}

RuleCase kinked(RuleCase c) {
  c.avoid_zero = true;
  return c;
}

RuleCase signed_(RuleCase c) {
  c.random_sign = true;
  return c;
}

namespace {

using Consts = std::vector<std::optional<TensorData>>;

TensorData f64_scalar(double v) { return TensorData::scalar<double>(v); }

std::vector<RuleCase> build() {
  std::vector<RuleCase> v;
  const std::pair<double, double> pos{0.5, 2.0};
  const std::pair<double, double> any{-1.0, 1.0};

  // ---- elementwise
  v.push_back(make("Add_same", "Add", {{2, 3}, {2, 3}}));
  v.push_back(make("Add_row", "Add", {{2, 3}, {3}}));
  v.push_back(make("Add_scalar", "Add", {{}, {2, 3}}));
  v.push_back(make("Add_both_broadcast", "Add", {{2, 1, 4}, {3, 1}}));
  v.push_back(make("Sub_row", "Sub", {{2, 3}, {3}}));
  v.push_back(make("Sub_outer", "Sub", {{3, 1}, {1, 4}}));
  v.push_back(make("Mul_same", "Mul", {{2, 3}, {2, 3}}));
  v.push_back(make("Mul_both_broadcast", "Mul", {{2, 1, 4}, {3, 1}}));
  v.push_back(signed_(make("Div_row", "Div", {{2, 3}, {3}}, {}, {any, pos})));
  v.push_back(signed_(make("Div_outer", "Div", {{1, 3}, {2, 1}}, {}, {pos, pos})));
  v.push_back(make("Neg", "Neg", {{2, 3}}));
  v.push_back(make("Identity", "Identity", {{2, 3}}));
  v.push_back(make("Sum_three_broadcast", "Sum", {{2, 3}, {3}, {2, 1}}));
  v.push_back(make("Sum_one", "Sum", {{2, 3}}));
  v.push_back(make("Mean_three_broadcast", "Mean", {{2, 3}, {3}, {2, 1}}));
  v.push_back(make("Max_broadcast", "Max", {{2, 3}, {3}}));
  v.push_back(make("Max_three", "Max", {{4}, {4}, {4}}));
  v.push_back(make("Min_broadcast", "Min", {{2, 3}, {2, 1}}));
  v.push_back(make("Pow_both", "Pow", {{2, 3}, {2, 3}}, {}, {pos, {-2.0, 2.0}}));
  v.push_back(make("Pow_scalar_exponent", "Pow", {{2, 3}, {}}, {}, {pos, {0.5, 3.0}}));
  v.push_back(with_const(make("Pow_const_square", "Pow", {{2, 3}, {}}, {}, {any}), 1, f64_scalar(2.0)));
  v.push_back(make("Sqrt", "Sqrt", {{2, 3}}, {}, {pos}));
  v.push_back(make("Exp", "Exp", {{2, 3}}, {}, {{-2.0, 2.0}}));
  v.push_back(make("Log", "Log", {{2, 3}}, {}, {pos}));
  v.push_back(kinked(make("Abs", "Abs", {{2, 3}})));
  v.push_back(signed_(make("Reciprocal", "Reciprocal", {{2, 3}}, {}, {pos})));
  v.push_back(make("Erf", "Erf", {{2, 3}}, {}, {{-2.0, 2.0}}));
  v.push_back(make("Cast_f64", "Cast", {{2, 3}}, {{"to", int64_t{static_cast<int64_t>(DType::Float64)}}}));
  v.push_back(with_const(make("Where_same", "Where", {{2, 3}, {2, 3}, {2, 3}}), 0,
                         bools({2, 3}, {true, false, true, false, false, true})));
  v.push_back(with_const(make("Where_broadcast", "Where", {{3}, {2, 1}, {2, 3}}), 0, bools({3}, {true, false, true})));

  // ---- activations
  v.push_back(kinked(make("Relu", "Relu", {{3, 4}})));
  v.push_back(make("Sigmoid", "Sigmoid", {{3, 4}}, {}, {{-3.0, 3.0}}));
  v.push_back(make("Tanh", "Tanh", {{3, 4}}, {}, {{-2.0, 2.0}}));
  v.push_back(kinked(make("LeakyRelu", "LeakyRelu", {{3, 4}}, {{"alpha", 0.1f}})));
  v.push_back(make("Softplus", "Softplus", {{3, 4}}, {}, {{-3.0, 3.0}}));
  v.push_back(make("Softmax_last", "Softmax", {{2, 3, 4}}, {{"axis", int64_t{-1}}}, {{-2.0, 2.0}}, 13));
  v.push_back(make("Softmax_middle", "Softmax", {{2, 3, 4}}, {{"axis", int64_t{1}}}, {{-2.0, 2.0}}, 13));
  v.push_back(make("Softmax_opset11_coerced", "Softmax", {{2, 3, 4}}, {{"axis", int64_t{1}}}, {{-2.0, 2.0}}, 11));
  v.push_back(make("LogSoftmax_last", "LogSoftmax", {{2, 3, 4}}, {}, {{-2.0, 2.0}}, 13));
  v.push_back(make("LogSoftmax_first", "LogSoftmax", {{2, 3, 4}}, {{"axis", int64_t{0}}}, {{-2.0, 2.0}}, 13));
  v.push_back(make("LogSoftmax_opset11_coerced", "LogSoftmax", {{2, 3, 4}}, {}, {{-2.0, 2.0}}, 11));
  // axis 2 of a rank-3 input coerces to the last axis alone: the fused op serves opset 11 too.
  v.push_back(make("Softmax_opset11_last", "Softmax", {{2, 3, 4}}, {{"axis", int64_t{2}}}, {{-2.0, 2.0}}, 11));
  v.push_back(make("LogSoftmax_middle", "LogSoftmax", {{2, 3, 4}}, {{"axis", int64_t{-2}}}, {{-2.0, 2.0}}, 13));
  v.push_back(make("LogSoftmax_opset11_axis0", "LogSoftmax", {{2, 3, 4}}, {{"axis", int64_t{0}}}, {{-2.0, 2.0}}, 11));

  // ---- trigonometric and hyperbolic (inverse functions sampled inside their domains, away from the poles)
  v.push_back(make("Sin", "Sin", {{2, 3}}, {}, {{-3.0, 3.0}}));
  v.push_back(make("Cos", "Cos", {{2, 3}}, {}, {{-3.0, 3.0}}));
  v.push_back(make("Tan", "Tan", {{2, 3}}, {}, {{-1.2, 1.2}}));
  v.push_back(make("Asin", "Asin", {{2, 3}}, {}, {{-0.9, 0.9}}));
  v.push_back(make("Acos", "Acos", {{2, 3}}, {}, {{-0.9, 0.9}}));
  v.push_back(make("Atan", "Atan", {{2, 3}}, {}, {{-3.0, 3.0}}));
  v.push_back(make("Sinh", "Sinh", {{2, 3}}, {}, {{-2.0, 2.0}}));
  v.push_back(make("Cosh", "Cosh", {{2, 3}}, {}, {{-2.0, 2.0}}));
  v.push_back(make("Asinh", "Asinh", {{2, 3}}, {}, {{-3.0, 3.0}}));
  v.push_back(make("Acosh", "Acosh", {{2, 3}}, {}, {{1.2, 4.0}}));
  v.push_back(make("Atanh", "Atanh", {{2, 3}}, {}, {{-0.9, 0.9}}));

  // ---- more activations; kinks sit at 0 (avoid_zero) or, with attributes, at the bounds named per row
  v.push_back(kinked(make("Elu", "Elu", {{3, 4}}, {}, {{-3.0, 3.0}})));
  v.push_back(kinked(make("Elu_alpha", "Elu", {{3, 4}}, {{"alpha", 0.5f}}, {{-3.0, 3.0}})));
  v.push_back(kinked(make("Elu_negative_alpha", "Elu", {{3, 4}}, {{"alpha", -0.5f}}, {{-3.0, 3.0}})));
  v.push_back(kinked(make("Selu", "Selu", {{3, 4}}, {}, {{-3.0, 3.0}})));
  v.push_back(kinked(make("Selu_attrs", "Selu", {{3, 4}}, {{"alpha", 2.0f}, {"gamma", 0.5f}}, {{-3.0, 3.0}})));
  v.push_back(kinked(make("Celu", "Celu", {{3, 4}}, {}, {{-3.0, 3.0}}, 12)));
  v.push_back(kinked(make("Celu_alpha", "Celu", {{3, 4}}, {{"alpha", 2.0f}}, {{-3.0, 3.0}}, 12)));
  v.push_back(make("Gelu_none", "Gelu", {{3, 4}}, {}, {{-3.0, 3.0}}, 20));
  v.push_back(make("Gelu_tanh", "Gelu", {{3, 4}}, {{"approximate", std::string("tanh")}}, {{-3.0, 3.0}}, 20));
  // Defaults: linear for x in (-2.5, 2.5); [-4, 4] covers both saturated ends too.
  v.push_back(make("HardSigmoid", "HardSigmoid", {{3, 4}}, {}, {{-4.0, 4.0}}));
  // Linear for x in (-1.2, 0.8).
  v.push_back(make("HardSigmoid_attrs", "HardSigmoid", {{3, 4}}, {{"alpha", 0.5f}, {"beta", 0.6f}}, {{-3.0, 3.0}}));
  // Kinks at -3 and 3.
  v.push_back(make("HardSwish", "HardSwish", {{3, 4}}, {}, {{-5.0, 5.0}}, 14));
  v.push_back(kinked(make("Softsign", "Softsign", {{3, 4}}, {}, {{-3.0, 3.0}})));
  v.push_back(make("Mish", "Mish", {{3, 4}}, {}, {{-3.0, 3.0}}, 18));
  // Kink at alpha (1 by default).
  v.push_back(make("ThresholdedRelu", "ThresholdedRelu", {{3, 4}}, {}, {{-3.0, 3.0}}));
  v.push_back(make("ThresholdedRelu_negative_alpha", "ThresholdedRelu", {{3, 4}}, {{"alpha", -0.5f}}, {{-3.0, 3.0}}));
  v.push_back(kinked(make("PRelu_same_shape", "PRelu", {{2, 3}, {2, 3}}, {}, {any, {0.1, 0.9}})));
  v.push_back(kinked(make("PRelu_channel_slope", "PRelu", {{2, 3, 2, 2}, {3, 1, 1}}, {}, {any, {0.1, 0.9}})));
  v.push_back(kinked(make("PRelu_scalar_slope", "PRelu", {{2, 3}, {1}}, {}, {any, {-0.5, 0.5}})));
  v.push_back(kinked(make("LeakyRelu_negative_alpha", "LeakyRelu", {{3, 4}}, {{"alpha", -0.3f}})));

  // ---- matmul
  v.push_back(make("MatMul_2d", "MatMul", {{2, 3}, {3, 4}}));
  v.push_back(make("MatMul_batched", "MatMul", {{2, 2, 3}, {2, 3, 4}}));
  v.push_back(make("MatMul_batched_by_2d", "MatMul", {{2, 2, 3}, {3, 4}}));
  v.push_back(make("MatMul_4d_by_2d", "MatMul", {{2, 2, 2, 3}, {3, 4}}));
  v.push_back(make("MatMul_2d_by_batched", "MatMul", {{3, 4}, {2, 4, 5}}));
  v.push_back(make("MatMul_batch_broadcast", "MatMul", {{2, 1, 2, 3}, {3, 3, 2}}));
  v.push_back(make("MatMul_vec_mat", "MatMul", {{3}, {3, 4}}));
  v.push_back(make("MatMul_vec_batched", "MatMul", {{3}, {2, 3, 4}}));
  v.push_back(make("MatMul_mat_vec", "MatMul", {{2, 3}, {3}}));
  v.push_back(make("MatMul_batched_vec", "MatMul", {{2, 2, 3}, {3}}));
  v.push_back(make("MatMul_dot", "MatMul", {{3}, {3}}));
  for (int ta = 0; ta <= 1; ++ta)
    for (int tb = 0; tb <= 1; ++tb) {
      std::vector<int64_t> a = ta ? std::vector<int64_t>{3, 2} : std::vector<int64_t>{2, 3};
      std::vector<int64_t> b = tb ? std::vector<int64_t>{4, 3} : std::vector<int64_t>{3, 4};
      std::string t = "_tA" + std::to_string(ta) + "_tB" + std::to_string(tb);
      Attrs at{{"transA", int64_t{ta}}, {"transB", int64_t{tb}}};
      v.push_back(make("Gemm_noC" + t, "Gemm", {a, b}, at));
      v.push_back(make("Gemm_C_MN" + t, "Gemm", {a, b, {2, 4}}, at));
      Attrs scaled = at;
      scaled["alpha"] = 0.5f;
      scaled["beta"] = 2.0f;
      v.push_back(make("Gemm_C_N_scaled" + t, "Gemm", {a, b, {4}}, scaled));
    }
  v.push_back(make("Gemm_C_scalar", "Gemm", {{2, 3}, {3, 4}, {}}, {{"beta", 0.5f}}));
  v.push_back(make("Gemm_C_M1", "Gemm", {{2, 3}, {3, 4}, {2, 1}}, {{"alpha", 1.5f}}));
  v.push_back(make("Gemm_C_1N", "Gemm", {{2, 3}, {3, 4}, {1, 4}}));

  // ---- reductions (axes: attribute before opset 13 for ReduceSum and 18 for the others, input after)
  auto reduce = [&](const std::string& label, const std::string& op, std::vector<int64_t> shape,
                    std::optional<std::vector<int64_t>> axes, int64_t keepdims, int64_t opset,
                    std::pair<double, double> range, bool axes_as_input) {
    Attrs a{{"keepdims", keepdims}};
    if (axes && !axes_as_input) a["axes"] = *axes;
    RuleCase c = make(label, op, {shape}, a, {range}, opset);
    if (axes && axes_as_input) {
      c.input_shapes.push_back({});
      c = with_const(c, 1, ints(*axes));
    }
    return c;
  };
  v.push_back(reduce("ReduceSum_attr_keep", "ReduceSum", {2, 3, 4}, std::vector<int64_t>{1}, 1, 11, any, false));
  v.push_back(reduce("ReduceSum_attr_drop", "ReduceSum", {2, 3, 4}, std::vector<int64_t>{0, 2}, 0, 12, any, false));
  v.push_back(reduce("ReduceSum_input_drop", "ReduceSum", {2, 3, 4}, std::vector<int64_t>{1}, 0, 13, any, true));
  v.push_back(reduce("ReduceSum_input_neg_keep", "ReduceSum", {2, 3, 4}, std::vector<int64_t>{-1}, 1, 13, any, true));
  v.push_back(reduce("ReduceSum_all_drop", "ReduceSum", {2, 3, 4}, std::nullopt, 0, 13, any, false));
  v.push_back(reduce("ReduceSum_all_keep_opset11", "ReduceSum", {2, 3}, std::nullopt, 1, 11, any, false));
  {
    RuleCase c = reduce("ReduceSum_noop_empty_axes", "ReduceSum", {2, 3}, std::nullopt, 0, 13, any, false);
    c.attrs["noop_with_empty_axes"] = int64_t{1};
    v.push_back(c);
  }
  v.push_back(reduce("ReduceMean_attr_drop", "ReduceMean", {2, 3, 4}, std::vector<int64_t>{1}, 0, 11, any, false));
  v.push_back(reduce("ReduceMean_attr_keep", "ReduceMean", {2, 3, 4}, std::vector<int64_t>{0, 2}, 1, 17, any, false));
  v.push_back(reduce("ReduceMean_input_drop", "ReduceMean", {2, 3, 4}, std::vector<int64_t>{-1}, 0, 18, any, true));
  v.push_back(reduce("ReduceMean_input_keep", "ReduceMean", {2, 3, 4}, std::vector<int64_t>{0, 1}, 1, 18, any, true));
  v.push_back(reduce("ReduceMean_all_drop", "ReduceMean", {2, 3}, std::nullopt, 0, 18, any, false));
  v.push_back(reduce("ReduceSumSquare_attr", "ReduceSumSquare", {2, 3, 4}, std::vector<int64_t>{1}, 0, 13, any, false));
  v.push_back(reduce("ReduceSumSquare_input", "ReduceSumSquare", {2, 3, 4}, std::vector<int64_t>{2}, 1, 18, any, true));
  v.push_back(reduce("ReduceL2_attr", "ReduceL2", {2, 3, 4}, std::vector<int64_t>{1}, 0, 13, any, false));
  v.push_back(reduce("ReduceL2_input", "ReduceL2", {2, 3, 4}, std::vector<int64_t>{0, 2}, 1, 18, any, true));
  v.push_back(reduce("ReduceLogSumExp_attr", "ReduceLogSumExp", {2, 3, 4}, std::vector<int64_t>{1}, 0, 13, any, false));
  v.push_back(reduce("ReduceLogSumExp_input", "ReduceLogSumExp", {2, 3, 4}, std::vector<int64_t>{-1}, 1, 18, any, true));
  v.push_back(reduce("ReduceMax_attr", "ReduceMax", {2, 3, 4}, std::vector<int64_t>{1}, 0, 13, any, false));
  v.push_back(reduce("ReduceMax_input", "ReduceMax", {2, 3, 4}, std::vector<int64_t>{0, 2}, 1, 18, any, true));
  v.push_back(reduce("ReduceMin_attr", "ReduceMin", {2, 3, 4}, std::vector<int64_t>{2}, 1, 13, any, false));
  v.push_back(reduce("ReduceMin_all", "ReduceMin", {2, 3}, std::nullopt, 0, 18, any, false));

  // ---- shape ops
  v.push_back(with_const(make("Reshape_infer", "Reshape", {{2, 3, 4}, {}}), 1, ints({6, -1})));
  v.push_back(with_const(make("Reshape_copy_dim", "Reshape", {{2, 3, 4}, {}}), 1, ints({0, 12})));
  v.push_back(make("Flatten_axis1", "Flatten", {{2, 3, 4}}, {{"axis", int64_t{1}}}));
  v.push_back(make("Flatten_axis0", "Flatten", {{2, 3, 4}}, {{"axis", int64_t{0}}}));
  v.push_back(with_const(make("Squeeze_input", "Squeeze", {{2, 1, 3}, {}}, {}, {}, 13), 1, ints({1})));
  v.push_back(make("Squeeze_attr", "Squeeze", {{2, 1, 3, 1}}, {{"axes", std::vector<int64_t>{1, -1}}}, {}, 11));
  v.push_back(make("Squeeze_all", "Squeeze", {{1, 3, 1}}, {}, {}, 13));
  v.push_back(with_const(make("Unsqueeze_input", "Unsqueeze", {{2, 3}, {}}, {}, {}, 13), 1, ints({0, -1})));
  v.push_back(make("Unsqueeze_attr", "Unsqueeze", {{2, 3}}, {{"axes", std::vector<int64_t>{1}}}, {}, 11));
  v.push_back(make("Transpose_perm", "Transpose", {{2, 3, 4}}, {{"perm", std::vector<int64_t>{2, 0, 1}}}));
  v.push_back(make("Transpose_reverse", "Transpose", {{2, 3, 4}}));
  v.push_back(with_const(make("Expand", "Expand", {{3, 1}, {}}), 1, ints({2, 3, 4})));
  v.push_back(make("Concat_axis1", "Concat", {{2, 3}, {2, 2}}, {{"axis", int64_t{1}}}));
  v.push_back(make("Concat_three_last", "Concat", {{2, 1, 2}, {2, 1, 3}, {2, 1, 1}}, {{"axis", int64_t{-1}}}));
  {
    // Repeated indices must accumulate.
    std::vector<int64_t> idx{0, 3, 3, 1, 0, 4};
    v.push_back(with_const(make("Gather_rows_repeated", "Gather", {{5, 3}, {}}), 1,
                           TensorData::from<int64_t>({2, 3}, std::span<const int64_t>(idx))));
    std::vector<int64_t> idx1{2, 0, 2};
    v.push_back(with_const(make("Gather_axis1", "Gather", {{2, 4, 3}, {}}, {{"axis", int64_t{1}}}), 1,
                           TensorData::from<int64_t>({3}, std::span<const int64_t>(idx1))));
    std::vector<int64_t> idx2{1, 1, 0, 2};
    v.push_back(with_const(make("Gather_last_axis_2d_indices", "Gather", {{2, 3}, {}}, {{"axis", int64_t{-1}}}), 1,
                           TensorData::from<int64_t>({2, 2}, std::span<const int64_t>(idx2))));
  }

  // ---- Slice (starts, ends, axes, steps as constants) and Split
  auto slice = [&](const std::string& label, std::vector<int64_t> shape, std::vector<int64_t> starts,
                   std::vector<int64_t> ends, std::optional<std::vector<int64_t>> axes,
                   std::optional<std::vector<int64_t>> steps) {  // steps need axes
    RuleCase c = make(label, "Slice", {shape, {}, {}}, {}, {}, 17);
    c = with_const(c, 1, ints(starts));
    c = with_const(c, 2, ints(ends));
    if (axes) {
      c.input_shapes.push_back({});
      c = with_const(c, 3, ints(*axes));
    }
    if (steps) {
      c.input_shapes.push_back({});
      c = with_const(c, 4, ints(*steps));
    }
    return c;
  };
  v.push_back(slice("Slice_two_axes", {4, 5}, {1, 0}, {3, -1}, std::vector<int64_t>{0, 1}, std::nullopt));
  v.push_back(slice("Slice_default_axes", {3, 4}, {1}, {3}, std::nullopt, std::nullopt));
  v.push_back(slice("Slice_negative_start_clamped_end", {2, 6}, {-4}, {100}, std::vector<int64_t>{1}, std::nullopt));
  v.push_back(slice("Slice_clamped_start", {2, 6}, {-100}, {2}, std::vector<int64_t>{-1}, std::nullopt));
  v.push_back(slice("Slice_step2", {3, 7}, {1}, {7}, std::vector<int64_t>{1}, std::vector<int64_t>{2}));
  v.push_back(slice("Slice_step3_end_pad", {3, 7}, {0}, {6}, std::vector<int64_t>{1}, std::vector<int64_t>{3}));
  v.push_back(slice("Slice_reverse", {3, 4}, {-1}, {std::numeric_limits<int64_t>::min()}, std::vector<int64_t>{0},
                    std::vector<int64_t>{-1}));
  v.push_back(slice("Slice_negative_step2_cropped", {3, 7}, {-1}, {-8}, std::vector<int64_t>{1},
                    std::vector<int64_t>{-2}));
  v.push_back(slice("Slice_mixed_steps", {4, 3, 8}, {3, 1}, {0, 8}, std::vector<int64_t>{0, -1},
                    std::vector<int64_t>{-1, 3}));
  v.push_back(slice("Slice_steps_both_axes", {5, 4}, {0, 3}, {5, 0}, std::vector<int64_t>{0, 1}, std::vector<int64_t>{2, -2}));
  v.push_back(slice("Slice_single_element_step", {6, 2}, {4}, {5}, std::vector<int64_t>{0}, std::vector<int64_t>{3}));
  {
    RuleCase c = make("Slice_opset9_attrs", "Slice", {{3, 5}},
                      {{"starts", std::vector<int64_t>{1, -3}}, {"ends", std::vector<int64_t>{3, 100}},
                       {"axes", std::vector<int64_t>{0, 1}}},
                      {}, 9);
    v.push_back(c);
  }
  {
    RuleCase c = with_const(make("Split_opset13_sizes", "Split", {{2, 5}, {}}, {{"axis", int64_t{1}}}, {}, 13), 1,
                            ints({2, 3}));
    c.num_outputs = 2;
    v.push_back(c);
    c = make("Split_opset18_num_outputs", "Split", {{6, 2}}, {{"num_outputs", int64_t{3}}}, {}, 18);
    c.num_outputs = 3;
    v.push_back(c);
    c = make("Split_opset11_attr_last_axis", "Split", {{2, 4}}, {{"axis", int64_t{-1}}, {"split", std::vector<int64_t>{1, 3}}},
             {}, 11);
    c.num_outputs = 2;
    v.push_back(c);
  }
  {
    // Repeated indices must accumulate; indices smaller than data along the other axis.
    std::vector<int64_t> idx{0, 3, 3, 1, 2, 2, 2, 0};
    v.push_back(with_const(make("GatherElements_axis1_repeated", "GatherElements", {{3, 4}, {}}, {{"axis", int64_t{1}}}),
                           1, TensorData::from<int64_t>({2, 4}, std::span<const int64_t>(idx))));
    std::vector<int64_t> idx0{2, -1, 0, 1, 1, 1};
    v.push_back(with_const(make("GatherElements_axis0_negative", "GatherElements", {{3, 3}, {}}), 1,
                           TensorData::from<int64_t>({2, 3}, std::span<const int64_t>(idx0))));
  }
  // ---- GatherND, ScatterND, ScatterElements, Mod
  {
    auto i64 = [](std::vector<int64_t> dims, const std::vector<int64_t>& v) {
      return TensorData::from<int64_t>(std::move(dims), std::span<const int64_t>(v));
    };
    // Repeated index tuples must accumulate.
    v.push_back(with_const(make("GatherND_repeated", "GatherND", {{3, 4, 2}, {}}, {}, {}, 16), 1,
                           i64({3, 2}, {0, 1, 2, 3, 0, 1})));
    v.push_back(with_const(make("GatherND_batch_dims1", "GatherND", {{2, 3, 4}, {}}, {{"batch_dims", int64_t{1}}}, {}, 16),
                           1, i64({2, 2, 1}, {2, 0, 1, 1})));
    v.push_back(with_const(make("GatherND_batch_dims2_scalar_slices", "GatherND", {{2, 2, 3}, {}},
                                {{"batch_dims", int64_t{2}}}, {}, 16),
                           1, i64({2, 2, 1}, {2, 0, 1, 1})));
    v.push_back(with_const(make("ScatterND_none", "ScatterND", {{4, 3}, {}, {2, 3}}, {}, {}, 16), 1,
                           i64({2, 1}, {1, 3})));
    v.push_back(with_const(make("ScatterND_opset11_elements", "ScatterND", {{3, 3}, {}, {2}}, {}, {}, 11), 1,
                           i64({2, 2}, {0, 2, 2, 1})));
    v.push_back(with_const(make("ScatterND_add_repeated", "ScatterND", {{3, 3}, {}, {3}},
                                {{"reduction", std::string("add")}}, {}, 16),
                           1, i64({3, 2}, {1, 0, 1, 0, 2, 2})));
    v.push_back(with_const(make("ScatterElements_none_axis1", "ScatterElements", {{3, 4}, {}, {3, 2}},
                                {{"axis", int64_t{1}}}, {}, 13),
                           1, i64({3, 2}, {1, 3, 0, 2, 3, -4})));
    v.push_back(with_const(make("ScatterElements_add_repeated_axis0", "ScatterElements", {{3, 2}, {}, {3, 2}},
                                {{"reduction", std::string("add")}}, {}, 16),
                           1, i64({3, 2}, {0, 2, 0, 2, 1, 1})));
    // A / B stays away from integers with these ranges and signs (trunc jumps there).
    v.push_back(signed_(make("Mod_fmod_broadcast", "Mod", {{2, 3}, {3}}, {{"fmod", int64_t{1}}}, {{0.2, 0.9}, {1.1, 1.6}})));
    v.push_back(signed_(make("Mod_fmod_quotient_above_one", "Mod", {{2, 3}, {2, 3}}, {{"fmod", int64_t{1}}},
                             {{2.3, 2.8}, {1.05, 1.1}})));
  }
  // ---- Resize: X is the only float input; roi, scales and sizes are constants ({-1} = omitted)
  {
    using S = std::string;
    auto f32s = [](const std::vector<float>& v) {
      return TensorData::from<float>({static_cast<int64_t>(v.size())}, std::span<const float>(v));
    };
    const std::vector<int64_t> none{-1};
    auto resize = [&](std::string label, std::vector<int64_t> x, std::optional<TensorData> roi,
                      std::optional<TensorData> scales, std::optional<TensorData> sizes, Attrs attrs, int64_t opset) {
      RuleCase c = make(std::move(label), "Resize", {std::move(x), none, none}, std::move(attrs), {}, opset);
      if (sizes) c.input_shapes.push_back({});
      if (roi) c = with_const(c, 1, *roi);
      if (scales) c = with_const(c, 2, *scales);
      if (sizes) c = with_const(c, 3, *sizes);
      return c;
    };
    v.push_back(resize("Resize_nearest_upsample_scales", {1, 2, 2, 3}, std::nullopt, f32s({1, 1, 2, 1.5}),
                       std::nullopt, {}, 13));
    v.push_back(resize("Resize_nearest_floor_asymmetric_opset11", {1, 1, 3, 4}, f32s({}), f32s({1, 1, 1.5, 0.75}),
                       std::nullopt, {{"nearest_mode", S("floor")}, {"coordinate_transformation_mode", S("asymmetric")}},
                       11));
    v.push_back(resize("Resize_linear_downsample_align_corners_opset11", {1, 1, 4, 5}, f32s({}), f32s({1, 1, 0.6f, 0.6f}),
                       std::nullopt, {{"mode", S("linear")}, {"coordinate_transformation_mode", S("align_corners")}}, 11));
    v.push_back(resize("Resize_linear_sizes_last_axis_pytorch_half_pixel", {2, 3, 4}, std::nullopt, std::nullopt,
                       ints({2, 3, 7}),
                       {{"mode", S("linear")}, {"coordinate_transformation_mode", S("pytorch_half_pixel")}}, 13));
    v.push_back(resize("Resize_linear_sizes_opset11_empty_scales", {2, 3, 4}, f32s({}), f32s({}), ints({2, 5, 3}),
                       {{"mode", S("linear")}}, 11));
    v.push_back(resize("Resize_cubic_exclude_outside_asymmetric", {1, 1, 3, 4}, std::nullopt, f32s({1, 1, 1.7f, 0.8f}),
                       std::nullopt,
                       {{"mode", S("cubic")}, {"exclude_outside", int64_t{1}}, {"cubic_coeff_a", -0.5f},
                        {"coordinate_transformation_mode", S("asymmetric")}},
                       13));
    v.push_back(resize("Resize_linear_antialias_axes", {2, 6, 5}, std::nullopt, f32s({0.5f, 0.7f}), std::nullopt,
                       {{"mode", S("linear")}, {"antialias", int64_t{1}}, {"axes", std::vector<int64_t>{1, -1}}}, 18));
    v.push_back(resize("Resize_cubic_antialias_downsample", {1, 1, 6, 6}, std::nullopt, f32s({1, 1, 0.5f, 0.6f}),
                       std::nullopt, {{"mode", S("cubic")}, {"antialias", int64_t{1}}}, 18));
    // Outputs beyond the input (x > 1.0 in roi) take the extrapolation value and carry no gradient.
    v.push_back(resize("Resize_tf_crop_and_resize_extrapolation", {1, 1, 4, 4}, f32s({0, 0, 0.4f, 0.6f, 1, 1, 1.2f, 0.9f}),
                       std::nullopt, ints({1, 1, 3, 3}),
                       {{"mode", S("linear")}, {"coordinate_transformation_mode", S("tf_crop_and_resize")},
                        {"extrapolation_value", 10.0f}},
                       13));
    v.push_back(resize("Resize_nearest_keep_aspect_not_larger", {1, 1, 4, 4}, std::nullopt, std::nullopt, ints({6, 10}),
                       {{"axes", std::vector<int64_t>{2, 3}}, {"keep_aspect_ratio_policy", S("not_larger")},
                        {"nearest_mode", S("round_prefer_ceil")}},
                       18));
    v.push_back(resize("Resize_linear_half_pixel_symmetric", {1, 1, 3, 5}, std::nullopt, f32s({1, 1, 1.7f, 0.7f}),
                       std::nullopt, {{"mode", S("linear")}, {"coordinate_transformation_mode", S("half_pixel_symmetric")}},
                       19));
  }
  // ---- normalization (variance inputs sampled positive)
  {
    v.push_back(make("LayerNormalization_last_axis", "LayerNormalization", {{2, 3, 4}, {4}, {4}}));
    v.push_back(make("LayerNormalization_axis1_no_bias", "LayerNormalization", {{2, 3, 4}, {3, 4}},
                     {{"axis", int64_t{1}}, {"epsilon", 0.1f}}));
    v.push_back(make("LayerNormalization_axis0_fused", "LayerNormalization", {{2, 3, 2}, {2, 3, 2}, {2, 3, 2}},
                     {{"axis", int64_t{0}}}));
    v.push_back(make("LayerNormalization_broadcast_scale", "LayerNormalization", {{2, 3, 4}, {1, 4}, {3, 1}},
                     {{"axis", int64_t{-2}}}));
    // stash_type 11 makes Mean and InvStdDev double, so the checker differentiates them too.
    RuleCase c = make("LayerNormalization_mean_invstd_outputs", "LayerNormalization", {{3, 5}, {5}, {5}},
                      {{"stash_type", int64_t{11}}});
    c.num_outputs = 3;
    v.push_back(c);
    c = make("LayerNormalization_float_stats_axis0", "LayerNormalization", {{3, 5}, {3, 5}, {5}}, {{"axis", int64_t{0}}});
    c.num_outputs = 3;
    v.push_back(c);
    // Constant Scale and Bias (frozen, as under LoRA): the fused gradient leaves dScale and dBias unnamed and its
    // kernels compute neither. And a constant X with trained Scale and Bias: dX unnamed.
    {
      const std::vector<double> scale{0.5, -1.5, 2.0, 0.75}, bias{0.1, 0.2, -0.3, 0.4};
      std::vector<double> x(24);
      for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(1.7 * static_cast<double>(i) + 0.3);
      const auto f64 = [](std::vector<int64_t> dims, const std::vector<double>& d) {
        return TensorData::from<double>(std::move(dims), std::span<const double>(d));
      };
      v.push_back(with_const(with_const(make("LayerNormalization_frozen_scale_bias", "LayerNormalization",
                                             {{2, 3, 4}, {4}, {4}}), 1, f64({4}, scale)), 2, f64({4}, bias)));
      v.push_back(with_const(make("LayerNormalization_constant_input", "LayerNormalization", {{2, 3, 4}, {4}, {4}}),
                             0, f64({2, 3, 4}, x)));
    }
    v.push_back(make("InstanceNormalization", "InstanceNormalization", {{2, 3, 4}, {3}, {3}}));
    v.push_back(make("InstanceNormalization_2d_opset11", "InstanceNormalization", {{2, 2, 2, 3}, {2}, {2}},
                     {{"epsilon", 0.01f}}, {}, 11));
    v.push_back(make("GroupNormalization_opset21", "GroupNormalization", {{2, 4, 3}, {4}, {4}},
                     {{"num_groups", int64_t{2}}}, {}, 21));
    v.push_back(make("GroupNormalization_opset18_per_group", "GroupNormalization", {{2, 6, 2, 2}, {3}, {3}},
                     {{"num_groups", int64_t{3}}}, {}, 18));
    const Ranges bn{any, any, any, any, pos};
    v.push_back(make("BatchNormalization_inference", "BatchNormalization", {{2, 3, 4}, {3}, {3}, {3}, {3}}, {}, bn, 15));
    v.push_back(make("BatchNormalization_inference_2d_opset9", "BatchNormalization", {{4, 3}, {3}, {3}, {3}, {3}},
                     {{"epsilon", 0.01f}}, bn, 9));
    // Training mode needs all three outputs (the ONNX schema says so).
    c = make("BatchNormalization_training_2d", "BatchNormalization", {{5, 3}, {3}, {3}, {3}, {3}},
             {{"training_mode", int64_t{1}}}, bn, 15);
    c.num_outputs = 3;
    v.push_back(c);
    c = make("BatchNormalization_training_running_stats", "BatchNormalization", {{3, 2, 4}, {2}, {2}, {2}, {2}},
             {{"training_mode", int64_t{1}}, {"momentum", 0.8f}}, bn, 15);
    c.num_outputs = 3;
    v.push_back(c);
    // Rank 4 through the fused BatchNormalizationGrad (opset 15+), and opset 14's decomposition.
    c = make("BatchNormalization_training_4d_fused", "BatchNormalization", {{3, 2, 2, 3}, {2}, {2}, {2}, {2}},
             {{"training_mode", int64_t{1}}, {"epsilon", 0.01f}}, bn, 17);
    c.num_outputs = 3;
    v.push_back(c);
    c = make("BatchNormalization_training_opset14", "BatchNormalization", {{3, 2, 4}, {2}, {2}, {2}, {2}},
             {{"training_mode", int64_t{1}}}, bn, 14);
    c.num_outputs = 3;
    v.push_back(c);
  }
  // ---- convolution and pooling (gradients/rules/conv.cpp)
  {
    using I = std::vector<int64_t>;
    const std::string S = "auto_pad";
    v.push_back(make("Conv_3x3_pad1_bias", "Conv", {{2, 3, 5, 5}, {4, 3, 3, 3}, {4}}, {{"pads", I{1, 1, 1, 1}}}));
    v.push_back(make("Conv_group2_stride_dilation_asym_pads", "Conv", {{1, 4, 7, 6}, {6, 2, 3, 2}},
                     {{"group", int64_t{2}}, {"strides", I{2, 1}}, {"dilations", I{1, 2}}, {"pads", I{1, 0, 0, 1}}}));
    v.push_back(make("Conv_1d_same_upper_stride2", "Conv", {{2, 2, 7}, {3, 2, 3}, {3}},
                     {{"strides", I{2}}, {S, std::string("SAME_UPPER")}}));
    v.push_back(make("Conv_3d_pads", "Conv", {{1, 2, 4, 3, 3}, {2, 2, 2, 2, 2}}, {{"pads", I{1, 0, 1, 0, 1, 0}}}));
    v.push_back(make("Conv_depthwise_stride2_pad1", "Conv", {{2, 3, 6, 6}, {3, 1, 3, 3}, {3}},
                     {{"group", int64_t{3}}, {"strides", I{2, 2}}, {"pads", I{1, 1, 1, 1}}}));
    v.push_back(make("ConvTranspose_stride2_outpad_bias", "ConvTranspose", {{1, 2, 3, 3}, {2, 3, 3, 3}, {3}},
                     {{"strides", I{2, 2}}, {"pads", I{1, 1, 0, 0}}, {"output_padding", I{1, 0}}}));
    v.push_back(make("ConvTranspose_group2_dilation", "ConvTranspose", {{1, 4, 3, 4}, {4, 1, 2, 3}},
                     {{"group", int64_t{2}}, {"dilations", I{2, 1}}, {"strides", I{1, 2}}}));
    v.push_back(make("ConvTranspose_1d_same_lower", "ConvTranspose", {{2, 2, 4}, {2, 3, 3}},
                     {{"strides", I{2}}, {S, std::string("SAME_LOWER")}}));
    v.push_back(make("ConvTranspose_output_shape", "ConvTranspose", {{1, 1, 3, 3}, {1, 2, 3, 3}},
                     {{"strides", I{2, 2}}, {"output_shape", I{6, 7}}}));
    v.push_back(make("MaxPool_2x2_stride2", "MaxPool", {{2, 3, 6, 6}}, {{"kernel_shape", I{2, 2}}, {"strides", I{2, 2}}}));
    // Non-overlapping windows need no scatter reduction, so this works before opset 16.
    v.push_back(make("MaxPool_2x2_opset13_pad", "MaxPool", {{1, 2, 5, 5}},
                     {{"kernel_shape", I{2, 2}}, {"strides", I{2, 2}}, {"pads", I{1, 1, 0, 0}}}, {}, 13));
    v.push_back(make("MaxPool_3x3_stride2_pad1_overlapping", "MaxPool", {{1, 2, 7, 7}},
                     {{"kernel_shape", I{3, 3}}, {"strides", I{2, 2}}, {"pads", I{1, 1, 1, 1}}}));
    v.push_back(make("MaxPool_1d_ceil_dilation", "MaxPool", {{2, 2, 9}},
                     {{"kernel_shape", I{3}}, {"strides", I{2}}, {"dilations", I{2}}, {"ceil_mode", int64_t{1}}}));
    {
      RuleCase c = make("MaxPool_with_indices", "MaxPool", {{1, 2, 4, 5}}, {{"kernel_shape", I{2, 2}}});
      c.num_outputs = 2;
      v.push_back(c);
    }
    v.push_back(make("MaxPool_3d", "MaxPool", {{1, 1, 4, 4, 3}}, {{"kernel_shape", I{2, 2, 2}}, {"strides", I{2, 1, 1}}}));
    v.push_back(make("AveragePool_2x2_stride2", "AveragePool", {{2, 3, 6, 6}},
                     {{"kernel_shape", I{2, 2}}, {"strides", I{2, 2}}}));
    v.push_back(make("AveragePool_pads_exclude", "AveragePool", {{1, 2, 5, 5}},
                     {{"kernel_shape", I{3, 3}}, {"strides", I{2, 2}}, {"pads", I{1, 1, 1, 1}}}));
    v.push_back(make("AveragePool_pads_include", "AveragePool", {{1, 2, 5, 5}},
                     {{"kernel_shape", I{3, 3}}, {"strides", I{2, 2}}, {"pads", I{1, 0, 0, 1}},
                      {"count_include_pad", int64_t{1}}}));
    v.push_back(make("AveragePool_1d_ceil", "AveragePool", {{2, 2, 8}},
                     {{"kernel_shape", I{3}}, {"strides", I{2}}, {"ceil_mode", int64_t{1}}}));
    v.push_back(make("AveragePool_ceil_include_pad", "AveragePool", {{1, 2, 8, 7}},
                     {{"kernel_shape", I{3, 2}}, {"strides", I{2, 2}}, {"pads", I{1, 0, 0, 0}}, {"ceil_mode", int64_t{1}},
                      {"count_include_pad", int64_t{1}}}));
    v.push_back(make("AveragePool_same_upper_3d", "AveragePool", {{1, 2, 3, 4, 3}},
                     {{"kernel_shape", I{2, 3, 2}}, {S, std::string("SAME_UPPER")}}));
    v.push_back(make("GlobalAveragePool", "GlobalAveragePool", {{2, 3, 4, 5}}));
    v.push_back(make("GlobalMaxPool", "GlobalMaxPool", {{2, 3, 4, 5}}));
  }
  {
    // Tile, Pad, Clip, the remaining reductions, CumSum, Dropout, DepthToSpace/SpaceToDepth, Einsum.
    using I = std::vector<int64_t>;
    using S = std::string;
    v.push_back(with_const(make("Tile_2x3_reps21", "Tile", {{2, 3}, {2}}), 1, ints({2, 1})));
    v.push_back(with_const(make("Tile_3d_reps123", "Tile", {{2, 1, 3}, {3}}), 1, ints({1, 2, 3})));
    // Negative pads crop: axis 0 gains a row in front and loses one at the end.
    {
      RuleCase c = with_const(make("Pad_const_value_negative_pads", "Pad", {{3, 3}, {4}, {}}), 1, ints({1, 0, -1, 2}));
      v.push_back(with_const(c, 2, f64_scalar(0.7)));
    }
    {
      RuleCase c = make("Pad_opset18_axes", "Pad", {{2, 3, 4}, {2}, {-1}, {1}}, {}, {}, 18);
      c = with_const(c, 1, ints({1, 2}));
      v.push_back(with_const(c, 3, ints({-1})));
    }
    v.push_back(make("Pad_opset10_attr", "Pad", {{2, 3}}, {{"pads", I{0, 1, 1, 0}}}, {}, 10));
    {
      RuleCase c = with_const(make("Clip_min_max_inputs", "Clip", {{4, 5}, {}, {}}, {}, {}, 13), 1, f64_scalar(-0.5));
      v.push_back(with_const(c, 2, f64_scalar(0.4)));
    }
    v.push_back(with_const(make("Clip_max_only", "Clip", {{3, 4}, {-1}, {}}, {}, {}, 13), 2, f64_scalar(0.3)));
    v.push_back(make("Clip_opset10_attrs", "Clip", {{3, 4}}, {{"min", -0.3f}, {"max", 0.5f}}, {}, 10));
    v.push_back(signed_(with_const(make("ReduceProd_axis1", "ReduceProd", {{2, 3, 4}, {1}}, {{"keepdims", int64_t{0}}},
                                        {{0.5, 1.5}}, 18),
                                   1, ints({1}))));
    v.push_back(signed_(make("ReduceProd_opset13_axes_attr", "ReduceProd", {{2, 3, 2}}, {{"axes", I{0, 2}}},
                             {{0.5, 1.5}}, 13)));
    v.push_back(kinked(with_const(make("ReduceL1_last_axis", "ReduceL1", {{3, 4}, {1}}, {{"keepdims", int64_t{0}}}, {}, 18),
                                  1, ints({-1}))));
    v.push_back(kinked(make("ReduceL1_all_opset13", "ReduceL1", {{2, 3}}, {}, {}, 13)));
    v.push_back(with_const(make("ReduceLogSum_axis0", "ReduceLogSum", {{3, 4}, {1}}, {}, {{0.5, 2.0}}, 18), 1, ints({0})));
    v.push_back(make("ReduceLogSum_opset13_keepdims0", "ReduceLogSum", {{2, 3, 2}},
                     {{"axes", I{1}}, {"keepdims", int64_t{0}}}, {{0.5, 2.0}}, 13));
    v.push_back(with_const(make("CumSum_axis1", "CumSum", {{3, 4}, {}}), 1, TensorData::scalar<int64_t>(1)));
    v.push_back(with_const(make("CumSum_exclusive_reverse_axis0", "CumSum", {{4, 3}, {}},
                                {{"exclusive", int64_t{1}}, {"reverse", int64_t{1}}}),
                           1, TensorData::scalar<int64_t>(0)));
    v.push_back(with_const(make("CumSum_exclusive_neg_axis", "CumSum", {{2, 5}, {}}, {{"exclusive", int64_t{1}}}), 1,
                           TensorData::scalar<int64_t>(-1)));
    {
      RuleCase c = make("Dropout_training_seeded", "Dropout", {{4, 5}, {}, {}}, {{"seed", int64_t{5}}}, {}, 13);
      c = with_const(c, 1, f64_scalar(0.3));
      c = with_const(c, 2, bools({}, {true}));
      c.num_outputs = 2;
      v.push_back(c);
    }
    {
      RuleCase c = make("Dropout_training_mode_false", "Dropout", {{3, 4}, {}, {}}, {}, {}, 13);
      c = with_const(c, 1, f64_scalar(0.5));
      c = with_const(c, 2, bools({}, {false}));
      c.num_outputs = 2;
      v.push_back(c);
    }
    v.push_back(make("Dropout_inference", "Dropout", {{3, 4}}, {}, {}, 13));
    v.push_back(make("DepthToSpace_DCR", "DepthToSpace", {{2, 8, 2, 3}}, {{"blocksize", int64_t{2}}}, {}, 13));
    v.push_back(make("DepthToSpace_CRD", "DepthToSpace", {{1, 8, 3, 2}},
                     {{"blocksize", int64_t{2}}, {"mode", S("CRD")}}, {}, 13));
    v.push_back(make("SpaceToDepth_b2", "SpaceToDepth", {{2, 2, 4, 6}}, {{"blocksize", int64_t{2}}}, {}, 13));
    v.push_back(make("Einsum_matmul", "Einsum", {{2, 3}, {3, 4}}, {{"equation", S("ij,jk->ik")}}));
    v.push_back(make("Einsum_batched_transposed", "Einsum", {{2, 3, 4}, {2, 5, 4}}, {{"equation", S("bij,bkj->bik")}}));
    v.push_back(make("Einsum_implicit", "Einsum", {{2, 3}, {3, 4}}, {{"equation", S("ij,jk")}}));
    v.push_back(make("Einsum_inner_product_scalar", "Einsum", {{5}, {5}}, {{"equation", S("i,i")}}));
    v.push_back(make("Einsum_sum_lonely_indices", "Einsum", {{2, 3, 4}, {4}}, {{"equation", S("ijk,k->i")}}));
    v.push_back(make("Einsum_transpose_unary", "Einsum", {{2, 3}}, {{"equation", S(" ij -> ji")}}));
    v.push_back(make("Einsum_outer_three", "Einsum", {{2}, {3}, {2, 3, 4}}, {{"equation", S("i,j,ijk->k")}}));
    v.push_back(make("Einsum_ellipsis_broadcast_batch", "Einsum", {{2, 1, 3, 4}, {1, 5, 4, 2}},
                     {{"equation", S("...ij,...jk->...ik")}}));
    v.push_back(make("Einsum_ellipsis_implicit", "Einsum", {{2, 3, 4}, {4}}, {{"equation", S("...j,j")}}));
    v.push_back(with_const(make("Trilu_upper_k1", "Trilu", {{3, 4}, {}}), 1, TensorData::scalar<int64_t>(1)));
    v.push_back(make("Trilu_lower_batched", "Trilu", {{2, 3, 4}}, {{"upper", int64_t{0}}}));
    {
      RuleCase c = with_const(make("TopK_axis1_largest", "TopK", {{3, 5}, {1}}), 1, ints({2}));
      c.num_outputs = 2;
      v.push_back(c);
    }
    {
      RuleCase c = with_const(make("TopK_axis0_smallest", "TopK", {{4, 3}, {1}}, {{"axis", int64_t{0}}, {"largest", int64_t{0}}}),
                              1, ints({3}));
      c.num_outputs = 2;
      v.push_back(c);
    }
    auto i64 = [](std::vector<int64_t> dims, const std::vector<int64_t>& v) {
      return TensorData::from<int64_t>(std::move(dims), std::span<const int64_t>(v));
    };
    const std::vector<double> w3{0.5, 2.0, 1.5};
    const TensorData weight3 = TensorData::from<double>({3}, std::span<const double>(w3));
    v.push_back(with_const(make("NLL_mean", "NegativeLogLikelihoodLoss", {{3, 4}, {3}}, {}, {{-2, -0.1}}, 13), 1,
                           ints({1, 0, 3})));
    {
      RuleCase c = make("NLL_NCd_weight_ii_mean", "NegativeLogLikelihoodLoss", {{2, 3, 2}, {2, 2}, {3}},
                        {{"ignore_index", int64_t{1}}}, {{-2, -0.1}}, 13);
      c = with_const(c, 1, i64({2, 2}, {0, 1, 2, 2}));
      v.push_back(with_const(c, 2, weight3));
    }
    v.push_back(with_const(make("NLL_none_negative_ii", "NegativeLogLikelihoodLoss", {{2, 3, 2}, {2, 2}},
                                {{"reduction", S("none")}, {"ignore_index", int64_t{-1}}}, {}, 13),
                           1, i64({2, 2}, {0, -1, 2, 1})));
    v.push_back(with_const(make("SCE_mean", "SoftmaxCrossEntropyLoss", {{3, 4}, {3}}, {}, {{-2, 2}}, 13), 1,
                           ints({1, 0, 3})));
    {
      RuleCase c = make("SCE_none_log_prob", "SoftmaxCrossEntropyLoss", {{2, 3, 2}, {2, 2}}, {{"reduction", S("none")}},
                        {{-2, 2}}, 13);
      c = with_const(c, 1, i64({2, 2}, {0, 1, 2, 2}));
      c.num_outputs = 2;
      v.push_back(c);
    }
    {
      RuleCase c = make("SCE_sum_weight_ii_opset12", "SoftmaxCrossEntropyLoss", {{2, 3, 2}, {2, 2}, {3}},
                        {{"reduction", S("sum")}, {"ignore_index", int64_t{0}}}, {{-2, 2}}, 12);
      c = with_const(c, 1, i64({2, 2}, {0, 1, 2, 1}));
      v.push_back(with_const(c, 2, weight3));
    }
    {
      RuleCase c = make("SCE_mean_weight_ii", "SoftmaxCrossEntropyLoss", {{4, 3}, {4}, {3}},
                        {{"ignore_index", int64_t{2}}}, {{-2, 2}}, 13);
      c = with_const(c, 1, ints({0, 2, 1, 1}));
      v.push_back(with_const(c, 2, weight3));
    }
  }
  // ---- GatherGrad cases: negative and int32 indices, an inner axis with 2-D indices; CastLike
  {
    std::vector<int64_t> neg{-1, 0, -5, 4, -1};
    v.push_back(with_const(make("Gather_negative_indices", "Gather", {{5, 2}, {}}), 1,
                           TensorData::from<int64_t>({5}, std::span<const int64_t>(neg))));
    std::vector<int32_t> i32{2, -3, 2, 0, 1, 2};
    v.push_back(with_const(make("Gather_axis1_int32_2d", "Gather", {{2, 3, 2}, {}}, {{"axis", int64_t{-2}}}), 1,
                           TensorData::from<int32_t>({3, 2}, std::span<const int32_t>(i32))));
  }
  v.push_back(with_const(make("CastLike_f64", "CastLike", {{2, 3}, {}}), 1, f64_scalar(0.0)));
  add_recurrent_cases(v);
  add_spatial_cases(v);
  add_normalization_cases(v);
  return v;
}

}  // namespace

const std::vector<RuleCase>& rule_cases() {
  static const std::vector<RuleCase> cases = build();
  return cases;
}

}  // namespace onnxtrain::test
