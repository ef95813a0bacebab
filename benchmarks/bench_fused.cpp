// Times fused gradient ops through their native kernels against their own inlined standard-ONNX bodies, in
// one process, alternating the two so machine load hits both alike; prints the medians and their ratio.
//
//   bench_fused [--threads 1] [--repeats 15] [--iters N] [--list] [CASE...]
//
// CASE names rows of the table below (default: all; --list prints them). A timing sample is the mean of
// --iters runs (default: the case's own, chosen so that a sample is well above the clock's resolution);
// the median of --repeats samples is printed. float32 throughout (indices int64).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor/executor.h"
#include "gradients/fused.h"
#include "gradients/fused_graph.h"

using namespace onnxtrain;

namespace {

// How an input's values are drawn: uniform in [-1, 1]; uniform in [0.5, 1] (InvStdDev); standard normal; rows
// of a (log-)softmax output over the last axis; indices uniform in [0, below).
enum class Fill { Uniform, Positive, Normal, Softmax, LogSoftmax, Index };

struct Input {
  std::string name;
  std::vector<int64_t> dims;
  Fill fill = Fill::Uniform;
  int64_t below = 0;  // Fill::Index
};

struct Case {
  std::string name, op, about;
  std::map<std::string, Attribute> attrs;
  std::vector<Input> inputs;                        // the op's graph inputs
  std::map<std::string, TensorData> initializers;  // and its constant ones
  std::vector<std::string> outputs;                 // empty: all of the op's; "" leaves an optional one out
  int iters;                                        // runs per sample unless --iters
};

TensorData int64s(std::vector<int64_t> v) {
  return TensorData::from<int64_t>({static_cast<int64_t>(v.size())}, std::span<const int64_t>(v));
}

// Shapes of W2 (the conv net, batch 64) and W3 (the transformer: 1024 tokens of a 1000-word vocabulary,
// attention [16, 4, 64, 64], LayerNorm rows of 128). W2 itself has no BatchNormalization or AveragePool: those
// rows run the ops on W2's activation shapes. Attributes as the rules emit them: the bodies read them by
// reference and have no defaults.
std::vector<Case> cases() {
  using I = std::vector<int64_t>;
  const I c1{64, 16, 28, 28}, c2{64, 32, 14, 14}, tok{1024, 1000}, att{16, 4, 64, 64}, ln{16, 64, 128};
  const std::map<std::string, Attribute> conv3x3{
      {"kernel_shape", I{3, 3}}, {"strides", I{1, 1}}, {"dilations", I{1, 1}}, {"pads", I{1, 1, 1, 1}}, {"group", int64_t{1}}};
  return {
      {"bn_w2_conv1", "BatchNormalizationGrad", "W2 conv1's activations", {{"epsilon", 1e-5f}},
       {{"dY", c1}, {"X", c1}, {"Scale", {16}}}, {}, {}, 20},
      {"bn_w2_conv2", "BatchNormalizationGrad", "W2 conv2's activations", {{"epsilon", 1e-5f}},
       {{"dY", c2}, {"X", c2}, {"Scale", {32}}}, {}, {}, 20},
      {"logsoftmax_w3_tokens", "LogSoftmaxGrad", "W3's token log-softmax", {{"axis", int64_t{-1}}},
       {{"dY", tok}, {"Y", tok, Fill::LogSoftmax}}, {}, {}, 20},
      {"softmax_w3_attention", "SoftmaxGrad", "W3's attention softmax", {{"axis", int64_t{-1}}},
       {{"dY", att}, {"Y", att, Fill::Softmax}}, {}, {}, 20},
      {"layernorm_w3", "LayerNormalizationGrad", "W3's LayerNorm", {{"axis", int64_t{-1}}},
       {{"dY", ln}, {"X", ln}, {"Scale", {128}}, {"Mean", {16, 64, 1}}, {"InvStdDev", {16, 64, 1}, Fill::Positive}},
       {}, {}, 20},
      {"gather_w3_embedding", "GatherGrad", "W3's token embedding: data [1000, 128], indices [16, 64]",
       {{"axis", int64_t{0}}},
       {{"dY", {16, 64, 128}, Fill::Normal}, {"indices", {16, 64}, Fill::Index, 1000}},
       {{"shape", int64s({1000, 128})}}, {}, 1},
      {"conv_w2_conv2", "ConvGrad", "W2 conv2: dX, dW and dB", conv3x3,
       {{"dY", {64, 32, 14, 14}, Fill::Normal}, {"X", {64, 16, 14, 14}, Fill::Normal}, {"W", {32, 16, 3, 3}, Fill::Normal}},
       {}, {}, 1},
      {"conv_w2_conv1", "ConvGrad", "W2 conv1: dW and dB (its input needs no gradient)", conv3x3,
       {{"dY", {64, 16, 28, 28}, Fill::Normal}, {"X", {64, 1, 28, 28}, Fill::Normal}, {"W", {16, 1, 3, 3}, Fill::Normal}},
       {}, {"", "dW", "dB"}, 1},
      {"avgpool_w2_conv2", "AveragePoolGrad", "AveragePool 2x2/2 on W2 conv2's output",
       {{"kernel_shape", I{2, 2}}, {"strides", I{2, 2}}, {"pads", I{0, 0, 0, 0}}, {"count_include_pad", int64_t{0}}},
       {{"dY", {64, 32, 7, 7}, Fill::Normal}, {"X", {64, 32, 14, 14}, Fill::Normal}}, {}, {}, 1},
  };
}

Tensor make_input(const Input& in, std::mt19937& rng) {
  if (in.fill == Fill::Index) {
    Tensor t = Tensor::empty(DType::Int64, in.dims);
    std::uniform_int_distribution<int64_t> u(0, in.below - 1);
    for (int64_t& v : t.span<int64_t>()) v = u(rng);
    return t;
  }
  Tensor t = Tensor::empty(DType::Float32, in.dims);
  std::uniform_real_distribution<float> u(in.fill == Fill::Positive ? 0.5f : -1.0f, 1.0f);
  std::normal_distribution<float> nd;
  for (float& v : t.span<float>()) v = in.fill == Fill::Normal ? nd(rng) : u(rng);
  if (in.fill == Fill::Softmax || in.fill == Fill::LogSoftmax) {
    const int64_t n = t.shape.back(), rows = t.numel() / n;
    float* p = t.ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += std::exp(p[r * n + j]);
      for (int64_t j = 0; j < n; ++j) {
        const double v = p[r * n + j] - std::log(s);
        p[r * n + j] = static_cast<float>(in.fill == Fill::LogSoftmax ? v : std::exp(v));
      }
    }
  }
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A whole number of at least 1 for `option`, or a message naming it.
int positive(const std::string& option, const std::string& text) {
  size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(text, &used);
  } catch (const std::exception&) {
  }
  if (used != text.size() || v < 1) throw std::invalid_argument(option + " takes a whole number >= 1, not '" + text + "'");
  return v;
}

void bench(const Case& c, const std::vector<Function>& fns, int repeats, int iters) {
  auto f = std::find_if(fns.begin(), fns.end(), [&](const Function& g) { return g.name == c.op; });
  if (f == fns.end()) throw std::runtime_error("case " + c.name + ": no fused function " + c.op);
  std::mt19937 rng(1);
  std::map<std::string, Tensor> feeds;
  std::map<std::string, TypeInfo> types;
  for (const Input& in : c.inputs) {
    feeds[in.name] = make_input(in, rng);
    types[in.name] = static_type(feeds[in.name].dtype, in.dims);
  }
  const Graph g = fused_op_graph(c.op, c.attrs, f->inputs, types, c.outputs.empty() ? f->outputs : c.outputs,
                                 DType::Float32, c.initializers);
  const std::map<std::string, int64_t> opsets{{"", 17}, {kFusedGradDomain, 1}};
  ExecutorOptions native, body;
  native.functions = body.functions = fns;
  body.prefer_function_bodies = true;
  Executor a(g, opsets, std::make_shared<TensorStore>(), native);
  Executor b(g, opsets, std::make_shared<TensorStore>(), body);
  std::vector<const Tensor*> ptrs;
  for (const std::string& name : a.feed_names()) ptrs.push_back(&feeds.at(name));
  auto sample = [&](Executor& e, int runs) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < runs; ++i) e.run(ptrs);
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / runs;
  };
  sample(a, std::max(iters, 5));  // warm-up: plans built, arenas touched, caches warm
  sample(b, std::max(iters, 5));
  std::vector<double> ta, tb;
  for (int r = 0; r < repeats; ++r) {
    ta.push_back(sample(a, iters));
    tb.push_back(sample(b, iters));
  }
  const double ma = median(ta), mb = median(tb);
  std::printf("%-22s %-24s native %10.1f us  body %10.1f us (%zu nodes)  body/native %6.2fx  [%s]\n",
              c.name.c_str(), c.op.c_str(), ma, mb, b.graph().nodes.size(), mb / ma, c.about.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int threads = 1, repeats = 15, iters = 0;  // iters 0: each case's own
    bool list = false;
    std::vector<std::string> only;
    const std::vector<Case> all = cases();
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--threads" || a == "--repeats" || a == "--iters") {
        if (i + 1 == argc) throw std::invalid_argument(a + " needs a value");
        const int v = positive(a, argv[++i]);
        if (a == "--threads") threads = v;
        else if (a == "--repeats") repeats = v;
        else iters = v;
      } else if (a == "--list") {
        list = true;
      } else if (a.starts_with("-")) {
        throw std::invalid_argument("unknown option '" + a + "' (options: --threads, --repeats, --iters, --list)");
      } else if (std::none_of(all.begin(), all.end(), [&](const Case& c) { return c.name == a; })) {
        throw std::invalid_argument("no case '" + a + "' (--list names them)");
      } else {
        only.push_back(a);
      }
    }
    if (list) {
      for (const Case& c : all) std::printf("%-22s %-24s %s\n", c.name.c_str(), c.op.c_str(), c.about.c_str());
      return 0;
    }
    omp_set_num_threads(threads);
    const std::vector<Function> fns = fused_grad_functions();
    std::printf("float32, %d thread(s), median of %d alternating samples, each the mean of %s runs\n", threads,
                repeats, iters ? std::to_string(iters).c_str() : "the case's own number of");
    for (const Case& c : all)
      if (only.empty() || std::find(only.begin(), only.end(), c.name) != only.end())
        bench(c, fns, repeats, iters ? iters : c.iters);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_fused: %s\n", e.what());
    return 1;
  }
  return 0;
}
