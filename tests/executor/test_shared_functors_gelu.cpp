// The GELU gradient functors the CUDA kernels call (the CPU kernels evaluate the same formulas as Eigen
// expressions): checked on the CPU against the CPU kernels and against central differences of the forward
// functors, so the GPU's maths is tested without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "executor/executor.h"
#include "executor/functors.h"

namespace onnxtrain {
namespace {

// dX of the CPU kernel `op` (domain onnxtrain) for dY and X.
std::vector<double> cpu_grad(const std::string& op, const std::vector<double>& dy, const std::vector<double>& x) {
  Node n;
  n.name = "g";
  n.op_type = op;
  n.domain = "onnxtrain";
  n.inputs = {"dy", "x"};
  n.outputs = {"dx"};
  Graph g;
  g.nodes = {n};
  g.inputs = {{"dy", {DType::Float64, std::nullopt}}, {"x", {DType::Float64, std::nullopt}}};
  g.outputs = {{"dx", {DType::Undefined, std::nullopt}}};
  Executor ex(g, {{"", 17}, {"onnxtrain", 1}}, std::make_shared<TensorStore>(), ExecutorOptions{});
  const auto len = static_cast<int64_t>(x.size());
  const std::vector<Tensor> out =
      ex.run({{"dy", Tensor::from_vector<double>({len}, dy)}, {"x", Tensor::from_vector<double>({len}, x)}});
  return {out[0].ptr<double>(), out[0].ptr<double>() + len};
}

TEST(SharedFunctors, GeluGradientsMatchTheCpuKernelsAndCentralDifferences) {
  std::vector<double> x, dy;
  for (double v = -9.0; v <= 9.0; v += 0.37) {
    x.push_back(v);
    dy.push_back(0.5 + 0.1 * v);
  }
  const std::vector<double> erf_cpu = cpu_grad("GeluGrad", dy, x), tanh_cpu = cpu_grad("GeluTanhGrad", dy, x);
  const double h = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = GeluErfGradFn{}(dy[i], x[i]), t = GeluTanhGradFn{}(dy[i], x[i]);
    EXPECT_NEAR(e, erf_cpu[i], 1e-12) << x[i];
    EXPECT_NEAR(t, tanh_cpu[i], 1e-12) << x[i];
    EXPECT_NEAR(e, dy[i] * (GeluOp{}(x[i] + h) - GeluOp{}(x[i] - h)) / (2 * h), 1e-7) << x[i];
    EXPECT_NEAR(t, dy[i] * (GeluTanhOp{}(x[i] + h) - GeluTanhOp{}(x[i] - h)) / (2 * h), 1e-7) << x[i];
    EXPECT_NEAR(GeluErfGradFn{}(static_cast<float>(dy[i]), static_cast<float>(x[i])), e, 1e-5 * (1 + std::abs(e)));
  }
}

}  // namespace
}  // namespace onnxtrain
