// Linear-algebra kernels on the CPU: Det.
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "executor/cpu/kernel_util.h"
#include "executor/kernel.h"

namespace onnxtrain {
namespace {

// ---- Det: the determinant of each M x M matrix of X [..., M, M], by LU decomposition with partial pivoting
// in double (M^3 / 3 multiply-adds per matrix); an exactly singular matrix gives 0. M = 0 gives 1 (the empty
// product), as numpy does. One matrix per task.

template <class T> class DetKernel final : public Kernel {
 public:
  DetKernel(int64_t batch, int64_t m) : batch_(batch), m_(m) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* x = in[0]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const int64_t m = m_;
    cpu::parallel_for(batch_, batch_ * m * m * m > (1 << 15), [&](int64_t b) {
      std::vector<double> a(x + b * m * m, x + (b + 1) * m * m);
      double det = 1.0;
      for (int64_t k = 0; k < m && det != 0.0; ++k) {
        int64_t p = k;  // the row with the largest pivot candidate
        for (int64_t i = k + 1; i < m; ++i)
          if (std::abs(a[i * m + k]) > std::abs(a[p * m + k])) p = i;
        if (a[p * m + k] == 0.0) {
          det = 0.0;
          break;
        }
        if (p != k) {
          for (int64_t j = 0; j < m; ++j) std::swap(a[k * m + j], a[p * m + j]);
          det = -det;
        }
        const double pivot = a[k * m + k];
        det *= pivot;
        for (int64_t i = k + 1; i < m; ++i) {
          const double f = a[i * m + k] / pivot;
          for (int64_t j = k + 1; j < m; ++j) a[i * m + j] -= f * a[k * m + j];
        }
      }
      y[b] = static_cast<T>(det);
    });
  }

 private:
  int64_t batch_, m_;
};

std::unique_ptr<Kernel> make_det(PrepareContext& ctx) {
  const KernelInput& x = cpu::required_input(ctx, 0, "X");
  const size_t r = x.shape.size();
  if (r < 2 || x.shape[r - 1] != x.shape[r - 2])
    ctx.fail("input X must have shape [..., M, M] (square matrices), got " + shape_string(x.shape));
  std::vector<int64_t> batch_shape(x.shape.begin(), x.shape.end() - 2);
  int64_t batch = 1;
  for (int64_t d : batch_shape) batch *= d;
  cpu::set_output(ctx, 0, x.dtype, batch_shape);
  const int64_t m = x.shape[r - 1];
  std::unique_ptr<Kernel> k;
  cpu::dispatch<float, double>(x.dtype, [&](auto tag) {
    k = std::make_unique<DetKernel<typename decltype(tag)::type>>(batch, m);
  });
  if (!k) cpu::fail_dtype(ctx);
  return k;
}

}  // namespace

void register_cpu_linalg(KernelRegistry& r) {
  cpu::add(r, "Det", 11, {DType::Float32, DType::Float64}, make_det);
}

}  // namespace onnxtrain
