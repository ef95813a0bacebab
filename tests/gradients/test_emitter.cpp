// The Expr emitter's symbolic type propagation, the rule registry, and the graphs the rules emit: they must
// pass our structural checks and agree with ONNX's own shape inference.
#include <gtest/gtest.h>

#include <algorithm>

#include "gradients/builder.h"
#include "gradients/fused.h"
#include "gradients/rule.h"
#include "gradients/rule_cases.h"
#include "graph/error.h"
#include "graph/expr.h"
#include "graph/shape_inference.h"
#include "graph/validate.h"

namespace onnxtrain {
namespace {

Dim d(int64_t v) { return Dim::of(v); }
Dim s(const char* name) { return Dim::sym(name); }

// A graph with typed inputs to emit into.
struct Fixture {
  Graph g;
  GraphBuilder b{g, "t/"};
  Expr in(const std::string& name, Shape shape, DType t = DType::Float32) {
    TypeInfo ti{t, std::move(shape)};
    g.inputs.push_back({name, ti});
    return value(b, name);
  }
  const Node& producer(const Expr& e) const {
    for (const Node& n : g.nodes)
      if (std::find(n.outputs.begin(), n.outputs.end(), e.name) != n.outputs.end()) return n;
    throw Error("no producer for " + e.name);
  }
  void check(const std::vector<Expr>& outs) {
    for (const Expr& e : outs) g.outputs.push_back({e.name, e.type});
    check_graph(g, "emitter test");
  }
};

TEST(BroadcastShapes, NumpyRules) {
  EXPECT_EQ(broadcast_shapes(Shape{d(2), d(3)}, Shape{d(3)}), (Shape{d(2), d(3)}));
  EXPECT_EQ(broadcast_shapes(Shape{d(2), d(1), d(4)}, Shape{d(3), d(1)}), (Shape{d(2), d(3), d(4)}));
  EXPECT_EQ(broadcast_shapes(Shape{}, Shape{d(5)}), (Shape{d(5)}));
  EXPECT_EQ(broadcast_shapes(Shape{d(2)}, Shape{d(3)}), std::nullopt);
  EXPECT_EQ(broadcast_shapes(std::nullopt, Shape{d(3)}), std::nullopt);
}

TEST(BroadcastShapes, Symbols) {
  EXPECT_EQ(broadcast_shapes(Shape{s("N"), d(3)}, Shape{s("N"), d(1)}), (Shape{s("N"), d(3)}));
  EXPECT_EQ(broadcast_shapes(Shape{d(1)}, Shape{s("N")}), (Shape{s("N")}));
  // A known size other than 1 decides: the symbol is either that size or 1.
  EXPECT_EQ(broadcast_shapes(Shape{d(5)}, Shape{s("N")}), (Shape{d(5)}));
  // Two different symbols may be different sizes with one of them 1: unknown.
  EXPECT_EQ(broadcast_shapes(Shape{s("N")}, Shape{s("M")}), (Shape{Dim{}}));
  EXPECT_EQ(broadcast_shapes(Shape{s("N")}, Shape{Dim{}}), (Shape{Dim{}}));
}

TEST(Expr, ArithmeticPropagatesTypesAndEmitsNodes) {
  Fixture f;
  Expr x = f.in("x", {s("B"), d(1), d(4)});
  Expr y = f.in("y", {d(3), d(1)});
  Expr z = x * y;
  EXPECT_EQ(z.dtype(), DType::Float32);
  EXPECT_EQ(*z.shape(), (Shape{s("B"), d(3), d(4)}));
  EXPECT_EQ(f.producer(z).op_type, "Mul");
  EXPECT_EQ(f.producer(z).inputs, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(*f.g.type_of(z.name), z.type);

  Expr w = 1.0 - z / 2.0;
  EXPECT_EQ(*w.shape(), *z.shape());
  const Node& sub = f.producer(w);
  EXPECT_EQ(sub.op_type, "Sub");
  // The scalar takes the Expr's element type.
  EXPECT_EQ(f.g.type_of(sub.inputs[0])->dtype, DType::Float32);
  EXPECT_EQ(*f.g.type_of(sub.inputs[0])->shape, Shape{});
  f.check({w});
}

TEST(Expr, ExactIdentitiesAreFolded) {
  Fixture f;
  Expr x = f.in("x", {d(2)});
  EXPECT_EQ((x * 1.0).name, "x");
  EXPECT_EQ((x + 0.0).name, "x");
  EXPECT_EQ((x / 1.0).name, "x");
  EXPECT_EQ(cast(x, DType::Float32).name, "x");
  EXPECT_TRUE(f.g.nodes.empty());
  EXPECT_NE((x * 2.0).name, "x");
}

TEST(Expr, MixedTypesAndBadShapesFailClearly) {
  Fixture f;
  Expr x = f.in("x", {d(2), d(3)});
  Expr i = f.in("i", {d(2), d(3)}, DType::Int64);
  Expr y = f.in("y", {d(4)});
  EXPECT_THROW(x + i, Error);
  try {
    (void)(x + y);
    FAIL() << "expected a broadcast error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not broadcast"), std::string::npos) << e.what();
  }
  EXPECT_THROW(matmul(x, y), Error);  // inner dims 3 vs 4
  EXPECT_THROW(value(f.b, "nowhere"), Error);
  EXPECT_THROW(transpose(x, {0, 0}), Error);
}

TEST(Expr, MatMulShapes) {
  Fixture f;
  auto mm = [&](Shape a, Shape b) {
    static int k = 0;
    Expr ea = f.in("a" + std::to_string(k), std::move(a));
    Expr eb = f.in("b" + std::to_string(k++), std::move(b));
    return *matmul(ea, eb).shape();
  };
  EXPECT_EQ(mm({d(2), d(3)}, {d(3), d(4)}), (Shape{d(2), d(4)}));
  EXPECT_EQ(mm({s("B"), d(2), d(3)}, {d(3), d(4)}), (Shape{s("B"), d(2), d(4)}));
  EXPECT_EQ(mm({d(2), d(1), d(2), d(3)}, {d(5), d(3), d(2)}), (Shape{d(2), d(5), d(2), d(2)}));
  EXPECT_EQ(mm({d(3)}, {d(3), d(4)}), (Shape{d(4)}));
  EXPECT_EQ(mm({d(3)}, {d(7), d(3), d(4)}), (Shape{d(7), d(4)}));
  EXPECT_EQ(mm({d(2), d(3)}, {d(3)}), (Shape{d(2)}));
  EXPECT_EQ(mm({d(3)}, {d(3)}), Shape{});
  EXPECT_EQ(mm({s("M"), s("K")}, {s("K"), s("N")}), (Shape{s("M"), s("N")}));
}

TEST(Expr, ReductionsTransposeAndShapeOps) {
  Fixture f;
  Expr x = f.in("x", {s("B"), d(3), d(4)});
  EXPECT_EQ(*reduce_sum(x, {-1}, false).shape(), (Shape{s("B"), d(3)}));
  EXPECT_EQ(*reduce_sum(x, {0, 2}, true).shape(), (Shape{d(1), d(3), d(1)}));
  Expr all = reduce_sum_all(x);
  EXPECT_EQ(*all.shape(), Shape{});
  EXPECT_EQ(f.producer(all).inputs.size(), 1u);  // no axes input: every axis
  Expr rs = reduce_sum(x, {1}, false);
  ASSERT_EQ(f.producer(rs).inputs.size(), 2u);  // axes as an input (opset 13+)
  EXPECT_EQ(f.g.type_of(f.producer(rs).inputs[1])->dtype, DType::Int64);
  EXPECT_THROW(reduce_sum(x, {3}, false), Error);

  EXPECT_EQ(*transpose(x, {2, 0, 1}).shape(), (Shape{d(4), s("B"), d(3)}));
  EXPECT_EQ(*transpose(x, {}).shape(), (Shape{d(4), d(3), s("B")}));
  EXPECT_EQ(*transpose_last2(x).shape(), (Shape{s("B"), d(4), d(3)}));

  Expr sh = shape_of(x);
  EXPECT_EQ(sh.dtype(), DType::Int64);
  EXPECT_EQ(*sh.shape(), Shape{d(3)});
  EXPECT_EQ(*reshape(x, int64s(f.b, {0, -1})).shape(), (Shape{s("B"), d(12)}));
  Expr y = f.in("y", {d(2), d(3), d(4)});
  EXPECT_EQ(*reshape(y, int64s(f.b, {-1, 4})).shape(), (Shape{d(6), d(4)}));
  EXPECT_EQ(*reshape_like(reshape(y, int64s(f.b, {24})), x).shape(), *x.shape());
  EXPECT_EQ(*expand(f.in("e", {d(3), d(1)}), int64s(f.b, {2, 3, 5})).shape(), (Shape{d(2), d(3), d(5)}));

  Expr c = cast(x, DType::Float64);
  EXPECT_EQ(c.dtype(), DType::Float64);
  EXPECT_EQ(std::get<int64_t>(f.producer(c).attributes.at("to")), static_cast<int64_t>(DType::Float64));
  Expr cond = less(x, zeros_like(x));
  EXPECT_EQ(cond.dtype(), DType::Bool);
  Expr wh = where(cond, x, scalar(f.b, DType::Float32, 0.0));
  EXPECT_EQ(*wh.shape(), *x.shape());
  Expr total = sum({x, f.in("r", {d(4)}), ones_like(x)});
  EXPECT_EQ(*total.shape(), *x.shape());
  EXPECT_EQ(f.producer(total).inputs.size(), 3u);
  f.check({wh, total, c});
}

TEST(Expr, ReduceMeanStaticAndDynamicCounts) {
  Fixture f;
  Expr x = f.in("x", {d(2), d(3), d(4)});
  Expr m = reduce_mean(x, {1}, false);
  EXPECT_EQ(*m.shape(), (Shape{d(2), d(4)}));
  const Node& div = f.producer(m);
  ASSERT_EQ(div.op_type, "Div");
  const Node& cnt = f.producer(value(f.b, div.inputs[1]));
  ASSERT_EQ(cnt.op_type, "Constant");
  EXPECT_EQ(cnt.attr_tensor("value")->as<float>()[0], 3.0f);

  Expr y = f.in("y", {s("B"), d(3)});
  Expr my = reduce_mean(y, {0}, true);
  EXPECT_EQ(*my.shape(), (Shape{d(1), d(3)}));
  bool has_prod = std::any_of(f.g.nodes.begin(), f.g.nodes.end(), [](const Node& n) { return n.op_type == "ReduceProd"; });
  EXPECT_TRUE(has_prod) << "an unknown count is computed from the run-time shape";
  EXPECT_EQ(*reduce_mean_all(y).shape(), Shape{});
  f.check({m, my});
}

TEST(Registry, ListsRulesAndRejectsDuplicates) {
  const auto ops = default_rules().ops();
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Neg", "Pow", "Sqrt", "Exp", "Log", "Abs", "Reciprocal", "Relu",
                         "Sigmoid", "Tanh", "Identity", "Cast", "Where", "MatMul", "Gemm", "ReduceSum", "ReduceMean",
                         "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Softmax", "LogSoftmax"})
    EXPECT_TRUE(std::count(ops.begin(), ops.end(), std::make_pair(std::string(), std::string(op)))) << op;
  EXPECT_TRUE(std::is_sorted(ops.begin(), ops.end()));
  EXPECT_NE(default_rules().find("ai.onnx", "Add"), nullptr);
  EXPECT_EQ(default_rules().find("", "NoSuchOp"), nullptr);
  GradientRegistry r;
  r.add("Foo", [](RuleContext&) {});
  EXPECT_THROW(r.add("Foo", [](RuleContext&) {}), Error);
  EXPECT_TRUE(is_non_differentiable_op("", "Shape"));
  EXPECT_TRUE(is_non_differentiable_op("", "Equal"));
  EXPECT_FALSE(is_non_differentiable_op("", "Add"));
}

// Runs one rule on a node with symbolic shapes and returns the gradient graph.
struct RuleRun {
  Graph g;
  std::vector<std::optional<Expr>> dx;
  std::vector<std::string> reads;
};

RuleRun run_rule(const std::string& op, std::vector<Shape> in_shapes, Shape out_shape,
                 std::map<std::string, Attribute> attrs = {}, int64_t opset = 17) {
  RuleRun r;
  Node n;
  n.name = "fwd";
  n.op_type = op;
  n.attributes = std::move(attrs);
  std::vector<Expr> xs;
  GraphBuilder b(r.g, "grad/");
  for (size_t i = 0; i < in_shapes.size(); ++i) {
    std::string name = "x" + std::to_string(i);
    r.g.inputs.push_back({name, {DType::Float32, in_shapes[i]}});
    n.inputs.push_back(name);
    xs.push_back(value(b, name));
  }
  n.outputs = {"y"};
  r.g.value_info["y"] = {DType::Float32, out_shape};
  r.g.inputs.push_back({"dy", {DType::Float32, out_shape}});
  r.g.nodes.push_back(n);
  RuleContext c(b, r.g.nodes[0], opset, xs, {value(b, "y")}, {value(b, "dy")},
                std::vector<bool>(in_shapes.size(), true));
  default_rules().find("", op)->operator()(c);
  r.dx = c.results();
  r.reads = c.reads();
  for (size_t i = 0; i < r.dx.size(); ++i)
    if (r.dx[i]) r.g.outputs.push_back({r.dx[i]->name, r.dx[i]->type});
  check_graph(r.g, "rule " + op);
  return r;
}

TEST(Rules, MatMulWith2dWeightFoldsTheBatchIntoRows) {
  RuleRun r = run_rule("MatMul", {{s("B"), s("T"), d(3)}, {d(3), d(5)}}, {s("B"), s("T"), d(5)});
  ASSERT_TRUE(r.dx[0] && r.dx[1]);
  EXPECT_EQ(*r.dx[0]->shape(), (Shape{s("B"), s("T"), d(3)}));
  EXPECT_EQ(*r.dx[1]->shape(), (Shape{d(3), d(5)}));  // no [B, 3, 5] intermediate to sum away
  for (const Node& n : r.g.nodes)
    if (n.op_type == "MatMul") {
      for (const std::string& o : n.outputs) EXPECT_LE(r.g.type_of(o)->shape->size(), 3u) << o;
    }
}

TEST(Rules, ActivationsEmitFusedOpsReadingOutputs) {
  for (const char* op : {"Relu", "Sigmoid", "Tanh"}) {
    RuleRun r = run_rule(op, {{s("N"), d(4)}}, {s("N"), d(4)});
    ASSERT_TRUE(r.dx[0]) << op;
    EXPECT_EQ(r.g.nodes.back().domain, kFusedGradDomain) << op;
    EXPECT_EQ(r.g.nodes.back().op_type, std::string(op) + "Grad");
    EXPECT_EQ(r.reads, std::vector<std::string>{"y"}) << op << " should not keep its input alive";
  }
}

TEST(Rules, ReductionWithSymbolicShapesExpandsToTheInput) {
  RuleRun r = run_rule("ReduceMean", {{s("B"), d(3), d(4)}}, {s("B"), d(4)},
                       {{"axes", std::vector<int64_t>{1}}, {"keepdims", int64_t{0}}}, 17);
  ASSERT_TRUE(r.dx[0]);
  EXPECT_EQ(*r.dx[0]->shape(), (Shape{s("B"), d(3), d(4)}));
}

TEST(FusedFunctions, BodiesAreStandardOnnxAndWellFormed) {
  auto fns = fused_grad_functions();
  std::vector<std::string> names;
  for (const Function& f : fns) {
    names.push_back(f.name);
    EXPECT_EQ(f.domain, kFusedGradDomain);
    // LayerNormalizationGrad has another signature, and the GELU and MaxPool gradients read X (gradients/fused.h).
    const bool ln = f.name == "LayerNormalizationGrad", bn = f.name == "BatchNormalizationGrad";
    const bool from_x = f.name.rfind("Gelu", 0) == 0 || f.name == "MaxPoolGrad" || f.name == "AveragePoolGrad";
    const bool conv = f.name == "ConvGrad";
    // GatherGrad and SumToShape take the target shape (gradients/fused.h).
    const bool gather = f.name == "GatherGrad", sum_to = f.name == "SumToShape";
    const bool roi = f.name == "MaxRoiPoolGrad", grid = f.name == "GridSampleGrad", rnn = f.name == "RNNGrad" || f.name == "GRUGrad";
    const bool lstm = f.name == "LSTMGrad";
    const bool dropout = f.name == "DropoutMask";  // not a gradient: LoRA adapter dropout's mask
    const std::vector<std::string> ins = dropout  ? std::vector<std::string>{"x", "counter"}
                                         : ln     ? std::vector<std::string>{"dY", "X", "Scale", "Mean", "InvStdDev"}
                                         : roi    ? std::vector<std::string>{"dY", "X", "rois"}
                                         : grid   ? std::vector<std::string>{"dY", "X", "grid"}
                                         : lstm   ? std::vector<std::string>{"X", "W", "R", "B", "sequence_lens",
                                                                             "initial_h", "initial_c", "P", "dY",
                                                                             "dY_h", "dY_c"}
                                         : rnn    ? std::vector<std::string>{"X", "W", "R", "B", "sequence_lens",
                                                                             "initial_h", "dY", "dY_h"}
                                         : bn     ? std::vector<std::string>{"dY", "X", "Scale"}
                                         : conv   ? std::vector<std::string>{"dY", "X", "W"}
                                         : from_x ? std::vector<std::string>{"dY", "X"}
                                         : gather ? std::vector<std::string>{"dY", "indices", "shape"}
                                         : sum_to ? std::vector<std::string>{"dY", "shape"}
                                                  : std::vector<std::string>{"dY", "Y"};
    const std::vector<std::string> outs = dropout  ? std::vector<std::string>{"mask"}
                                          : ln || bn ? std::vector<std::string>{"dX", "dScale", "dBias"}
                                          : conv     ? std::vector<std::string>{"dX", "dW", "dB"}
                                          : grid     ? std::vector<std::string>{"dX", "dGrid"}
                                          : lstm     ? std::vector<std::string>{"dX", "dW", "dR", "dB", "dsequence_lens",
                                                                                "dinitial_h", "dinitial_c", "dP"}
                                          : rnn      ? std::vector<std::string>{"dX", "dW", "dR", "dB", "dsequence_lens",
                                                                                "dinitial_h"}
                                                     : std::vector<std::string>{"dX"};
    EXPECT_EQ(f.inputs, ins);
    EXPECT_EQ(f.outputs, outs);
    EXPECT_EQ(f.opset_imports.at(""), 17);
    std::vector<std::string> defined = f.inputs;
    for (const Node& n : f.nodes) {
      EXPECT_TRUE(n.domain.empty()) << f.name << " body uses " << n.domain << "." << n.op_type;
      for (const std::string& i : n.inputs)
        EXPECT_TRUE(std::count(defined.begin(), defined.end(), i)) << f.name << ": '" << i << "' used before defined";
      defined.insert(defined.end(), n.outputs.begin(), n.outputs.end());
    }
    for (const std::string& o : f.outputs)
      EXPECT_TRUE(std::count(defined.begin(), defined.end(), o)) << f.name << ": " << o;
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"AveragePoolGrad", "BatchNormalizationGrad", "ConvGrad", "DropoutMask",
                                              "GRUGrad", "GatherGrad", "GeluGrad", "GeluTanhGrad", "GridSampleGrad",
                                              "LSTMGrad", "LayerNormalizationGrad", "LogSoftmaxGrad", "MaxPoolGrad",
                                              "MaxRoiPoolGrad", "RNNGrad", "ReluGrad", "SigmoidGrad", "SoftmaxGrad",
                                              "SumToShape", "TanhGrad"}));

  // A model calling each function passes the ONNX checker, and ONNX infers the functions' output types.
  Model m;
  m.opset_imports = {{"", 17}, {kFusedGradDomain, 1}};
  m.functions = fns;
  m.graph.name = "fused";
  m.graph.inputs = {{"dy", {DType::Float32, Shape{d(2), d(3)}}}, {"y", {DType::Float32, Shape{d(2), d(3)}}},
                    {"scale", {DType::Float32, Shape{d(3)}}}, {"stat", {DType::Float32, Shape{d(2), d(1)}}}};
  for (const Function& f : fns) {
    Node n;
    n.name = f.name;
    n.op_type = f.name;
    n.domain = kFusedGradDomain;
    if (f.name == "LayerNormalizationGrad" || f.name == "BatchNormalizationGrad") {  // BN: N = 2, C = 3
      const bool ln = f.name == "LayerNormalizationGrad";
      n.inputs = ln ? std::vector<std::string>{"dy", "y", "scale", "stat", "stat"}
                    : std::vector<std::string>{"dy", "y", "scale"};
      n.attributes = {{ln ? "axis" : "epsilon", ln ? Attribute{int64_t{-1}} : Attribute{1e-5f}}};
      n.outputs = {f.name + "_out", f.name + "_dscale", f.name + "_dbias"};
      m.graph.outputs.push_back({n.outputs[1], {DType::Float32, Shape{d(3)}}});
      m.graph.outputs.push_back({n.outputs[2], {DType::Float32, Shape{d(3)}}});
    } else if (f.name == "MaxPoolGrad") {  // 2x2 pooling of a [1, 1, 4, 4] input, attributes by reference
      m.graph.inputs.push_back({"pool_dy", {DType::Float32, Shape{d(1), d(1), d(2), d(2)}}});
      m.graph.inputs.push_back({"pool_x", {DType::Float32, Shape{d(1), d(1), d(4), d(4)}}});
      n.inputs = {"pool_dy", "pool_x"};
      n.outputs = {f.name + "_out"};
      n.attributes = {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}};
      m.graph.nodes.push_back(n);
      m.graph.outputs.push_back({n.outputs[0], {DType::Float32, Shape{d(1), d(1), d(4), d(4)}}});
      continue;
    } else if (f.name == "GatherGrad" || f.name == "SumToShape") {
      // GatherGrad: dY [2, 3] gathered by indices [2] from data [4, 3]; SumToShape: dY [2, 3] summed to [3].
      const bool gg = f.name == "GatherGrad";
      const std::vector<int64_t> target = gg ? std::vector<int64_t>{4, 3} : std::vector<int64_t>{3};
      m.graph.initializers[f.name + "_shape"] =
          TensorData::from<int64_t>({static_cast<int64_t>(target.size())}, std::span<const int64_t>(target));
      n.inputs = {"dy"};
      if (gg) {
        m.graph.initializers["gg_indices"] = TensorData::from<int64_t>({2}, std::span<const int64_t>(std::vector<int64_t>{3, -4}));
        n.inputs.push_back("gg_indices");
        n.attributes = {{"axis", int64_t{0}}};
      }
      n.inputs.push_back(f.name + "_shape");
      n.outputs = {f.name + "_out"};
      m.graph.nodes.push_back(n);
      Shape out;
      for (int64_t v : target) out.push_back(d(v));
      m.graph.outputs.push_back({n.outputs[0], {DType::Float32, out}});
      continue;
    } else if (f.name == "ConvGrad") {  // 3x3 convolution of [1, 3, 5, 5] by [2, 3, 3, 3], pads 1
      using I = std::vector<int64_t>;
      m.graph.inputs.push_back({"conv_dy", {DType::Float32, Shape{d(1), d(2), d(5), d(5)}}});
      m.graph.inputs.push_back({"conv_x", {DType::Float32, Shape{d(1), d(3), d(5), d(5)}}});
      m.graph.inputs.push_back({"conv_w", {DType::Float32, Shape{d(2), d(3), d(3), d(3)}}});
      n.inputs = {"conv_dy", "conv_x", "conv_w"};
      n.outputs = {f.name + "_dx", f.name + "_dw", f.name + "_db"};
      n.attributes = {{"kernel_shape", I{3, 3}}, {"strides", I{1, 1}}, {"dilations", I{1, 1}},
                      {"pads", I{1, 1, 1, 1}}, {"group", int64_t{1}}};
      m.graph.nodes.push_back(n);
      m.graph.outputs.push_back({n.outputs[0], {DType::Float32, Shape{d(1), d(3), d(5), d(5)}}});
      m.graph.outputs.push_back({n.outputs[1], {DType::Float32, Shape{d(2), d(3), d(3), d(3)}}});
      m.graph.outputs.push_back({n.outputs[2], {DType::Float32, Shape{d(2)}}});
      continue;
    } else if (f.name == "MaxRoiPoolGrad") {  // two regions of a [2, 3, 5, 6] input, pooled to 2x3
      m.graph.inputs.push_back({"roi_dy", {DType::Float32, Shape{d(2), d(3), d(2), d(3)}}});
      m.graph.inputs.push_back({"roi_x", {DType::Float32, Shape{d(2), d(3), d(5), d(6)}}});
      m.graph.inputs.push_back({"roi_rois", {DType::Float32, Shape{d(2), d(5)}}});
      n.inputs = {"roi_dy", "roi_x", "roi_rois"};
      n.outputs = {f.name + "_out"};
      n.attributes = {{"pooled_shape", std::vector<int64_t>{2, 3}}, {"spatial_scale", 0.5f}};
      m.graph.nodes.push_back(n);
      m.graph.outputs.push_back({n.outputs[0], {DType::Float32, Shape{d(2), d(3), d(5), d(6)}}});
      continue;
    } else if (f.name == "LSTMGrad") {  // S 4, batch 2, input 3, hidden 5, with B, no P
      m.graph.inputs.push_back({"lstm_x", {DType::Float32, Shape{d(4), d(2), d(3)}}});
      m.graph.inputs.push_back({"lstm_w", {DType::Float32, Shape{d(1), d(20), d(3)}}});
      m.graph.inputs.push_back({"lstm_r", {DType::Float32, Shape{d(1), d(20), d(5)}}});
      m.graph.inputs.push_back({"lstm_b", {DType::Float32, Shape{d(1), d(40)}}});
      m.graph.inputs.push_back({"lstm_h0", {DType::Float32, Shape{d(1), d(2), d(5)}}});
      m.graph.inputs.push_back({"lstm_c0", {DType::Float32, Shape{d(1), d(2), d(5)}}});
      m.graph.inputs.push_back({"lstm_dy", {DType::Float32, Shape{d(4), d(1), d(2), d(5)}}});
      m.graph.inputs.push_back({"lstm_dyh", {DType::Float32, Shape{d(1), d(2), d(5)}}});
      m.graph.inputs.push_back({"lstm_dyc", {DType::Float32, Shape{d(1), d(2), d(5)}}});
      n.inputs = {"lstm_x", "lstm_w", "lstm_r", "lstm_b", "", "lstm_h0", "lstm_c0", "", "lstm_dy", "lstm_dyh",
                  "lstm_dyc"};
      n.outputs = {f.name + "_dx", f.name + "_dw", f.name + "_dr", f.name + "_db", "", f.name + "_dh0",
                   f.name + "_dc0", ""};
      n.attributes = {{"hidden_size", int64_t{5}}, {"reverse", int64_t{0}}};
      m.graph.nodes.push_back(n);
      m.graph.outputs.push_back({n.outputs[0], {DType::Float32, Shape{d(4), d(2), d(3)}}});
      m.graph.outputs.push_back({n.outputs[1], {DType::Float32, Shape{d(1), d(20), d(3)}}});
      m.graph.outputs.push_back({n.outputs[2], {DType::Float32, Shape{d(1), d(20), d(5)}}});
      m.graph.outputs.push_back({n.outputs[3], {DType::Float32, Shape{d(1), d(40)}}});
      m.graph.outputs.push_back({n.outputs[5], {DType::Float32, Shape{d(1), d(2), d(5)}}});
      m.graph.outputs.push_back({n.outputs[6], {DType::Float32, Shape{d(1), d(2), d(5)}}});
      continue;
    } else if (f.name == "GRUGrad") {  // S 4, batch 2, input 3, hidden 5, with B
      m.graph.inputs.push_back({"gru_x", {DType::Float32, Shape{d(4), d(2), d(3)}}});
      m.graph.inputs.push_back({"gru_w", {DType::Float32, Shape{d(1), d(15), d(3)}}});
      m.graph.inputs.push_back({"gru_r", {DType::Float32, Shape{d(1), d(15), d(5)}}});
      m.graph.inputs.push_back({"gru_b", {DType::Float32, Shape{d(1), d(30)}}});
      m.graph.inputs.push_back({"gru_h0", {DType::Float32, Shape{d(1), d(2), d(5)}}});
      m.graph.inputs.push_back({"gru_dy", {DType::Float32, Shape{d(4), d(1), d(2), d(5)}}});
      m.graph.inputs.push_back({"gru_dyh", {DType::Float32, Shape{d(1), d(2), d(5)}}});
      n.inputs = {"gru_x", "gru_w", "gru_r", "gru_b", "", "gru_h0", "gru_dy", "gru_dyh"};
      n.outputs = {f.name + "_dx", f.name + "_dw", f.name + "_dr", f.name + "_db", "", f.name + "_dh0"};
      n.attributes = {{"hidden_size", int64_t{5}}, {"linear_before_reset", int64_t{1}}, {"reverse", int64_t{0}}};
      m.graph.nodes.push_back(n);
      m.graph.outputs.push_back({n.outputs[0], {DType::Float32, Shape{d(4), d(2), d(3)}}});
      m.graph.outputs.push_back({n.outputs[1], {DType::Float32, Shape{d(1), d(15), d(3)}}});
      m.graph.outputs.push_back({n.outputs[2], {DType::Float32, Shape{d(1), d(15), d(5)}}});
      m.graph.outputs.push_back({n.outputs[3], {DType::Float32, Shape{d(1), d(30)}}});
      m.graph.outputs.push_back({n.outputs[5], {DType::Float32, Shape{d(1), d(2), d(5)}}});
      continue;
    } else if (f.name == "RNNGrad") {  // S 4, batch 2, input 3, hidden 5; no B, no sequence_lens
      m.graph.inputs.push_back({"rnn_x", {DType::Float32, Shape{d(4), d(2), d(3)}}});
      m.graph.inputs.push_back({"rnn_w", {DType::Float32, Shape{d(1), d(5), d(3)}}});
      m.graph.inputs.push_back({"rnn_r", {DType::Float32, Shape{d(1), d(5), d(5)}}});
      m.graph.inputs.push_back({"rnn_h0", {DType::Float32, Shape{d(1), d(2), d(5)}}});
      m.graph.inputs.push_back({"rnn_dy", {DType::Float32, Shape{d(4), d(1), d(2), d(5)}}});
      m.graph.inputs.push_back({"rnn_dyh", {DType::Float32, Shape{d(1), d(2), d(5)}}});
      n.inputs = {"rnn_x", "rnn_w", "rnn_r", "", "", "rnn_h0", "rnn_dy", "rnn_dyh"};
      n.outputs = {f.name + "_dx", f.name + "_dw", f.name + "_dr", "", "", f.name + "_dh0"};
      n.attributes = {{"hidden_size", int64_t{5}}, {"reverse", int64_t{0}}};
      m.graph.nodes.push_back(n);
      m.graph.outputs.push_back({n.outputs[0], {DType::Float32, Shape{d(4), d(2), d(3)}}});
      m.graph.outputs.push_back({n.outputs[1], {DType::Float32, Shape{d(1), d(5), d(3)}}});
      m.graph.outputs.push_back({n.outputs[2], {DType::Float32, Shape{d(1), d(5), d(5)}}});
      m.graph.outputs.push_back({n.outputs[5], {DType::Float32, Shape{d(1), d(2), d(5)}}});
      continue;
    } else if (f.name == "GridSampleGrad") {  // [2, 3, 5, 6] sampled at [2, 4, 3] points
      m.graph.inputs.push_back({"gs_dy", {DType::Float32, Shape{d(2), d(3), d(4), d(3)}}});
      m.graph.inputs.push_back({"gs_x", {DType::Float32, Shape{d(2), d(3), d(5), d(6)}}});
      m.graph.inputs.push_back({"gs_grid", {DType::Float32, Shape{d(2), d(4), d(3), d(2)}}});
      n.inputs = {"gs_dy", "gs_x", "gs_grid"};
      n.outputs = {f.name + "_dx", f.name + "_dgrid"};
      n.attributes = {{"mode", std::string("bicubic")}, {"padding_mode", std::string("reflection")},
                      {"interpolation", int64_t{2}}, {"padding", int64_t{2}}, {"align_corners", int64_t{0}}};
      m.graph.nodes.push_back(n);
      m.graph.outputs.push_back({n.outputs[0], {DType::Float32, Shape{d(2), d(3), d(5), d(6)}}});
      m.graph.outputs.push_back({n.outputs[1], {DType::Float32, Shape{d(2), d(4), d(3), d(2)}}});
      continue;
    } else if (f.name == "DropoutMask") {  // the mask of dy's shape for an int64 scalar counter
      m.graph.initializers["dropout_counter"] = TensorData::scalar<int64_t>(3);
      n.inputs = {"dy", "dropout_counter"};
      n.outputs = {f.name + "_out"};
      n.attributes = {{"seed", int64_t{7}}, {"ratio", 0.25f}};
      m.graph.nodes.push_back(n);
      m.graph.outputs.push_back({n.outputs[0], {DType::Bool, Shape{d(2), d(3)}}});
      continue;
    } else if (f.name == "AveragePoolGrad") {  // 2x2 average pooling of a [1, 1, 4, 4] input
      using I = std::vector<int64_t>;
      m.graph.inputs.push_back({"avg_dy", {DType::Float32, Shape{d(1), d(1), d(2), d(2)}}});
      m.graph.inputs.push_back({"avg_x", {DType::Float32, Shape{d(1), d(1), d(4), d(4)}}});
      n.inputs = {"avg_dy", "avg_x"};
      n.outputs = {f.name + "_out"};
      n.attributes = {{"kernel_shape", I{2, 2}}, {"strides", I{2, 2}}, {"pads", I{0, 0, 0, 0}},
                      {"count_include_pad", int64_t{0}}, {"ceil_mode", int64_t{0}}};
      m.graph.nodes.push_back(n);
      m.graph.outputs.push_back({n.outputs[0], {DType::Float32, Shape{d(1), d(1), d(4), d(4)}}});
      continue;
    } else {
      n.inputs = {"dy", "y"};
      n.outputs = {f.name + "_out"};
      if (f.name.find("Softmax") != std::string::npos) n.attributes = {{"axis", int64_t{-1}}};
    }
    m.graph.nodes.push_back(n);
    m.graph.outputs.push_back({n.outputs[0], {DType::Float32, Shape{d(2), d(3)}}});
  }
  EXPECT_NO_THROW(validate_model(m, "fused functions"));
  // A body runs at its caller's opset (export_gradient_model imports the model's), so it must be valid at every
  // later one too: ReduceMean's axes, say, is an attribute before 18 and an input from then on.
  for (int64_t opset : {18, 20, 21}) {
    SCOPED_TRACE("opset " + std::to_string(opset));
    m.opset_imports[""] = opset;
    for (Function& f : m.functions) f.opset_imports[""] = opset;
    EXPECT_NO_THROW(validate_model(m, "fused functions"));
  }
}

// Every gradient graph the rules emit for the table's cases passes our checks, and wherever ONNX's shape
// inference knows a type, the emitter's propagated type agrees with it.
TEST(Rules, PropagatedTypesAgreeWithOnnxShapeInference) {
  size_t checked = 0;
  for (const test::RuleCase& c : test::rule_cases()) {
    if (c.opset < 13) continue;  // our emitted ops (Unsqueeze with an axes input...) need opset 13+
    SCOPED_TRACE(c.label);
    Model m;
    m.opset_imports = {{"", std::max<int64_t>(c.opset, 17)}, {kFusedGradDomain, 1}};
    Graph& g = m.graph;
    Node n;
    n.name = "fwd";
    n.op_type = c.op;
    n.attributes = c.attrs;
    std::vector<std::string> wrt;
    for (size_t i = 0; i < c.input_shapes.size(); ++i) {
      std::string name = "x" + std::to_string(i);
      if (i < c.const_inputs.size() && c.const_inputs[i]) {
        TensorData v = *c.const_inputs[i];
        // Float constants (Clip bounds, class weights) must match the float32 data here.
        if (v.dtype == DType::Float64) {
          std::vector<float> f;
          for (double x : v.as<double>()) f.push_back(static_cast<float>(x));
          v = TensorData::from<float>(v.dims, std::span<const float>(f));
        }
        g.initializers[name] = v;
      } else if (!c.input_shapes[i].empty() && c.input_shapes[i][0] == -1) {
        name.clear();  // an omitted optional input (rule_cases.h)
      } else {
        Shape sh;
        for (int64_t v : c.input_shapes[i]) sh.push_back(d(v));
        g.inputs.push_back({name, {DType::Float32, sh}});
        wrt.push_back(name);
      }
      n.inputs.push_back(name);
    }
    n.outputs = {"y"};
    // Multi-output ops (Split): the loss reads only "y", so the others reach their rule as zeros.
    for (int k = 1; k < c.num_outputs; ++k) n.outputs.push_back("y" + std::to_string(k));
    g.nodes.push_back(n);
    infer_shapes(m);
    GraphBuilder b(g, "test/");
    Expr loss = reduce_sum_all(value(b, "y") * value(b, "y"));
    Expr seed = scalar(b, loss.dtype(), 1.0);
    GradientRequest req;
    req.wrt = wrt;
    req.outputs = {loss.name};
    req.output_grads = {seed.name};
    GradientResult res = build_gradients(g, m.opset_imports, req);
    for (const std::string& w : wrt) g.outputs.push_back({res.grads.at(w), *g.type_of(w)});
    ASSERT_NO_THROW(check_graph(g, c.label));

    const auto ours = g.value_info;
    g.value_info.clear();
    infer_shapes(m);
    for (const auto& [name, t] : ours) {
      auto it = g.value_info.find(name);
      if (it == g.value_info.end()) continue;
      const TypeInfo& theirs = it->second;
      EXPECT_EQ(t.dtype, theirs.dtype) << name;
      if (!t.shape || !theirs.shape) continue;
      ASSERT_EQ(t.shape->size(), theirs.shape->size()) << name << ": ours " << to_string(*t.shape) << ", ONNX "
                                                       << to_string(*theirs.shape);
      for (size_t k = 0; k < t.shape->size(); ++k)
        if ((*t.shape)[k].known() && (*theirs.shape)[k].known()) {
          EXPECT_EQ((*t.shape)[k].value, (*theirs.shape)[k].value) << name << " dim " << k;
        }
      ++checked;
    }
    for (const std::string& w : wrt) {
      const TypeInfo& gt = ours.at(res.grads.at(w));
      EXPECT_EQ(gt.shape, g.type_of(w)->shape) << "gradient of " << w << " has the input's static shape";
    }
  }
  EXPECT_GT(checked, 100u);
}

}  // namespace
}  // namespace onnxtrain
