// The CUDA backend's structure, checked on any machine (no GPU needed): every CPU kernel key has a CUDA twin
// in the registry, device names parse in one place, and a missing CUDA says clearly what is missing. Also
// the shared host/device functors the CPU kernels do not call themselves (the CPU's Eigen paths), against
// independent formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "executor/device.h"
#include "executor/executor.h"
#include "executor/functors.h"
#include "executor/kernel.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

std::string key(const KernelDef& d) {
  std::string s = (d.domain.empty() ? std::string() : d.domain + ".") + d.op_type + " [" +
                  std::to_string(d.since_version) + "," + std::to_string(d.end_version) + "] dtypes:";
  for (DType t : d.dtypes) s += " " + dtype_name(t);
  if (d.shape_only) s += " shape_only";
  return s;
}

// Ops that have CPU kernels only, for now: those issue 24 added (recurrent networks, the spatial and
// normalization ops, control flow) landed on the CPU first, with no GPU at hand to test CUDA kernels on. A CUDA
// plan that meets one fails at plan time naming the node and op ("no cuda kernel for op 'LSTM'"). The list must
// be exact: giving one of these a CUDA kernel fails the test until its name goes from here too.
const std::set<std::string> kCpuOnlyOps = {
    "LSTM", "GRU", "RNN", "onnxtrain.LSTMGrad", "onnxtrain.GRUGrad", "onnxtrain.RNNGrad",
    "GridSample", "Col2Im", "MaxRoiPool", "MaxUnpool", "LpPool", "GlobalLpPool",
    "onnxtrain.GridSampleGrad", "onnxtrain.MaxRoiPoolGrad",
    "LRN", "LpNormalization", "MeanVarianceNormalization", "Det", "Shrink", "CenterCropPad", "Compress",
    "If", "Loop", "Scan",
};

std::string op_of(const KernelDef& d) { return (d.domain.empty() ? std::string() : d.domain + ".") + d.op_type; }

TEST(CudaTwins, EveryCpuKernelKeyHasACudaTwin) {
  if (!built_with_cuda()) GTEST_SKIP() << "built without CUDA, so no CUDA kernels are registered: nothing to compare";
  const KernelRegistry& reg = default_kernels();
  std::multiset<std::string> cuda_keys;
  for (const KernelDef& d : reg.all())
    if (d.device == Device::CUDA) cuda_keys.insert(key(d));
  // Every CPU kernel key (domain, op, opset range, dtypes) has a CUDA twin: a new CPU kernel without one fails
  // here, naming its key.
  std::vector<std::string> missing;
  std::set<std::string> cpu_only_seen;
  for (const KernelDef& d : reg.all()) {
    if (d.device != Device::CPU) continue;
    if (kCpuOnlyOps.count(op_of(d))) {
      cpu_only_seen.insert(op_of(d));
      EXPECT_FALSE(cuda_keys.count(key(d))) << op_of(d) << " has a CUDA kernel now: take it off kCpuOnlyOps";
    } else if (!cuda_keys.count(key(d))) {
      missing.push_back(key(d));
    }
  }
  for (const std::string& op : kCpuOnlyOps)
    EXPECT_TRUE(cpu_only_seen.count(op)) << op << " is listed as CPU-only but has no CPU kernel";
  EXPECT_TRUE(missing.empty()) << "CPU kernels without a CUDA twin (same domain, op, opset range, dtypes):\n  "
                               << [&] {
                                    std::string s;
                                    for (const std::string& u : missing) s += u + "\n  ";
                                    return s;
                                  }();
  // Every CUDA def must twin a CPU def (no CUDA-only keys that the CPU tests would not cover).
  std::multiset<std::string> cpu_keys;
  for (const KernelDef& d : reg.all())
    if (d.device == Device::CPU) cpu_keys.insert(key(d));
  for (const std::string& k : cuda_keys) EXPECT_TRUE(cpu_keys.count(k)) << "CUDA kernel without a CPU twin: " << k;
}

TEST(Device, ParsesNamesInOnePlace) {
  EXPECT_EQ(parse_device("cpu"), Device::CPU);
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda0", "CPU", ""}) {
    try {
      parse_device(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("expected \"cpu\", \"cuda\", \"cuda:N\""), std::string::npos) << e.what();
    }
  }
}

// On a machine without CUDA (this build has none, or no device is visible) every way onto the GPU fails
// with the reason, never a crash.
TEST(Device, MissingCudaIsAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present; the missing-CUDA errors cannot be observed here";
  const std::string why = cuda_unavailable_reason();
  ASSERT_FALSE(why.empty());
  if (!built_with_cuda()) EXPECT_NE(why.find("built without CUDA"), std::string::npos) << why;
  else EXPECT_NE(why.find("no CUDA device"), std::string::npos) << why;
  auto expect_reason = [&](auto&& f) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  expect_reason([] { parse_device("cuda:0"); });
  expect_reason([] { parse_device("cuda"); });
  expect_reason([] { Tensor::empty(DType::Float32, {4}, Device::CUDA); });
  expect_reason([] {
    ExecutorOptions o;
    o.device = Device::CUDA;
    Executor ex(Graph{}, {{"", 17}}, std::make_shared<TensorStore>(), o);
  });
}

// The CPU's Sigmoid, Tanh, Exp and Log go through Eigen, so their functors (which the CUDA kernels use) are
// checked here against the textbook formulas in long double, including the far tails.
TEST(SharedFunctors, TranscendentalsTheCpuComputesWithEigen) {
  for (double x : {-800.0, -30.0, -1.5, -1e-8, 0.0, 2e-8, 0.7, 12.0, 90.0, 800.0}) {
    const long double xl = x;
    EXPECT_NEAR(SigmoidOp{}(x), static_cast<double>(1.0L / (1.0L + std::exp(-xl))), 1e-15) << x;
    EXPECT_NEAR(SigmoidOp{}(static_cast<float>(x)), static_cast<float>(1.0L / (1.0L + std::exp(-xl))), 1e-7) << x;
    EXPECT_DOUBLE_EQ(TanhOp{}(x), static_cast<double>(std::tanh(xl))) << x;
    if (std::abs(x) < 700) {
      EXPECT_NEAR(ExpOp{}(x) / static_cast<double>(std::exp(xl)), 1.0, 1e-15) << x;
    }
    if (x > 0) {
      EXPECT_NEAR(LogOp{}(x), static_cast<double>(std::log(xl)), 1e-14) << x;
    }
  }
  EXPECT_TRUE(std::isnan(LogOp{}(-1.0)));
  EXPECT_EQ(LogOp{}(0.0), -INFINITY);
}

// The optimizer update functors against the ONNX spec's formulas, written independently in double.
TEST(SharedFunctors, OptimizerStepsFollowTheOnnxFormulas) {
  const double x = 0.8, g = -0.3, v = 0.05, h = 0.02, r = 0.1, norm = 0.01;
  {
    const auto s = adam_step<double>(r, 3, 0.9, 0.999, 1e-6, norm, 0.0);
    double xn, vn, hn;
    s(x, g, v, h, xn, vn, hn);
    const double gr = norm * x + g, v2 = 0.9 * v + 0.1 * gr, h2 = 0.999 * h + 0.001 * gr * gr;
    const double rate = r * std::sqrt(1 - std::pow(0.999, 3)) / (1 - std::pow(0.9, 3));
    EXPECT_NEAR(vn, v2, 1e-15);
    EXPECT_NEAR(hn, h2, 1e-15);
    EXPECT_NEAR(xn, x - rate * v2 / (std::sqrt(h2) + 1e-6), 1e-14);
  }
  {
    for (bool nesterov : {false, true})
      for (int64_t t : {0, 4}) {
        const auto s = momentum_step<double>(r, t, 0.9, 0.5, norm, nesterov);
        double xn, vn;
        s(x, g, v, xn, vn);
        const double beta = t > 0 ? 0.5 : 1.0, gr = norm * x + g, v2 = 0.9 * v + beta * gr;
        EXPECT_NEAR(vn, v2, 1e-15);
        EXPECT_NEAR(xn, nesterov ? x - r * (gr + 0.9 * v2) : x - r * v2, 1e-15);
      }
  }
  {
    const auto s = adagrad_step<double>(r, 5, 0.1, 1e-6, norm);
    double xn, hn;
    s(x, g, h, xn, hn);
    const double gr = norm * x + g, h2 = h + gr * gr;
    EXPECT_NEAR(hn, h2, 1e-15);
    EXPECT_NEAR(xn, x - r / (1 + 5 * 0.1) * gr / (std::sqrt(h2) + 1e-6), 1e-15);
  }
}

}  // namespace
}  // namespace onnxtrain
