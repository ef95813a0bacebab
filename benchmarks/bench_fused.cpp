// Times a fused gradient op through its native kernel against its own inlined standard-ONNX body, in one
// process, alternating the two so machine load hits both alike; prints the medians and their ratio.
//
//   bench_fused [--threads 1] [--repeats 15] [--iters 20] [CASE...]
//
// CASE names one of the shapes below (default: all). float32 throughout, inputs random in [-1, 1] (Y of the
// softmax ops a real (log-)softmax output, InvStdDev positive).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "gradients/fused.h"

using namespace onnxtrain;

namespace {

struct Case {
  std::string name, op;
  std::map<std::string, std::vector<int64_t>> shapes;  // per function input
  std::map<std::string, Attribute> attrs;
};

// W2's conv activations (batch 64) for BatchNormalization; W3's token log-softmax (1024 x 1000 vocabulary),
// attention softmax and LayerNorm rows.
std::vector<Case> cases() {
  const std::vector<int64_t> c1{64, 16, 28, 28}, c2{64, 32, 14, 14}, tok{1024, 1000}, att{16, 4, 64, 64},
      ln{16, 64, 128};
  return {
      {"bn_w2_conv1", "BatchNormalizationGrad", {{"dY", c1}, {"X", c1}, {"Scale", {16}}}, {{"epsilon", 1e-5f}}},
      {"bn_w2_conv2", "BatchNormalizationGrad", {{"dY", c2}, {"X", c2}, {"Scale", {32}}}, {{"epsilon", 1e-5f}}},
      {"logsoftmax_w3_tokens", "LogSoftmaxGrad", {{"dY", tok}, {"Y", tok}}, {}},
      {"softmax_w3_attention", "SoftmaxGrad", {{"dY", att}, {"Y", att}}, {}},
      {"layernorm_w3", "LayerNormalizationGrad",
       {{"dY", ln}, {"X", ln}, {"Scale", {128}}, {"Mean", {16, 64, 1}}, {"InvStdDev", {16, 64, 1}}},
       {{"axis", int64_t{-1}}}},
  };
}

Tensor random(const std::vector<int64_t>& shape, std::mt19937& rng, double lo, double hi) {
  Tensor t = Tensor::empty(DType::Float32, shape);
  std::uniform_real_distribution<float> u(static_cast<float>(lo), static_cast<float>(hi));
  for (float& v : t.span<float>()) v = u(rng);
  return t;
}

// Rows of Y as a softmax (or log-softmax) output over the last axis.
void as_softmax(Tensor& y, bool log) {
  const int64_t n = y.shape.back(), rows = y.numel() / n;
  float* p = y.ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t j = 0; j < n; ++j) s += std::exp(p[r * n + j]);
    for (int64_t j = 0; j < n; ++j) {
      const double v = p[r * n + j] - std::log(s);
      p[r * n + j] = static_cast<float>(log ? v : std::exp(v));
    }
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, repeats = 15, iters = 20;
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--repeats" && i + 1 < argc) repeats = std::atoi(argv[++i]);
    else if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else only.push_back(a);
  }
  omp_set_num_threads(threads);
  const std::vector<Function> fns = fused_grad_functions();
  std::mt19937 rng(1);
  for (const Case& c : cases()) {
    if (!only.empty() && std::find(only.begin(), only.end(), c.name) == only.end()) continue;
    const Function* f = nullptr;
    for (const Function& g : fns)
      if (g.name == c.op) f = &g;
    if (!f) {
      std::fprintf(stderr, "no fused function %s\n", c.op.c_str());
      return 1;
    }
    Graph g;
    Node n;
    n.name = "fused";
    n.op_type = f->name;
    n.domain = f->domain;
    n.inputs = f->inputs;
    n.outputs = f->outputs;
    n.attributes = c.attrs;
    g.nodes.push_back(n);
    std::map<std::string, Tensor> feeds;
    for (const std::string& in : f->inputs) {
      Shape s;
      for (int64_t d : c.shapes.at(in)) s.push_back(Dim::of(d));
      g.inputs.push_back({in, {DType::Float32, s}});
      Tensor t = random(c.shapes.at(in), rng, in == "InvStdDev" ? 0.5 : -1, 1);
      if (in == "Y") as_softmax(t, c.op == "LogSoftmaxGrad");
      feeds[in] = std::move(t);
    }
    for (const std::string& out : f->outputs) g.outputs.push_back({out, {DType::Float32, std::nullopt}});
    const std::map<std::string, int64_t> opsets{{"", 17}, {f->domain, 1}};
    ExecutorOptions native, body;
    native.functions = body.functions = fns;
    body.prefer_function_bodies = true;
    Executor a(g, opsets, std::make_shared<TensorStore>(), native);
    Executor b(g, opsets, std::make_shared<TensorStore>(), body);
    std::vector<const Tensor*> ptrs;
    for (const std::string& in : f->inputs) ptrs.push_back(&feeds.at(in));
    auto time = [&](Executor& e) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) e.run(ptrs);
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    };
    time(a);  // warm-up (plans, first-touch of the arenas)
    time(b);
    std::vector<double> ta, tb;
    for (int r = 0; r < repeats; ++r) {
      ta.push_back(time(a));
      tb.push_back(time(b));
    }
    const double ma = median(ta), mb = median(tb);
    std::printf("%-22s %-24s native %9.1f us  body %9.1f us (%zu nodes)  body/native %.2fx\n", c.name.c_str(),
                c.op.c_str(), ma, mb, b.graph().nodes.size(), mb / ma);
  }
  return 0;
}
