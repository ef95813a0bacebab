// Every loss kind against torch.nn.functional (or numpy where torch has no such loss): a table of cases, each a
// float64 graph whose input is the prediction, with the loss appended and differentiated by our engine (seed
// 1.0) and run on our executor. The values and gradients go to .npy files that tests/losses/loss_reference.py
// recomputes independently. Corrupted copies of every case must be reported as mismatches, so no comparison
// passes vacuously.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

#include "common/test_env.h"
#include "executor/executor.h"
#include "gradients/builder.h"
#include "graph/error.h"
#include "graph/expr.h"
#include "losses/loss.h"
#include "losses/penalty.h"
#include "training/npy.h"

namespace onnxtrain {
namespace {

// Debian's torch runs on the system interpreter, not the project venv.
constexpr const char* kTorchPython = "/usr/bin/python3";

enum class Data {
  Regression,     // prediction, target ~ N(0, 1)
  Probability,    // prediction in (lo, 1 - lo), binary targets
  SoftProbability,// prediction in (lo, 1 - lo), targets in [0, 1]
  Logits,         // prediction ~ N(0, scale^2), binary targets
  SoftLogits,     // prediction ~ N(0, scale^2), targets in [0, 1]
  ClassLogits,    // [N, C, ...] ~ N(0, 4), class-index or class-probability targets
  ClassLogProbs,  // log_softmax over axis 1 of random logits
};

struct Case {
  std::string name;
  LossSpec spec;
  std::vector<int64_t> shape;
  Data data;
  double param = 0.0;      // Probability: lower bound of p; Logits: scale
  double ignored = 0.0;    // fraction of class-index targets set to ignore_index
  bool symbolic = false;   // every prediction dim symbolic (run-time shapes in the loss)
  int64_t opset = 17;
};

LossSpec spec(std::string kind, std::string reduction = "mean") {
  LossSpec s;
  s.kind = std::move(kind);
  s.reduction = std::move(reduction);
  return s;
}

template <class F> LossSpec with(LossSpec s, F f) {
  f(s);
  return s;
}

std::vector<Case> cases() {
  auto sw = [](LossSpec& s) { s.sample_weight = true; };
  std::vector<Case> c;
  // Regression.
  c.push_back({"square_mean", spec("square"), {6, 3}, Data::Regression});
  c.push_back({"square_sum", spec("square", "sum"), {6, 3}, Data::Regression});
  c.push_back({"mse_alias_half", with(spec("mse"), [](LossSpec& s) { s.half = true; }), {6, 3}, Data::Regression});
  c.push_back({"square_sample_weight", with(spec("square"), sw), {6, 3}, Data::Regression});
  c.push_back({"square_half_sum_sw_rank1", with(spec("square", "sum"), [&](LossSpec& s) { s.half = true; sw(s); }),
               {7}, Data::Regression});
  c.push_back({"absolute_mean", spec("absolute"), {6, 3}, Data::Regression});
  c.push_back({"absolute_sum_sw", with(spec("absolute", "sum"), sw), {6, 3}, Data::Regression});
  c.push_back({"elastic_mean", with(spec("elastic"), [](LossSpec& s) { s.l1 = 0.3; s.l2 = 0.7; }), {6, 3},
               Data::Regression});
  c.push_back({"elastic_default_sum_sw", with(spec("elastic", "sum"), sw), {5, 2, 2}, Data::Regression});
  c.push_back({"elastic_l1_only", with(spec("elastic"), [](LossSpec& s) { s.l1 = 2; s.l2 = 0; }), {6, 3},
               Data::Regression});
  c.push_back({"huber_mean", spec("huber"), {6, 3}, Data::Regression});
  c.push_back({"huber_delta_sum_sw", with(spec("huber", "sum"), [&](LossSpec& s) { s.delta = 0.5; sw(s); }),
               {6, 3}, Data::Regression});
  c.push_back({"huber_symbolic", with(spec("huber"), [](LossSpec& s) { s.delta = 1.7; }), {6, 3},
               Data::Regression, 0, 0, true});
  // Binary log-loss.
  c.push_back({"neg_log_prob_mean", spec("neg_log"), {8, 2}, Data::Probability, 0.01});
  c.push_back({"neg_log_prob_soft_sum_sw", with(spec("neg_log", "sum"), sw), {8, 2}, Data::SoftProbability, 0.01});
  c.push_back({"neg_log_prob_eps_clipped", with(spec("neg_log"), [](LossSpec& s) { s.eps = 0.05; }), {10, 3},
               Data::Probability, 0.001});
  c.push_back({"neg_log_logits_mean", with(spec("neg_log"), [](LossSpec& s) { s.input = "logits"; }), {8, 2},
               Data::Logits, 3.0});
  c.push_back({"neg_log_logits_eps_sum_sw", with(spec("neg_log", "sum"), [&](LossSpec& s) {
                 s.input = "logits"; s.eps = 0.01; sw(s); }),
               {10, 3}, Data::SoftLogits, 4.0});
  c.push_back({"bce_with_logits_mean", spec("bce_with_logits"), {8, 3}, Data::Logits, 2.0});
  c.push_back({"bce_with_logits_pos_weight", with(spec("bce_with_logits"), [](LossSpec& s) {
                 s.pos_weight = {0.5, 2.0, 3.5}; }),
               {8, 3}, Data::SoftLogits, 2.0});
  c.push_back({"bce_with_logits_pos_weight1_rank3_sum_sw", with(spec("bce_with_logits", "sum"), [&](LossSpec& s) {
                 s.pos_weight = {1.7}; sw(s); }),
               {4, 2, 3}, Data::Logits, 2.0});
  c.push_back({"bce_with_logits_symbolic", with(spec("bce_with_logits"), [](LossSpec& s) { s.pos_weight = {2, 3}; }),
               {5, 2}, Data::Logits, 2.0, 0, true});
  // Cross entropy with class indices.
  auto cw5 = [](LossSpec& s) { s.class_weights = {0.5, 1.0, 2.0, 0.25, 1.5}; };
  auto cw3 = [](LossSpec& s) { s.class_weights = {0.7, 1.3, 2.1}; };
  c.push_back({"ce_mean", spec("cross_entropy"), {8, 5}, Data::ClassLogits});
  c.push_back({"ce_sum", spec("cross_entropy", "sum"), {8, 5}, Data::ClassLogits});
  c.push_back({"ce_weights", with(spec("cross_entropy"), cw5), {8, 5}, Data::ClassLogits});
  c.push_back({"ce_weights_ignore", with(spec("cross_entropy"), cw5), {12, 5}, Data::ClassLogits, 0, 0.25});
  c.push_back({"ce_ignore_a_class_smoothing_weights", with(spec("cross_entropy"), [&](LossSpec& s) {
                 cw5(s); s.ignore_index = 2; s.label_smoothing = 0.1; }),
               {12, 5}, Data::ClassLogits});
  c.push_back({"ce_smoothing", with(spec("cross_entropy"), [](LossSpec& s) { s.label_smoothing = 0.2; }), {8, 5},
               Data::ClassLogits});
  c.push_back({"ce_no_ignore_index", with(spec("cross_entropy"), [](LossSpec& s) { s.ignore_index.reset(); }),
               {8, 5}, Data::ClassLogits});
  c.push_back({"ce_rank4_all_options", with(spec("cross_entropy"), [&](LossSpec& s) {
                 cw3(s); s.label_smoothing = 0.15; }),
               {3, 3, 2, 4}, Data::ClassLogits, 0, 0.2});
  c.push_back({"ce_rank3_sum_sw_all_options", with(spec("cross_entropy", "sum"), [&](LossSpec& s) {
                 cw3(s); s.label_smoothing = 0.3; sw(s); }),
               {4, 3, 5}, Data::ClassLogits, 0, 0.2});
  c.push_back({"ce_mean_sw_weights_ignore", with(spec("cross_entropy"), [&](LossSpec& s) { cw5(s); sw(s); }),
               {12, 5}, Data::ClassLogits, 0, 0.25});
  c.push_back({"ce_rank3_symbolic_smoothing", with(spec("cross_entropy"), [](LossSpec& s) {
                 s.label_smoothing = 0.1; }),
               {4, 6, 3}, Data::ClassLogits, 0, 0.2, true});
  c.push_back({"ce_rank3_symbolic_weights_sw", with(spec("cross_entropy"), [&](LossSpec& s) { cw3(s); sw(s); }),
               {4, 3, 5}, Data::ClassLogits, 0, 0.2, true});
  c.push_back({"ce_rank4_opset12_symbolic", with(spec("cross_entropy"), [](LossSpec& s) { s.label_smoothing = 0.05; }),
               {2, 4, 3, 2}, Data::ClassLogits, 0, 0.2, true, 12});
  // Cross entropy with class probabilities.
  auto probs = [](LossSpec& s) { s.target_format = "probabilities"; };
  c.push_back({"ce_probs_mean", with(spec("cross_entropy"), probs), {8, 5}, Data::ClassLogits});
  c.push_back({"ce_probs_weights_smoothing", with(spec("cross_entropy"), [&](LossSpec& s) {
                 probs(s); cw5(s); s.label_smoothing = 0.2; }),
               {8, 5}, Data::ClassLogits});
  c.push_back({"ce_probs_rank3_sum_sw_weights", with(spec("cross_entropy", "sum"), [&](LossSpec& s) {
                 probs(s); cw3(s); sw(s); }),
               {4, 3, 5}, Data::ClassLogits});
  c.push_back({"ce_probs_rank3_mean_sw", with(spec("cross_entropy"), [&](LossSpec& s) { probs(s); sw(s); }),
               {4, 3, 5}, Data::ClassLogits});
  c.push_back({"ce_probs_rank3_symbolic_smoothing", with(spec("cross_entropy"), [&](LossSpec& s) {
                 probs(s); s.label_smoothing = 0.1; }),
               {4, 6, 3}, Data::ClassLogits, 0, 0, true});
  // Negative log-likelihood on log-probabilities.
  c.push_back({"nll_mean", spec("nll"), {8, 5}, Data::ClassLogProbs});
  c.push_back({"nll_rank3_weights_ignore", with(spec("nll"), cw3), {4, 3, 5}, Data::ClassLogProbs, 0, 0.2});
  c.push_back({"nll_sum_sw", with(spec("nll", "sum"), sw), {8, 5}, Data::ClassLogProbs, 0, 0.2});
  c.push_back({"nll_mean_sw_weights", with(spec("nll"), [&](LossSpec& s) { cw5(s); sw(s); }), {8, 5},
               Data::ClassLogProbs, 0, 0.2});
  return c;
}

std::string json_num(double v) {
  std::ostringstream o;
  o.precision(17);
  o << v;
  return o.str();
}

std::string json_list(const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + json_num(v[i]);
  return s + "]";
}

std::string spec_json(const LossSpec& s, const std::string& expect) {
  std::ostringstream o;
  o << "{\"kind\": \"" << s.kind << "\", \"reduction\": \"" << s.reduction << "\", \"half\": "
    << (s.half ? "true" : "false") << ", \"l1\": " << json_num(s.l1) << ", \"l2\": " << json_num(s.l2)
    << ", \"delta\": " << json_num(s.delta) << ", \"input\": \"" << s.input << "\", \"eps\": "
    << (s.eps ? json_num(*s.eps) : "null") << ", \"target_format\": \"" << s.target_format
    << "\", \"class_weights\": " << json_list(s.class_weights) << ", \"ignore_index\": "
    << (s.ignore_index ? std::to_string(*s.ignore_index) : "null")
    << ", \"label_smoothing\": " << json_num(s.label_smoothing) << ", \"pos_weight\": " << json_list(s.pos_weight)
    << ", \"expect\": \"" << expect << "\"}";
  return o.str();
}

void write_text(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p);
  f << s;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Index of element (n, c, rest) in a row-major [N, C, R...] tensor with rest flattened to r.
int64_t at(int64_t n, int64_t c, int64_t r, int64_t C, int64_t R) { return (n * C + c) * R + r; }

struct Feeds {
  Tensor pred, target, sample_weight;
};

Feeds make_data(const Case& k, std::mt19937& rng) {
  std::normal_distribution<double> nd;
  std::uniform_real_distribution<double> ud;
  Feeds f;
  const int64_t n = numel(k.shape);
  f.pred = Tensor::empty(DType::Float64, k.shape);
  double* p = f.pred.ptr<double>();
  const bool class_kind = k.data == Data::ClassLogits || k.data == Data::ClassLogProbs;
  if (!class_kind) {
    f.target = Tensor::empty(DType::Float64, k.shape);
    double* t = f.target.ptr<double>();
    for (int64_t i = 0; i < n; ++i) {
      switch (k.data) {
        case Data::Regression: p[i] = nd(rng); t[i] = nd(rng); break;
        case Data::Probability: p[i] = k.param + (1 - 2 * k.param) * ud(rng); t[i] = ud(rng) < 0.5 ? 0 : 1; break;
        case Data::SoftProbability: p[i] = k.param + (1 - 2 * k.param) * ud(rng); t[i] = ud(rng); break;
        case Data::Logits: p[i] = k.param * nd(rng); t[i] = ud(rng) < 0.5 ? 0 : 1; break;
        case Data::SoftLogits: p[i] = k.param * nd(rng); t[i] = ud(rng); break;
        default: break;
      }
    }
  } else {
    const int64_t N = k.shape[0], C = k.shape[1], R = n / (N * C);
    for (int64_t i = 0; i < n; ++i) p[i] = 2 * nd(rng);
    if (k.data == Data::ClassLogProbs)
      for (int64_t a = 0; a < N; ++a)
        for (int64_t r = 0; r < R; ++r) {
          double m = -1e300, s = 0;
          for (int64_t c = 0; c < C; ++c) m = std::max(m, p[at(a, c, r, C, R)]);
          for (int64_t c = 0; c < C; ++c) s += std::exp(p[at(a, c, r, C, R)] - m);
          for (int64_t c = 0; c < C; ++c) p[at(a, c, r, C, R)] -= m + std::log(s);
        }
    if (k.spec.target_format == "probabilities") {
      f.target = Tensor::empty(DType::Float64, k.shape);
      double* t = f.target.ptr<double>();
      for (int64_t a = 0; a < N; ++a)
        for (int64_t r = 0; r < R; ++r) {
          double s = 0;
          for (int64_t c = 0; c < C; ++c) s += (t[at(a, c, r, C, R)] = ud(rng) + 0.05);
          for (int64_t c = 0; c < C; ++c) t[at(a, c, r, C, R)] /= s;
        }
    } else {
      std::vector<int64_t> ts = k.shape;
      ts.erase(ts.begin() + 1);
      f.target = Tensor::empty(DType::Int64, ts);
      std::uniform_int_distribution<int64_t> cls(0, C - 1);
      for (int64_t& v : f.target.span<int64_t>()) {
        v = cls(rng);
        if (k.ignored > 0 && ud(rng) < k.ignored) v = k.spec.ignore_index.value_or(-100);
      }
    }
  }
  if (k.spec.sample_weight) {
    f.sample_weight = Tensor::empty(DType::Float64, {k.shape[0]});
    for (double& v : f.sample_weight.span<double>()) v = 0.2 + 1.6 * ud(rng);
  }
  return f;
}

// The loss and d loss / d pred of one case, computed by our engine and executor. `loss_opset` is what
// append_loss is told (the case's opset unless given; 0 keeps class losses in their one-hot form).
std::pair<Tensor, Tensor> run_case(const Case& k, const Feeds& f, DType dt = DType::Float64,
                                   std::optional<int64_t> loss_opset = std::nullopt) {
  Graph g;
  std::map<std::string, int64_t> opsets{{"", k.opset}, {"onnxtrain", 1}};
  Shape s;
  for (size_t i = 0; i < k.shape.size(); ++i)
    s.push_back(k.symbolic ? Dim::sym("d" + std::to_string(i)) : Dim::of(k.shape[i]));
  g.inputs.push_back({"pred", {dt, s}});
  LossGraph lg = append_loss(g, "pred", k.spec, loss_opset.value_or(k.opset));
  EXPECT_EQ(lg.sample_weight.empty(), !k.spec.sample_weight);
  GraphBuilder gb(g, "test/");
  Expr seed = scalar(gb, dt, 1.0);
  GradientRequest req;
  req.wrt = {"pred"};
  req.outputs = {lg.loss};
  req.output_grads = {seed.name};
  GradientResult gr = build_gradients(g, opsets, req);
  const std::string grad = gr.grads.at("pred");
  g.outputs = {{lg.loss, *g.type_of(lg.loss)}, {grad, *g.type_of(grad)}};
  Executor ex(std::move(g), opsets, std::make_shared<TensorStore>());
  std::map<std::string, Tensor> feeds{{"pred", f.pred}, {lg.target, f.target}};
  if (k.spec.sample_weight) feeds[lg.sample_weight] = f.sample_weight;
  std::vector<Tensor> out = ex.run(feeds);
  return {out.at(0), out.at(1)};
}

void write_case(const std::filesystem::path& dir, const Case& k, const Feeds& f, const Tensor& loss,
                const Tensor& grad, const std::string& expect) {
  std::filesystem::create_directories(dir);
  write_text(dir / "spec.json", spec_json(k.spec, expect));
  write_npy(dir / "pred.npy", f.pred);
  write_npy(dir / "target.npy", f.target);
  if (k.spec.sample_weight) write_npy(dir / "sample_weight.npy", f.sample_weight);
  write_npy(dir / "loss.npy", loss);
  write_npy(dir / "grad.npy", grad);
}

int run_reference(const std::filesystem::path& dir) {
  std::string cmd = std::string(kTorchPython) + " " + (test::source_dir() / "tests/losses/loss_reference.py").string() +
                    " " + dir.string();
  return std::system(cmd.c_str());
}

TEST(Losses, MatchTorchValueAndGradient) {
  auto dir = test::temp_dir("losses");
  std::mt19937 rng(1234);
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.name);
    Feeds f = make_data(k, rng);
    // Class-index losses from opset 16 gather the target's log-probability; the one-hot form they use below
    // opset 16 is checked on the same data too.
    const bool two_forms = k.opset >= 16 && f.target.dtype == DType::Int64;
    for (int form = 0; form < (two_forms ? 2 : 1); ++form) {
      const std::string name = form == 0 ? k.name : k.name + "_onehot";
      std::pair<Tensor, Tensor> r;
      try {
        r = run_case(k, f, DType::Float64, form == 0 ? std::optional<int64_t>() : std::optional<int64_t>(0));
      } catch (const std::exception& e) {
        ADD_FAILURE() << name << ": " << e.what();
        continue;
      }
      auto& [loss, grad] = r;
      ASSERT_EQ(loss.numel(), 1);
      ASSERT_EQ(grad.shape, f.pred.shape);
      write_case(dir / name, k, f, loss, grad, "match");
      // Corrupted copies, far above the 1e-10 tolerance yet small: each comparison must notice them.
      Tensor bad_loss = loss.clone();
      *bad_loss.ptr<double>() *= 1 + 1e-7;
      write_case(dir / (name + "~loss"), k, f, bad_loss, grad, "loss_mismatch");
      Tensor bad_grad = grad.clone();
      double m = 0;
      int64_t arg = 0;
      for (int64_t i = 0; i < grad.numel(); ++i)
        if (std::abs(grad.ptr<double>()[i]) > m) m = std::abs(grad.ptr<double>()[arg = i]);
      bad_grad.ptr<double>()[(arg + 1) % grad.numel()] += 1e-7 * std::max(m, 1e-300);
      write_case(dir / (name + "~grad"), k, f, loss, bad_grad, "grad_mismatch");
    }
  }
  EXPECT_EQ(run_reference(dir), 0) << "torch/numpy disagree with onnxtrain's losses (see the output above)";
}

Tensor to_float32(const Tensor& t) {
  if (t.dtype != DType::Float64) return t;
  Tensor r = Tensor::empty(DType::Float32, t.shape);
  for (int64_t i = 0; i < t.numel(); ++i) r.ptr<float>()[i] = static_cast<float>(t.ptr<double>()[i]);
  return r;
}

// float32 graphs (class weights and pos_weight initializers in float32, the float32 default eps) agree with the
// float64 results checked against torch above, to float32 precision.
TEST(Losses, Float32AgreesWithFloat64) {
  std::mt19937 rng(77);
  for (const Case& k : cases()) {
    if (k.name.find("weight") == std::string::npos && k.name.find("neg_log") == std::string::npos) continue;
    SCOPED_TRACE(k.name);
    Feeds f = make_data(k, rng);
    auto [loss64, grad64] = run_case(k, f);
    Feeds f32{to_float32(f.pred), to_float32(f.target), to_float32(f.sample_weight)};
    auto [loss32, grad32] = run_case(k, f32, DType::Float32);
    ASSERT_EQ(loss32.dtype, DType::Float32);
    EXPECT_NEAR(*loss32.ptr<float>(), *loss64.ptr<double>(), 1e-5 * std::max(1.0, std::abs(*loss64.ptr<double>())));
    double m = 0;
    for (int64_t i = 0; i < grad64.numel(); ++i) m = std::max(m, std::abs(grad64.ptr<double>()[i]));
    for (int64_t i = 0; i < grad64.numel(); ++i)
      ASSERT_NEAR(grad32.ptr<float>()[i], grad64.ptr<double>()[i], 1e-5 * m) << "element " << i;
  }
}

TEST(Penalty, MatchesNumpyValueAndGradient) {
  auto dir = test::temp_dir("penalty");
  std::mt19937 rng(99);
  std::normal_distribution<double> nd;
  struct P {
    std::string name;
    PenaltySpec spec;
  };
  for (const P& c : {P{"penalty_elastic", {0.3, 0.7}}, P{"penalty_l1", {0.25, 0}}, P{"penalty_l2", {0, 1.5}}}) {
    SCOPED_TRACE(c.name);
    Graph g;
    std::map<std::string, int64_t> opsets{{"", 17}};
    const std::vector<std::vector<int64_t>> shapes = {{3, 4}, {5}};
    g.inputs.push_back({"base", {DType::Float64, Shape{}}});
    std::vector<std::string> ws;
    std::map<std::string, Tensor> feeds;
    feeds["base"] = Tensor::from_vector<double>({}, {0.75});
    for (size_t i = 0; i < shapes.size(); ++i) {
      std::string w = "w" + std::to_string(i);
      Shape s;
      for (int64_t d : shapes[i]) s.push_back(Dim::of(d));
      g.inputs.push_back({w, {DType::Float64, s}});
      Tensor t = Tensor::empty(DType::Float64, shapes[i]);
      for (double& v : t.span<double>()) v = nd(rng);
      feeds[w] = t;
      ws.push_back(w);
    }
    std::string total = append_penalty(g, "base", ws, c.spec);
    GraphBuilder gb(g, "test/");
    Expr seed = scalar(gb, DType::Float64, 1.0);
    GradientRequest req;
    req.wrt = {"base", "w0", "w1"};
    req.outputs = {total};
    req.output_grads = {seed.name};
    GradientResult gr = build_gradients(g, opsets, req);
    g.outputs = {{total, *g.type_of(total)}};
    for (const std::string& w : req.wrt) g.outputs.push_back({gr.grads.at(w), *g.type_of(gr.grads.at(w))});
    Executor ex(std::move(g), opsets, std::make_shared<TensorStore>());
    std::vector<Tensor> out = ex.run(feeds);
    for (const std::string expect : {"match", "loss_mismatch", "grad_mismatch"}) {
      auto d = dir / (c.name + (expect == std::string("match") ? "" : "~" + std::string(expect)));
      std::filesystem::create_directories(d);
      std::ostringstream o;
      o << "{\"kind\": \"penalty\", \"l1\": " << json_num(c.spec.l1) << ", \"l2\": " << json_num(c.spec.l2)
        << ", \"n_weights\": 2, \"expect\": \"" << expect << "\"}";
      write_text(d / "spec.json", o.str());
      write_npy(d / "base.npy", feeds["base"]);
      Tensor loss = out[0].clone();
      if (expect == std::string("loss_mismatch")) *loss.ptr<double>() *= 1 + 1e-7;
      write_npy(d / "loss.npy", loss);
      write_npy(d / "grad_base.npy", out[1]);
      for (size_t i = 0; i < 2; ++i) {
        write_npy(d / ("w" + std::to_string(i) + ".npy"), feeds["w" + std::to_string(i)]);
        Tensor gw = out[2 + i].clone();
        if (expect == std::string("grad_mismatch") && i == 1) gw.ptr<double>()[2] += 1e-6;
        write_npy(d / ("grad_w" + std::to_string(i) + ".npy"), gw);
      }
    }
  }
  EXPECT_EQ(run_reference(dir), 0) << "numpy disagrees with onnxtrain's penalty (see the output above)";
}

// ---- errors ---------------------------------------------------------------------------------------------

std::string error_of(LossSpec s, std::vector<int64_t> shape = {4, 3}) {
  Graph g;
  Shape sh;
  for (int64_t d : shape) sh.push_back(Dim::of(d));
  g.inputs.push_back({"pred", {DType::Float64, sh}});
  try {
    append_loss(g, "pred", s);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(LossErrors, NameTheKeyAndTheChoices) {
  using testing::HasSubstr;
  EXPECT_EQ(error_of(spec("hinge")),
            "loss.kind: unknown value 'hinge'; expected one of: square, mse, absolute, elastic, huber, neg_log, "
            "cross_entropy, nll, bce_with_logits");
  EXPECT_EQ(error_of(spec("square", "avg")), "loss.reduction: unknown value 'avg'; expected one of: mean, sum");
  EXPECT_EQ(error_of(with(spec("huber"), [](LossSpec& s) { s.delta = -1; })),
            "loss.delta: expected a positive number, got -1");
  EXPECT_EQ(error_of(with(spec("elastic"), [](LossSpec& s) { s.l1 = -0.5; })),
            "loss.l1: expected a non-negative number, got -0.5");
  EXPECT_THAT(error_of(with(spec("elastic"), [](LossSpec& s) { s.l1 = 0; s.l2 = 0; })),
              HasSubstr("at least one positive coefficient"));
  EXPECT_EQ(error_of(with(spec("neg_log"), [](LossSpec& s) { s.eps = 0.7; })),
            "loss.eps: expected a number in [0, 0.5), got 0.69999999999999996");
  EXPECT_EQ(error_of(with(spec("neg_log"), [](LossSpec& s) { s.input = "probs"; })),
            "loss.input: unknown value 'probs'; expected one of: probability, logits");
  EXPECT_EQ(error_of(with(spec("cross_entropy"), [](LossSpec& s) { s.input = "probability"; })),
            "loss.input: unknown value 'probability'; expected one of: logits");
  EXPECT_EQ(error_of(with(spec("nll"), [](LossSpec& s) { s.target_format = "probabilities"; })),
            "loss.target_format: is read only by cross_entropy, not by 'nll'");
  EXPECT_EQ(error_of(with(spec("cross_entropy"), [](LossSpec& s) { s.target_format = "soft"; })),
            "loss.target_format: unknown value 'soft'; expected one of: indices, probabilities");
  EXPECT_EQ(error_of(with(spec("cross_entropy"), [](LossSpec& s) { s.class_weights = {1, 2}; })),
            "loss.class_weights: expected 3 values (one per class, axis 1 of 'pred'), got 2");
  EXPECT_EQ(error_of(with(spec("cross_entropy"), [](LossSpec& s) { s.label_smoothing = 1.5; })),
            "loss.label_smoothing: expected a number in [0, 1], got 1.5");
  EXPECT_EQ(error_of(with(spec("nll"), [](LossSpec& s) { s.label_smoothing = 0.1; })),
            "loss.label_smoothing: is read only by cross_entropy, not by 'nll'");
  EXPECT_EQ(error_of(with(spec("bce_with_logits"), [](LossSpec& s) { s.pos_weight = {1, 2}; })),
            "loss.pos_weight: expected 1 or 3 values (the prediction's last axis), got 2");
  EXPECT_EQ(error_of(with(spec("huber"), [](LossSpec& s) { s.half = true; })),
            "loss.half: is read only by square (mse), not by 'huber'");
  EXPECT_EQ(error_of(with(spec("square"), [](LossSpec& s) { s.class_weights = {1, 2, 3}; })),
            "loss.class_weights: is read only by cross_entropy and nll, not by 'square'");
  EXPECT_EQ(error_of(spec("cross_entropy"), {5}),
            "loss.kind: 'cross_entropy' needs a prediction of rank >= 2 ([N, C, d1, ...]), 'pred' is of rank 1");
  EXPECT_EQ(error_of(with(spec("square"), [](LossSpec& s) { s.sample_weight = true; }), {}),
            "loss.sample_weight: needs a prediction with a batch axis, 'pred' is a scalar");
}

TEST(LossErrors, PenaltyNamesTheKey) {
  Graph g;
  g.inputs.push_back({"l", {DType::Float64, Shape{}}});
  g.inputs.push_back({"w", {DType::Float64, Shape{Dim::of(3)}}});
  g.inputs.push_back({"i", {DType::Int64, Shape{Dim::of(3)}}});
  auto err = [&](const std::vector<std::string>& ws, PenaltySpec p, const std::string& loss = "l") {
    try {
      append_penalty(g, loss, ws, p);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(err({"w"}, {-1, 0}), "penalty.l1: expected a non-negative number, got -1");
  EXPECT_EQ(err({"w"}, {0, -2}), "penalty.l2: expected a non-negative number, got -2");
  EXPECT_EQ(err({"nope"}, {1, 0}), "penalty.weights: 'nope' is not a value of the graph");
  EXPECT_EQ(err({"i"}, {1, 0}), "penalty.weights: 'i' is int64; only floating-point weights are penalized");
  EXPECT_EQ(err({"w"}, {1, 0}, "w"), "penalty: loss 'w' must be a scalar, got shape [3]");
}

// The new inputs: target after the model's inputs, then sample_weight; class indices are int64 without axis 1.
TEST(LossGraphShape, InputsAndTypes) {
  Graph g;
  g.inputs.push_back({"pred", {DType::Float32, Shape{Dim::sym("N"), Dim::of(4), Dim::of(7)}}});
  LossSpec s = spec("cross_entropy");
  s.sample_weight = true;
  LossGraph lg = append_loss(g, "pred", s);
  ASSERT_EQ(g.inputs.size(), 3u);
  EXPECT_EQ(g.inputs[1].name, lg.target);
  EXPECT_EQ(g.inputs[2].name, lg.sample_weight);
  EXPECT_EQ(lg.target, "target");
  EXPECT_EQ(lg.sample_weight, "sample_weight");
  EXPECT_EQ(g.inputs[1].type, (TypeInfo{DType::Int64, Shape{Dim::sym("N"), Dim::of(7)}}));
  EXPECT_EQ(g.inputs[2].type, (TypeInfo{DType::Float32, Shape{Dim::sym("N")}}));
  const TypeInfo* lt = g.type_of(lg.loss);
  ASSERT_NE(lt, nullptr);
  EXPECT_EQ(*lt, (TypeInfo{DType::Float32, Shape{}}));
}

}  // namespace
}  // namespace onnxtrain
