// Does the native ConvGrad / AveragePoolGrad kernel pay for itself? Times each fused op against its own
// inlined standard-ONNX body (Executor with prefer_function_bodies) on W2's convolution shapes (batch 64),
// float32, alternating native and body runs, and prints the median of each and their ratio.
//   bench_fused_conv [--repeats 15] [--threads 1]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "executor/executor.h"
#include "gradients/fused.h"

using namespace onnxtrain;

namespace {

struct Case {
  std::string label, op;
  std::map<std::string, Attribute> attrs;
  std::vector<std::vector<int64_t>> inputs;  // dY, X (, W)
  std::vector<std::string> outputs;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 15, threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::stoi(argv[i + 1]);
  }
  omp_set_num_threads(threads);
  using I = std::vector<int64_t>;
  const std::map<std::string, Attribute> conv3x3{
      {"kernel_shape", I{3, 3}}, {"strides", I{1, 1}}, {"dilations", I{1, 1}}, {"pads", I{1, 1, 1, 1}}, {"group", int64_t{1}}};
  const std::vector<Case> cases = {
      {"W2 conv2 (dX, dW, dB)", "ConvGrad", conv3x3, {{64, 32, 14, 14}, {64, 16, 14, 14}, {32, 16, 3, 3}}, {"dX", "dW", "dB"}},
      {"W2 conv1 (dW, dB; x needs none)", "ConvGrad", conv3x3, {{64, 16, 28, 28}, {64, 1, 28, 28}, {16, 1, 3, 3}},
       {"", "dW", "dB"}},
      {"AveragePool 2x2/2 on W2 conv2's output", "AveragePoolGrad",
       {{"kernel_shape", I{2, 2}}, {"strides", I{2, 2}}, {"pads", I{0, 0, 0, 0}}, {"count_include_pad", int64_t{0}}},
       {{64, 32, 7, 7}, {64, 32, 14, 14}}, {"dX"}},
  };
  const std::vector<Function> fns = fused_grad_functions();
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::printf("float32, %d thread(s), median of %d alternating runs\n%-40s %12s %12s %8s\n", threads, repeats,
              "case", "native ms", "body ms", "body/native");
  for (const Case& c : cases) {
    Graph g;
    Node n;
    n.name = "fused";
    n.op_type = c.op;
    n.domain = kFusedGradDomain;
    n.attributes = c.attrs;
    n.outputs = c.outputs;
    const std::vector<std::string> names{"dY", "X", "W"};
    std::map<std::string, Tensor> feeds;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      Tensor t = Tensor::empty(DType::Float32, c.inputs[i]);
      for (float& v : t.span<float>()) v = nd(rng);
      Shape s;
      for (int64_t d : t.shape) s.push_back(Dim::of(d));
      g.inputs.push_back({names[i], {DType::Float32, s}});
      n.inputs.push_back(names[i]);
      feeds[names[i]] = std::move(t);
    }
    for (const std::string& o : c.outputs)
      if (!o.empty()) g.outputs.push_back({o, {DType::Float32, std::nullopt}});
    g.nodes.push_back(n);
    const std::map<std::string, int64_t> opsets{{"", 17}, {kFusedGradDomain, 1}};
    ExecutorOptions native, body;
    native.functions = body.functions = fns;
    body.prefer_function_bodies = true;
    Executor a(g, opsets, std::make_shared<TensorStore>(), native);
    Executor b(g, opsets, std::make_shared<TensorStore>(), body);
    auto time = [&](Executor& e) {
      const auto t0 = std::chrono::steady_clock::now();
      e.run(feeds);
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    time(a);
    time(b);
    std::vector<double> ta, tb;
    for (int r = 0; r < repeats; ++r) {
      ta.push_back(time(a));
      tb.push_back(time(b));
    }
    const double ma = median(ta), mb = median(tb);
    std::printf("%-40s %12.2f %12.2f %8.2fx\n", c.label.c_str(), ma, mb, mb / ma);
  }
  return 0;
}
