// Times elementwise chains of the benchmark workloads run as one fused kernel (the default plan) against the
// same graph with ExecutorOptions::fuse_elementwise off (one kernel per node), in one process, alternating the
// two so machine load hits both alike; prints the medians and their ratio.
//
//   bench_fusion [--threads 1] [--repeats 15] [--iters 20] [CASE...]
//
// CASE names one of the chains below (default: all). float32, inputs random in [-1, 1] (positive where a Sqrt
// reads them).
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
#include <set>
#include <string>
#include <vector>

#include "executor/executor.h"

using namespace onnxtrain;

namespace {

Node node(std::string op, std::vector<std::string> in, std::string out) {
  Node n;
  n.op_type = std::move(op);
  n.inputs = std::move(in);
  n.name = out;
  n.outputs = {std::move(out)};
  return n;
}

struct Case {
  std::string name;
  std::vector<Node> nodes;
  std::map<std::string, std::vector<int64_t>> inputs;
  std::vector<std::string> outputs;
  std::set<std::string> positive;
};

// optimizers/optimizer.cpp's AdamW update of one weight (decoupled decay), over n parameters.
Case adamw(const std::string& name, int64_t n) {
  return {name,
          {node("Mul", {"p", "decay"}, "base"), node("Mul", {"m", "b1"}, "m1"), node("Mul", {"g", "omb1"}, "g1"),
           node("Add", {"m1", "g1"}, "nm"), node("Mul", {"g", "g"}, "gg"), node("Mul", {"gg", "omb2"}, "gg2"),
           node("Mul", {"v", "b2"}, "v1"), node("Add", {"v1", "gg2"}, "nv"), node("Sqrt", {"nv"}, "sv"),
           node("Div", {"sv", "bc2"}, "svc"), node("Add", {"svc", "eps"}, "denom"), node("Mul", {"step", "nm"}, "snm"),
           node("Div", {"snm", "denom"}, "upd"), node("Sub", {"base", "upd"}, "np")},
          {{"p", {n}}, {"m", {n}}, {"v", {n}}, {"g", {n}}, {"decay", {}}, {"b1", {}}, {"omb1", {}}, {"b2", {}},
           {"omb2", {}}, {"bc2", {}}, {"eps", {}}, {"step", {}}},
          {"nm", "nv", "np"},
          {"v", "b2", "omb2", "bc2", "eps"}};
}

std::vector<Case> cases() {
  return {
      // W3's parameters (661,736) as one tensor, and W1's (82,689).
      adamw("adamw_w3_params", 661736),
      adamw("adamw_w1_params", 82689),
      // W3's feed-forward bias + GELU as PyTorch exports it, [16, 64, 512]; the forward keeps x and 1 + erf(.)
      // for the backward, as in the training graph.
      {"bias_gelu_w3",
       {node("Add", {"h", "b"}, "x"), node("Div", {"x", "sqrt2"}, "xs"), node("Erf", {"xs"}, "e"),
        node("Add", {"e", "one"}, "e1"), node("Mul", {"x", "e1"}, "xe"), node("Mul", {"xe", "half"}, "y")},
       {{"h", {16, 64, 512}}, {"b", {512}}, {"sqrt2", {}}, {"one", {}}, {"half", {}}},
       {"y", "x", "e1"},
       {}},
      // The LayerNorm-gradient arithmetic of W3's training graph on [16, 64, 128] with per-row statistics.
      {"row_stats_w3",
       {node("Sub", {"x", "mean"}, "xc"), node("Mul", {"xc", "rstd"}, "xh"), node("Mul", {"dy", "xh"}, "a"),
        node("Mul", {"dy", "gamma"}, "dyg"), node("Mul", {"dyg", "rstd"}, "b"), node("Sub", {"b", "a"}, "c"),
        node("Mul", {"c", "k"}, "z")},
       {{"x", {16, 64, 128}}, {"mean", {16, 64, 1}}, {"rstd", {16, 64, 1}}, {"dy", {16, 64, 128}}, {"gamma", {128}},
        {"k", {}}},
       {"z", "a"},
       {"rstd"}},
  };
}

Tensor random_tensor(const std::vector<int64_t>& shape, unsigned seed, bool positive) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Tensor x = Tensor::empty(DType::Float32, shape);
  for (float& v : x.span<float>()) v = positive ? std::abs(u(rng)) + 1e-3f : u(rng);
  return x;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, repeats = 15, iters = 20;
  std::set<std::string> only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> int {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_fusion: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::atoi(argv[++i]);
    };
    if (a == "--threads") threads = next();
    else if (a == "--repeats") repeats = next();
    else if (a == "--iters") iters = next();
    else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "usage: bench_fusion [--threads N] [--repeats R] [--iters I] [CASE...]\n");
      return 2;
    } else only.insert(a);
  }
  if (threads < 1 || repeats < 1 || iters < 1) {
    std::fprintf(stderr, "bench_fusion: --threads, --repeats and --iters must be positive\n");
    return 2;
  }
  omp_set_num_threads(threads);
  std::vector<Case> all = cases();
  for (const std::string& name : only)
    if (std::none_of(all.begin(), all.end(), [&](const Case& c) { return c.name == name; })) {
      std::fprintf(stderr, "bench_fusion: unknown case '%s'; cases:", name.c_str());
      for (const Case& c : all) std::fprintf(stderr, " %s", c.name.c_str());
      std::fprintf(stderr, "\n");
      return 2;
    }
  std::printf("%-18s %6s %6s %12s %12s %8s %10s\n", "case", "steps", "fused", "unfused_us", "fused_us", "ratio",
              "max_diff");
  for (const Case& c : all) {
    if (!only.empty() && !only.count(c.name)) continue;
    Graph g;
    std::map<std::string, Tensor> feeds;
    unsigned seed = 1;
    for (const auto& [name, shape] : c.inputs) {
      Shape s;
      for (int64_t d : shape) s.push_back(Dim::of(d));
      g.inputs.push_back({name, {DType::Float32, s}});
      feeds[name] = random_tensor(shape, seed++, c.positive.count(name) != 0);
    }
    for (const std::string& o : c.outputs) g.outputs.push_back({o, {DType::Float32, std::nullopt}});
    g.nodes = c.nodes;
    ExecutorOptions off;
    off.fuse_elementwise = false;
    Executor fused(g, {{"", 17}}, std::make_shared<TensorStore>());
    Executor plain(g, {{"", 17}}, std::make_shared<TensorStore>(), off);
    std::vector<const Tensor*> ordered;
    for (const std::string& n : fused.feed_names()) ordered.push_back(&feeds.at(n));
    std::span<const Tensor* const> in(ordered);
    // Warm up (and compile), and compare the results once.
    std::vector<Tensor> a = fused.run(feeds), b = plain.run(feeds);
    double diff = 0;
    for (size_t k = 0; k < a.size(); ++k)
      for (int64_t i = 0; i < a[k].numel(); ++i)
        diff = std::max(diff, double(std::abs(a[k].ptr<float>()[i] - b[k].ptr<float>()[i])));
    std::vector<double> tf, tp;
    auto time = [&](Executor& e) {
      auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < iters; ++k) e.run(in);
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    };
    for (int r = 0; r < repeats; ++r) {
      tp.push_back(time(plain));
      tf.push_back(time(fused));
    }
    const double mp = median(tp), mf = median(tf);
    std::printf("%-18s %6zu %6zu %12.1f %12.1f %7.2fx %10.2e\n", c.name.c_str(), plain.last_plan()->num_steps(),
                fused.last_plan()->num_steps(), mp, mf, mp / mf, diff);
  }
  return 0;
}
