// Optimizers step by step against torch.optim: a float64 MLP trains 20 steps with each optimizer in C++,
// every weight and every optimizer state is dumped after every step, and tests/training/optim_reference.py
// replays the same steps with torch 1.13 (Debian's /usr/bin/python3) and compares to 1e-10 relative.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "common/mlp_model.h"
#include "common/test_env.h"
#include "graph/builder.h"
#include "graph/error.h"
#include "graph/shape_inference.h"
#include "training/npy.h"
#include "training/session.h"

namespace onnxtrain {
namespace {

constexpr int kIn = 4, kHidden = 8, kBatch = 12, kBatches = 4, kSteps = 20;
const char* kTorchPython = "/usr/bin/python3";

// fc1 (Gemm, transB=1) -> Relu -> fc2, in float64, with the weight names torch's nn.Linear would have.
Model mlp64(unsigned seed) { return test::relu_mlp<double>("mlp64", kIn, kHidden, seed, 0.5, test::Fc2::Gemm); }

struct Data {
  Tensor x = Tensor::empty(DType::Float64, {kBatches, kBatch, kIn});
  Tensor t = Tensor::empty(DType::Float64, {kBatches, kBatch, 1});
};

Data make_data(unsigned seed) {
  Data d;
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  for (double& v : d.x.span<double>()) v = nd(rng);
  for (int64_t i = 0; i < kBatches * kBatch; ++i) {
    const double* x = d.x.ptr<double>() + i * kIn;
    d.t.ptr<double>()[i] = std::sin(x[0] + 0.5 * x[1]) - 0.3 * x[2] * x[3] + 0.1 * nd(rng);
  }
  return d;
}

// Rows [row, row + n) of batch k.
Feeds feeds(const TrainingSession& s, Data& d, int64_t k, int64_t row, int64_t n) {
  const int64_t off = k * kBatch + row;
  return {{"x", Tensor::view(DType::Float64, {n, kIn}, d.x.ptr<double>() + off * kIn)},
          {s.target_name(), Tensor::view(DType::Float64, {n, 1}, d.t.ptr<double>() + off)}};
}

std::string json_num(double v) {
  std::ostringstream o;
  o.precision(17);
  o << v;
  return o.str();
}

// The spec as the reference script reads it; defaults resolved the way torch's constructors resolve them.
std::string spec_json(const OptimizerSpec& o, const ScheduleSpec& sched = {}, const PenaltySpec& pen = {}) {
  std::ostringstream j;
  const double wd = o.weight_decay.value_or(o.kind == "adamw" ? 0.01 : 0.0);
  const double eps = o.eps.value_or(o.kind == "adagrad" ? 1e-10 : 1e-8);
  j << "{\"kind\": \"" << o.kind << "\", \"lr\": " << json_num(o.learning_rate) << ", \"weight_decay\": " << json_num(wd)
    << ", \"momentum\": " << json_num(o.momentum) << ", \"dampening\": " << json_num(o.dampening)
    << ", \"nesterov\": " << (o.nesterov ? "true" : "false") << ", \"convention\": \"" << o.convention
    << "\", \"beta\": " << json_num(o.beta) << ", \"beta1\": " << json_num(o.beta1) << ", \"beta2\": " << json_num(o.beta2)
    << ", \"eps\": " << json_num(eps) << ", \"amsgrad\": " << (o.amsgrad ? "true" : "false")
    << ", \"lr_decay\": " << json_num(o.lr_decay)
    << ", \"initial_accumulator_value\": " << json_num(o.initial_accumulator_value)
    << ", \"max_grad_norm\": " << json_num(o.max_grad_norm) << ", \"gradient_accumulation\": " << o.gradient_accumulation
    << ", \"steps\": " << kSteps << ", \"schedule\": \"" << sched.kind << "\", \"step_size\": " << sched.step_size
    << ", \"gamma\": " << json_num(sched.gamma) << ", \"penalty_l1\": " << json_num(pen.l1)
    << ", \"penalty_l2\": " << json_num(pen.l2) << ", \"groups\": [";
  for (size_t k = 0; k < o.groups.size(); ++k) {
    const ParamGroup& g = o.groups[k];
    j << (k ? ", " : "") << "{\"match\": [";
    for (size_t i = 0; i < g.match.size(); ++i) j << (i ? ", " : "") << "\"" << g.match[i] << "\"";
    j << "]";
    if (g.learning_rate) j << ", \"lr\": " << json_num(*g.learning_rate);
    if (g.weight_decay) j << ", \"weight_decay\": " << json_num(*g.weight_decay);
    j << "}";
  }
  j << "]}";
  return j.str();
}

// Stacks per-step copies of a tensor: [steps, ...].
struct Trajectory {
  Tensor all;
  void record(int step, const Tensor& t) {
    if (!all.defined()) {
      std::vector<int64_t> shape{kSteps};
      shape.insert(shape.end(), t.shape.begin(), t.shape.end());
      all = Tensor::empty(t.dtype, shape);
    }
    std::memcpy(static_cast<char*>(all.data) + step * t.nbytes(), t.data, t.nbytes());
  }
};

// Trains kSteps optimizer steps, dumping everything the reference needs into dir.
void run_and_dump(const std::filesystem::path& dir, const OptimizerSpec& spec, const ScheduleSpec& sched = {},
                  const PenaltySpec& pen = {}) {
  Model m = mlp64(3);
  for (const auto& [name, t] : m.graph.initializers) write_npy(dir / ("init_" + name + ".npy"), Tensor::from_data(t));
  TrainingConfig cfg;
  cfg.optimizer = spec;
  cfg.schedule = sched;
  cfg.penalty = pen;
  TrainingSession s(m, cfg);
  Data d = make_data(5);
  write_npy(dir / "x.npy", d.x);
  write_npy(dir / "t.npy", d.t);
  std::ofstream(dir / "spec.json") << spec_json(spec, sched, pen);
  std::map<std::string, Trajectory> traj;
  const int n = spec.gradient_accumulation;
  for (int k = 0; k < kSteps; ++k) {
    for (int micro = 0; micro < n; ++micro) {
      s.train_step(feeds(s, d, k % kBatches, micro * kBatch / n, kBatch / n));
      ASSERT_EQ(s.step(), micro + 1 == n ? k + 1 : k) << "the step counter counts updates, not micro-batches";
    }
    for (const auto& [name, t] : s.weights()) traj["w_" + name].record(k, t);
    for (const std::string& st : s.state_names())
      if (st.rfind("optim.lr", 0) != 0) traj["s_" + st].record(k, s.state(st));
  }
  for (auto& [name, t] : traj) write_npy(dir / (name + ".npy"), t.all);
}

int reference(const std::filesystem::path& dir) {
  std::string cmd = std::string(kTorchPython) + " " +
                    (test::source_dir() / "tests/training/optim_reference.py").string() + " " + dir.string();
  return std::system(cmd.c_str());
}

struct Case {
  std::string name;
  OptimizerSpec spec;
  ScheduleSpec schedule;
  PenaltySpec penalty;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  auto add = [&](std::string name, auto edit, ScheduleSpec sched = {}, PenaltySpec pen = {}) {
    OptimizerSpec o;
    edit(o);
    c.push_back({std::move(name), o, sched, pen});
  };
  add("sgd", [](OptimizerSpec& o) { o.learning_rate = 0.1; });
  add("sgd_momentum", [](OptimizerSpec& o) { o.learning_rate = 0.05, o.momentum = 0.9; });
  add("sgd_nesterov", [](OptimizerSpec& o) { o.learning_rate = 0.05, o.momentum = 0.9, o.nesterov = true; });
  add("sgd_dampening", [](OptimizerSpec& o) { o.learning_rate = 0.05, o.momentum = 0.8, o.dampening = 0.3; });
  add("sgd_weight_decay", [](OptimizerSpec& o) { o.learning_rate = 0.05, o.momentum = 0.9, o.weight_decay = 0.05; });
  add("sgd_onnx", [](OptimizerSpec& o) {
    o.learning_rate = 0.05, o.momentum = 0.9, o.convention = "onnx", o.beta = 0.4, o.weight_decay = 0.02;
  });
  add("sgd_onnx_nesterov", [](OptimizerSpec& o) {
    o.learning_rate = 0.05, o.momentum = 0.7, o.convention = "onnx", o.beta = 0.9, o.nesterov = true;
  });
  add("adam", [](OptimizerSpec& o) { o.kind = "adam", o.learning_rate = 0.01; });
  add("adam_weight_decay", [](OptimizerSpec& o) {
    o.kind = "adam", o.learning_rate = 0.02, o.weight_decay = 0.1, o.beta1 = 0.8, o.beta2 = 0.99, o.eps = 1e-6;
  });
  add("adamw", [](OptimizerSpec& o) { o.kind = "adamw", o.learning_rate = 0.02, o.weight_decay = 0.1; });
  add("adamw_default_decay", [](OptimizerSpec& o) { o.kind = "adamw", o.learning_rate = 0.01; });
  add("amsgrad", [](OptimizerSpec& o) { o.kind = "adam", o.learning_rate = 0.02, o.amsgrad = true; });
  add("adamw_amsgrad", [](OptimizerSpec& o) { o.kind = "adamw", o.learning_rate = 0.02, o.amsgrad = true; });
  add("adagrad", [](OptimizerSpec& o) { o.kind = "adagrad", o.learning_rate = 0.1; });
  add("adagrad_options", [](OptimizerSpec& o) {
    o.kind = "adagrad", o.learning_rate = 0.1, o.lr_decay = 0.05, o.initial_accumulator_value = 0.2;
    o.weight_decay = 0.03, o.eps = 1e-6;
  });
  add("sgd_clipped", [](OptimizerSpec& o) { o.learning_rate = 0.05, o.momentum = 0.9, o.max_grad_norm = 2.0; });
  add("adam_clipped", [](OptimizerSpec& o) { o.kind = "adam", o.learning_rate = 0.02, o.max_grad_norm = 2.0; });
  add("adamw_groups", [](OptimizerSpec& o) {
    o.kind = "adamw", o.learning_rate = 0.02, o.weight_decay = 0.1;
    o.groups = {{{"*.bias"}, 0.05, 0.0}, {{"fc2.weight"}, 0.005, std::nullopt}};
  });
  add("sgd_groups", [](OptimizerSpec& o) {
    o.learning_rate = 0.05, o.momentum = 0.9, o.weight_decay = 0.01;
    o.groups = {{{"fc1.*"}, 0.1, std::nullopt}, {{"fc2.b?as"}, std::nullopt, 0.0}};
  });
  add("sgd_accumulate", [](OptimizerSpec& o) { o.learning_rate = 0.05, o.momentum = 0.9, o.gradient_accumulation = 2; });
  add("adam_accumulate_clipped", [](OptimizerSpec& o) {
    o.kind = "adam", o.learning_rate = 0.02, o.gradient_accumulation = 3, o.max_grad_norm = 2.5;
  });
  ScheduleSpec steplr;
  steplr.kind = "step", steplr.step_size = 6, steplr.gamma = 0.5;
  add("sgd_momentum_steplr", [](OptimizerSpec& o) { o.learning_rate = 0.05, o.momentum = 0.9; }, steplr);
  ScheduleSpec expo;
  expo.kind = "exponential", expo.gamma = 0.9;
  add("adam_groups_exponential", [](OptimizerSpec& o) {
    o.kind = "adam", o.learning_rate = 0.02, o.groups = {{{"*.bias"}, 0.05, std::nullopt}};
  }, expo);
  add("sgd_elastic_penalty", [](OptimizerSpec& o) { o.learning_rate = 0.05, o.momentum = 0.9; }, {},
      PenaltySpec{0.01, 0.02});
  return c;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class MatchesTorch : public ::testing::TestWithParam<Case> {};

TEST_P(MatchesTorch, EveryStepWeightsAndState) {
  const Case& c = GetParam();
  auto dir = test::temp_dir("optim_" + c.name);
  run_and_dump(dir, c.spec, c.schedule, c.penalty);
  EXPECT_EQ(reference(dir), 0) << "torch.optim disagrees for " << c.name << " (see output above); files in " << dir;
}

INSTANTIATE_TEST_SUITE_P(Optimizers, MatchesTorch, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// The comparison is not vacuous: dumps from one optimizer checked against another's spec must fail.
TEST(OptimizerReference, RejectsAMismatchedSpec) {
  auto dir = test::temp_dir("optim_mismatch");
  OptimizerSpec o;
  o.learning_rate = 0.05, o.momentum = 0.9;
  run_and_dump(dir, o);
  o.momentum = 0.8999;  // a tiny change must show
  std::ofstream(dir / "spec.json") << spec_json(o);
  EXPECT_NE(reference(dir), 0);
}

TEST(GradientAccumulation, EqualsOneBatchOfTheCombinedSize) {
  for (const char* kind : {"sgd", "adam"}) {
    OptimizerSpec base;
    base.kind = kind;
    base.learning_rate = 0.03;
    if (base.kind == "sgd") base.momentum = 0.9;
    TrainingConfig whole, parts;
    whole.optimizer = parts.optimizer = base;
    parts.optimizer.gradient_accumulation = 2;
    TrainingSession a(mlp64(9), whole), b(mlp64(9), parts);
    Data d = make_data(13);
    for (int k = 0; k < kSteps; ++k) {
      a.train_step(feeds(a, d, k % kBatches, 0, kBatch));
      b.train_step(feeds(b, d, k % kBatches, 0, kBatch / 2));
      b.train_step(feeds(b, d, k % kBatches, kBatch / 2, kBatch / 2));
      ASSERT_EQ(a.step(), b.step());
      for (const auto& [name, wa] : a.weights()) {
        Tensor wb = b.get_weight(name);
        double err = 0, ref = 0;
        for (int64_t i = 0; i < wa.numel(); ++i) {
          err = std::max(err, std::abs(wa.ptr<double>()[i] - wb.ptr<double>()[i]));
          ref = std::max(ref, std::abs(wa.ptr<double>()[i]));
        }
        ASSERT_LE(err, 1e-12 * ref) << kind << " step " << k << " weight " << name;
      }
    }
  }
}

TEST(OptimizerState, NamedAsDocumented) {
  TrainingConfig cfg;
  cfg.optimizer.kind = "adam";
  cfg.optimizer.amsgrad = true;
  cfg.optimizer.gradient_accumulation = 2;
  cfg.optimizer.groups = {{{"*.bias"}, 0.1, 0.0}};
  TrainingSession s(mlp64(1), cfg);
  std::vector<std::string> names = s.state_names();
  std::sort(names.begin(), names.end());
  std::vector<std::string> expected = {"optim.lr", "optim.lr.0", "optim.step"};
  for (const char* w : {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"})
    for (const char* suffix : {".exp_avg", ".exp_avg_sq", ".max_exp_avg_sq", ".grad_accum"})
      expected.push_back(std::string(w) + suffix);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(names, expected);
  EXPECT_EQ(s.step(), 0);
  EXPECT_EQ(s.state("fc1.weight.exp_avg").shape, (std::vector<int64_t>{kHidden, kIn}));
  EXPECT_THROW(s.state("fc1.weight.momentum_buffer"), Error);
}

TEST(OptimizerState, LearningRateIsAVariable) {
  TrainingConfig cfg;
  cfg.optimizer.learning_rate = 0.1;
  cfg.optimizer.groups = {{{"fc2.*"}, 0.2, std::nullopt}};
  TrainingSession s(mlp64(1), cfg);
  Data d = make_data(2);
  Feeds f = feeds(s, d, 0, 0, kBatch);
  auto g = s.gradients(f);
  Tensor w1 = s.get_weight("fc1.weight"), w2 = s.get_weight("fc2.weight");
  s.set_learning_rate(0.05);  // halves every group's rate, no re-planning
  EXPECT_EQ(s.learning_rate(), 0.05);
  EXPECT_EQ(*s.state("optim.lr.0").ptr<double>(), 0.1);
  s.train_step(f);
  Tensor n1 = s.get_weight("fc1.weight"), n2 = s.get_weight("fc2.weight");
  for (int64_t i = 0; i < w1.numel(); ++i)
    EXPECT_NEAR(n1.ptr<double>()[i], w1.ptr<double>()[i] - 0.05 * g.grads["fc1.weight"].ptr<double>()[i], 1e-15);
  for (int64_t i = 0; i < w2.numel(); ++i)
    EXPECT_NEAR(n2.ptr<double>()[i], w2.ptr<double>()[i] - 0.1 * g.grads["fc2.weight"].ptr<double>()[i], 1e-15);
}

std::string error_of(const OptimizerSpec& o) {
  TrainingConfig cfg;
  cfg.optimizer = o;
  try {
    TrainingSession s(mlp64(1), cfg);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(OptimizerErrors, NameTheConfigKey) {
  auto has = [](const std::string& msg, const std::string& key) {
    return msg.find(key) != std::string::npos ? ::testing::AssertionSuccess()
                                              : ::testing::AssertionFailure() << "'" << msg << "' lacks " << key;
  };
  OptimizerSpec o;
  o.kind = "rmsprop";
  EXPECT_TRUE(has(error_of(o), "optimizer.kind"));
  o = {};
  o.nesterov = true;
  EXPECT_TRUE(has(error_of(o), "optimizer.nesterov"));
  o = {};
  o.kind = "adam", o.momentum = 0.9;
  EXPECT_TRUE(has(error_of(o), "optimizer.momentum"));
  o = {};
  o.learning_rate = -1;
  EXPECT_TRUE(has(error_of(o), "optimizer.learning_rate"));
  o = {};
  o.groups = {{{"*.gamma"}, 0.1, std::nullopt}};
  EXPECT_TRUE(has(error_of(o), "optimizer.groups[0].match"));
  o = {};
  o.groups = {{{"*"}, std::nullopt, -1.0}};
  EXPECT_TRUE(has(error_of(o), "optimizer.groups[0].weight_decay"));
  o = {};
  o.gradient_accumulation = 0;
  EXPECT_TRUE(has(error_of(o), "optimizer.gradient_accumulation"));
  o = {};
  o.convention = "onnx", o.dampening = 0.1;
  EXPECT_TRUE(has(error_of(o), "optimizer.dampening"));
  o = {};
  o.kind = "adagrad", o.amsgrad = true;
  EXPECT_TRUE(has(error_of(o), "optimizer.amsgrad"));
}

TEST(GlobMatch, Patterns) {
  EXPECT_TRUE(glob_match("*.bias", "fc1.bias"));
  EXPECT_FALSE(glob_match("*.bias", "fc1.bias_scale"));
  EXPECT_TRUE(glob_match("fc?.weight", "fc2.weight"));
  EXPECT_TRUE(glob_match("*norm*", "layer.0.layernorm.weight"));
  EXPECT_TRUE(glob_match("fc1.weight", "fc1.weight"));
  EXPECT_FALSE(glob_match("fc1", "fc1.weight"));
  EXPECT_TRUE(glob_match("**a*", "xxa"));
}

}  // namespace
}  // namespace onnxtrain

namespace onnxtrain {
namespace {

// Logistic regression: one Gemm giving a logit, trained with bce_with_logits, in float32.
Model logistic(int64_t features) {
  Model m;
  m.opset_imports[""] = 17;
  GraphBuilder b(m.graph);
  b.add_input("x", TypeInfo{DType::Float32, Shape{Dim::sym("N"), Dim::of(features)}});
  std::vector<float> zeros(static_cast<size_t>(features), 0.0f);
  m.graph.initializers["w"] = TensorData::from<float>({1, features}, std::span<const float>(zeros));
  m.graph.initializers["b"] = TensorData::scalar<float>(0.0f);
  m.graph.initializers["b"].dims = {1};
  b.add_node("Gemm", {"x", "w", "b"}, 1, {{"transB", int64_t{1}}}, {}, {"logit"});
  b.add_output("logit", TypeInfo{DType::Float32, Shape{Dim::sym("N"), Dim::of(1)}});
  infer_shapes(m);
  return m;
}

struct Classification {
  Tensor x_train, y_train, x_test, y_test;
};

// Two overlapping classes: labels drawn from a logistic model, so the best accuracy is well below 100%.
Classification classification(int64_t n_train, int64_t n_test, int64_t f, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud;
  std::vector<float> w(static_cast<size_t>(f));
  for (float& v : w) v = nd(rng);
  auto make = [&](int64_t n, Tensor& x, Tensor& y) {
    x = Tensor::empty(DType::Float32, {n, f});
    y = Tensor::empty(DType::Float32, {n, 1});
    for (int64_t i = 0; i < n; ++i) {
      float z = 0.3f;
      for (int64_t k = 0; k < f; ++k) {
        float v = nd(rng) * (1.0f + 0.5f * static_cast<float>(k));  // unequal scales, as real features have
        x.ptr<float>()[i * f + k] = v;
        z += v * w[k] / (1.0f + 0.5f * static_cast<float>(k));
      }
      y.ptr<float>()[i] = ud(rng) < 1.0f / (1.0f + std::exp(-2.0f * z)) ? 1.0f : 0.0f;
    }
  };
  Classification c;
  make(n_train, c.x_train, c.y_train);
  make(n_test, c.x_test, c.y_test);
  return c;
}

int convergence_reference(const std::filesystem::path& dir) {
  std::string cmd = test::python() + " " +
                    (test::source_dir() / "tests/training/convergence_reference.py").string() + " " + dir.string();
  return std::system(cmd.c_str());
}

TEST(Convergence, LogisticRegressionReachesScikitLearnAccuracy) {
  const int64_t f = 6, n_train = 1000, n_test = 2000, bs = 25;
  Classification c = classification(n_train, n_test, f, 21);
  auto dir = test::temp_dir("optim_convergence");
  write_npy(dir / "x_train.npy", c.x_train);
  write_npy(dir / "y_train.npy", c.y_train);
  write_npy(dir / "x_test.npy", c.x_test);
  write_npy(dir / "y_test.npy", c.y_test);
  auto opt = [](std::string kind, double lr, auto edit) {
    OptimizerSpec o;
    o.kind = std::move(kind);
    o.learning_rate = lr;
    edit(o);
    return o;
  };
  auto none = [](OptimizerSpec&) {};
  std::vector<std::pair<std::string, OptimizerSpec>> runs = {
      {"sgd", opt("sgd", 0.05, none)},
      {"sgd_momentum", opt("sgd", 0.005, [](OptimizerSpec& o) { o.momentum = 0.9; })},
      {"sgd_nesterov", opt("sgd", 0.005, [](OptimizerSpec& o) { o.momentum = 0.9, o.nesterov = true; })},
      {"sgd_onnx", opt("sgd", 0.005, [](OptimizerSpec& o) { o.momentum = 0.9, o.convention = "onnx", o.beta = 1.0; })},
      {"adam", opt("adam", 0.01, none)},
      {"adamw", opt("adamw", 0.01, none)},
      {"amsgrad", opt("adam", 0.01, [](OptimizerSpec& o) { o.amsgrad = true; })},
      {"adagrad", opt("adagrad", 0.1, none)},
      {"adam_clipped_accumulated", opt("adam", 0.01, [](OptimizerSpec& o) {
         o.max_grad_norm = 1.0, o.gradient_accumulation = 2, o.groups = {{{"b"}, 0.02, 0.0}};
       })},
  };
  for (const auto& [name, spec] : runs) {
    TrainingConfig cfg;
    cfg.loss.kind = "bce_with_logits";
    cfg.optimizer = spec;
    TrainingSession s(logistic(f), cfg);
    for (int epoch = 0; epoch < 40; ++epoch)
      for (int64_t k = 0; k < n_train / bs; ++k)
        s.train_step({{"x", Tensor::view(DType::Float32, {bs, f}, c.x_train.ptr<float>() + k * bs * f)},
                      {s.target_name(), Tensor::view(DType::Float32, {bs, 1}, c.y_train.ptr<float>() + k * bs)}});
    write_npy(dir / ("pred_" + name + ".npy"), s.infer({{"x", c.x_test}}).at(0));
  }
  EXPECT_EQ(convergence_reference(dir), 0) << "an optimizer misses scikit-learn's accuracy (see output above)";

  // The check can fail: an untrained model (all-zero logits) is far from scikit-learn's accuracy.
  auto bad = test::temp_dir("optim_convergence_untrained");
  for (const char* n : {"x_train.npy", "y_train.npy", "x_test.npy", "y_test.npy"})
    std::filesystem::copy_file(dir / n, bad / n, std::filesystem::copy_options::overwrite_existing);
  TrainingConfig cfg;
  cfg.loss.kind = "bce_with_logits";
  TrainingSession untrained(logistic(f), cfg);
  write_npy(bad / "pred_untrained.npy", untrained.infer({{"x", c.x_test}}).at(0));
  EXPECT_NE(convergence_reference(bad), 0);
}

}  // namespace
}  // namespace onnxtrain
