// The optimizer's update ops (onnxtrain.AdamUpdate and its variants, formulas/optimizer_updates.h): the native
// kernel and the op's standard-ONNX function body, both generated from formulas::adam_update, give the same bits in
// float32 and float64 for every variant, whether the body's ops run one by one or fused; append_optimizer emits one
// such node per weight; and a checkpoint carries the bodies its training step uses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>

#include "common/mlp_model.h"
#include "executor/executor.h"
#include "gradients/fused_graph.h"
#include "graph/model_io.h"
#include "graph/validate.h"
#include "optimizers/optimizer.h"
#include "training/session.h"

namespace onnxtrain {
namespace {

const Function& function_named(const std::vector<Function>& fs, const std::string& name) {
  auto it = std::find_if(fs.begin(), fs.end(), [&](const Function& f) { return f.name == name; });
  if (it == fs.end()) throw std::runtime_error("no function " + name);
  return *it;
}

template <class T> Tensor filled(const std::vector<int64_t>& shape, std::mt19937& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(static_cast<size_t>(numel_of(shape)));
  for (T& x : v) x = static_cast<T>(u(rng));
  return Tensor::from_vector<T>(shape, v);
}

struct Variant {
  std::string op;
  DType dtype;
  bool first_step = false;  // SGD with momentum: the flag that copies the gradient into the buffer
};

std::string name_of(const Variant& v) {
  return v.op + (v.dtype == DType::Float64 ? "_f64" : "_f32") + (v.first_step ? "_first_step" : "");
}

void PrintTo(const Variant& v, std::ostream* os) { *os << name_of(v); }

bool is_array(const std::string& in) {
  return in == "P" || in == "G" || in == "M" || in == "V" || in == "Vmax" || in == "Buf" || in == "Sum";
}

// One update op on random inputs, run by its native kernel (body = false) or as its inlined body's standard ops,
// fused into one elementwise kernel or node by node.
std::vector<Tensor> run_update(const Variant& var, bool body, bool fuse) {
  const std::vector<Function> fns = optimizer_update_functions();
  const Function& f = function_named(fns, var.op);
  // 70,001 elements: several threads' chunks and a vector loop's tail.
  const std::vector<int64_t> shape{7, 10001};
  std::mt19937 rng(7);
  std::map<std::string, Tensor> feeds;
  std::map<std::string, TypeInfo> types;
  // Hyper-parameters as the optimizer computes them for step 3 of lr 1e-3, wd 0.01 (any values would do).
  const double b1 = 0.9, b2 = 0.999, t = 3, lr = 1e-3;
  const bool decoupled = var.op.rfind("AdamW", 0) == 0;
  const std::map<std::string, double> scalars{
      {"Beta1", b1}, {"OneMinusBeta1", 1 - b1}, {"Beta2", b2}, {"OneMinusBeta2", 1 - b2},
      {"BiasCorrection2Sqrt", std::sqrt(1 - std::pow(b2, t))}, {"Eps", 1e-8}, {"StepSize", lr / (1 - std::pow(b1, t))},
      {"Decay", decoupled ? 1 - lr * 0.01 : 0.01}, {"Lr", lr}, {"Momentum", 0.9}, {"OneMinusDampening", 1 - 0.1},
      {"Clr", lr / (1 + 2 * 0.1)}};
  for (const std::string& in : f.inputs) {
    if (is_array(in)) {
      // p, g, m and the momentum buffer of either sign; the second moments and sums positive, vmax above v about
      // half the time.
      const bool positive = in == "V" || in == "Vmax" || in == "Sum";
      const double lo = positive ? 1e-6 : -2, hi = positive ? 1e-2 : 2;
      feeds[in] = var.dtype == DType::Float64 ? filled<double>(shape, rng, lo, hi) : filled<float>(shape, rng, lo, hi);
      types[in] = static_type(var.dtype, shape);
    } else if (in == "FirstStep") {
      feeds[in] = Tensor::from_vector<bool>({}, {var.first_step});
      types[in] = static_type(DType::Bool, {});
    } else {
      const double s = scalars.at(in);
      feeds[in] = var.dtype == DType::Float64 ? Tensor::from_vector<double>({}, {s})
                                              : Tensor::from_vector<float>({}, {static_cast<float>(s)});
      types[in] = static_type(var.dtype, {});
    }
  }
  const Graph g = fused_op_graph(f.name, {}, f.inputs, types, f.outputs, var.dtype);
  ExecutorOptions options;
  options.functions = fns;
  options.prefer_function_bodies = body;
  options.fuse_elementwise = fuse;
  Executor e(g, {{"", 17}, {kOptimizerDomain, 1}}, std::make_shared<TensorStore>(), options);
  // The two paths must really differ: one node natively, the body's standard ops otherwise.
  EXPECT_EQ(e.graph().nodes.size() == 1, !body) << e.graph().nodes.size();
  std::vector<Tensor> out = e.run(feeds);
  std::vector<Tensor> copies;
  for (const Tensor& o : out) copies.push_back(o.clone());
  return copies;
}

class UpdateOp : public ::testing::TestWithParam<Variant> {};

TEST_P(UpdateOp, KernelEqualsItsFunctionBodyBitForBit) {
  const Variant var = GetParam();
  const std::vector<Tensor> native = run_update(var, false, true);
  for (bool fuse : {true, false}) {
    const std::vector<Tensor> body = run_update(var, true, fuse);
    ASSERT_EQ(native.size(), body.size());
    ASSERT_EQ(native.size(), function_named(optimizer_update_functions(), var.op).outputs.size());
    for (size_t k = 0; k < native.size(); ++k) {
      ASSERT_EQ(native[k].dtype, var.dtype);
      ASSERT_EQ(native[k].shape, body[k].shape);
      const size_t bytes = static_cast<size_t>(native[k].numel()) * dtype_size(var.dtype);
      EXPECT_EQ(std::memcmp(native[k].data, body[k].data, bytes), 0)
          << "output " << k << (fuse ? " (body fused)" : " (body node by node)");
    }
  }
}

std::vector<Variant> variants() {
  std::vector<Variant> v;
  for (const Function& f : optimizer_update_functions())
    for (DType t : {DType::Float32, DType::Float64}) {
      v.push_back({f.name, t});
      if (std::find(f.inputs.begin(), f.inputs.end(), "FirstStep") != f.inputs.end()) v.push_back({f.name, t, true});
    }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Variants, UpdateOp, ::testing::ValuesIn(variants()),
                         [](const ::testing::TestParamInfo<Variant>& i) { return name_of(i.param); });

// The kernel computes torch's order: checked on one element against the formula written out in doubles here.
TEST(UpdateOp, KernelFollowsTorchsOrder) {
  const Variant var{"AdamWAmsgradUpdate", DType::Float64};
  const std::vector<Tensor> out = run_update(var, false, true);
  std::mt19937 rng(7);  // run_update's draws, in input order: P, G, M, V, Vmax
  const std::vector<int64_t> shape{7, 10001};
  const Tensor p = filled<double>(shape, rng, -2, 2), g = filled<double>(shape, rng, -2, 2),
               m = filled<double>(shape, rng, -2, 2), v = filled<double>(shape, rng, 1e-6, 1e-2),
               vmax = filled<double>(shape, rng, 1e-6, 1e-2);
  const double b1 = 0.9, b2 = 0.999, lr = 1e-3, bc2 = std::sqrt(1 - std::pow(b2, 3)), step = lr / (1 - std::pow(b1, 3));
  for (int64_t i : {int64_t{0}, int64_t{12345}, p.numel() - 1}) {
    const double pi = p.ptr<double>()[i], gi = g.ptr<double>()[i];
    const double nm = m.ptr<double>()[i] * b1 + gi * (1 - b1);
    const double nv = v.ptr<double>()[i] * b2 + gi * gi * (1 - b2);
    const double mx = std::max(vmax.ptr<double>()[i], nv);
    const double np = pi * (1 - lr * 0.01) - step * nm / (std::sqrt(mx) / bc2 + 1e-8);
    EXPECT_EQ(out[0].ptr<double>()[i], np) << i;
    EXPECT_EQ(out[1].ptr<double>()[i], nm) << i;
    EXPECT_EQ(out[2].ptr<double>()[i], nv) << i;
    EXPECT_EQ(out[3].ptr<double>()[i], mx) << i;
  }
}

TEST(UpdateOp, BodiesAreStandardOnnxFromOpset13) {
  const std::vector<Function> fns = optimizer_update_functions();
  std::set<std::string> names;
  for (const Function& f : fns) {
    names.insert(f.name);
    EXPECT_EQ(f.domain, kOptimizerDomain);
    for (int64_t opset = 13; opset <= 21; ++opset) EXPECT_EQ(function_error_at_opset(f, opset), "") << f.name << opset;
    for (const Node& n : f.nodes) EXPECT_TRUE(n.domain.empty()) << f.name << ": " << n.describe();
  }
  EXPECT_EQ(names, (std::set<std::string>{"AdamUpdate", "AdamL2Update", "AdamWUpdate", "AdamAmsgradUpdate",
                                          "AdamL2AmsgradUpdate", "AdamWAmsgradUpdate", "SgdUpdate", "SgdL2Update",
                                          "SgdMomentumUpdate", "SgdL2MomentumUpdate", "SgdNesterovUpdate",
                                          "SgdL2NesterovUpdate", "AdagradUpdate", "AdagradL2Update"}));
}

// append_optimizer writes one update node per weight, its variant chosen by the weight's group.
TEST(UpdateOp, OneNodePerWeight) {
  for (bool amsgrad : {false, true}) {
    Model m = test::relu_mlp<float>("mlp", 3, 5, 1, 0.5f, test::Fc2::Gemm);
    std::map<std::string, std::string> grads;
    for (const auto& [name, t] : m.graph.initializers) {
      grads[name] = "grad." + name;
      m.graph.inputs.push_back({"grad." + name, static_type(t.dtype, t.dims)});
    }
    OptimizerSpec spec;
    spec.kind = "adamw";
    spec.amsgrad = amsgrad;
    spec.groups = {{{"*.bias"}, std::nullopt, 0.0}};
    const size_t before = m.graph.nodes.size();
    append_optimizer(m.graph, grads, spec);
    std::map<std::string, int> ops;
    for (size_t i = before; i < m.graph.nodes.size(); ++i) {
      const Node& n = m.graph.nodes[i];
      if (n.domain == kOptimizerDomain) {
        ++ops[n.op_type];
        continue;
      }
      // The update is one node, not standard ops: nothing else reads the optimizer's moments.
      for (const std::string& in : n.inputs) EXPECT_EQ(in.find(".exp_avg"), std::string::npos) << n.describe();
    }
    const std::string w = amsgrad ? "AdamWAmsgradUpdate" : "AdamWUpdate", b = amsgrad ? "AdamAmsgradUpdate" : "AdamUpdate";
    EXPECT_EQ(ops, (std::map<std::string, int>{{w, 2}, {b, 2}}));
  }
}

// SGD (torch convention) and Adagrad likewise: one node per weight, the L2 form where the group decays.
TEST(UpdateOp, OneNodePerWeightForSgdAndAdagrad) {
  struct Case {
    std::string kind;
    double momentum;
    bool nesterov;
    std::string decayed, plain;
  };
  for (const Case& c : {Case{"sgd", 0, false, "SgdL2Update", "SgdUpdate"},
                        Case{"sgd", 0.9, false, "SgdL2MomentumUpdate", "SgdMomentumUpdate"},
                        Case{"sgd", 0.9, true, "SgdL2NesterovUpdate", "SgdNesterovUpdate"},
                        Case{"adagrad", 0, false, "AdagradL2Update", "AdagradUpdate"}}) {
    Model m = test::relu_mlp<double>("mlp", 3, 5, 1, 0.5, test::Fc2::Gemm);
    std::map<std::string, std::string> grads;
    for (const auto& [name, t] : m.graph.initializers) {
      grads[name] = "grad." + name;
      m.graph.inputs.push_back({"grad." + name, static_type(t.dtype, t.dims)});
    }
    OptimizerSpec spec;
    spec.kind = c.kind;
    spec.momentum = c.momentum;
    spec.nesterov = c.nesterov;
    spec.weight_decay = 0.01;
    spec.groups = {{{"*.bias"}, std::nullopt, 0.0}};
    append_optimizer(m.graph, grads, spec);
    std::map<std::string, int> ops;
    for (const Node& n : m.graph.nodes)
      if (n.domain == kOptimizerDomain) ++ops[n.op_type];
    EXPECT_EQ(ops, (std::map<std::string, int>{{c.decayed, 2}, {c.plain, 2}})) << c.kind << " " << c.momentum;
  }
}

TEST(UpdateOp, CheckpointCarriesTheBodiesItUses) {
  TrainingConfig cfg;
  cfg.optimizer.kind = "adamw";
  cfg.optimizer.learning_rate = 1e-3;
  cfg.optimizer.groups = {{{"*.bias"}, std::nullopt, 0.0}};
  TrainingSession s(test::relu_mlp<float>("mlp", 3, 5, 1, 0.5f, test::Fc2::Gemm), cfg);
  const Model ck = s.checkpoint_shell();
  std::set<std::string> carried;
  for (const Function& f : ck.functions)
    if (f.domain == kOptimizerDomain) carried.insert(f.name);
  EXPECT_TRUE(carried.count("AdamWUpdate") && carried.count("AdamUpdate"));
  EXPECT_FALSE(carried.count("AdamL2Update") || carried.count("AdamWAmsgradUpdate"));
}

}  // namespace
}  // namespace onnxtrain
