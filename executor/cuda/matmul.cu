// MatMul and Gemm on CUDA through cuBLAS. Row-major C = A B is computed as column-major C^T = B^T A^T, so no
// data is transposed. Batched MatMul uses one strided-batched call when each operand's batch is either the
// output's or a single matrix shared by all (stride 0); other broadcast patterns loop over batches.
// Gemm's C is broadcast into Y by a small kernel and then accumulated with beta. cuBLAS's default math mode
// is kept (no TF32), so float32 results stay comparable with the CPU's. float16/bfloat16 (mixed precision) run
// the same kernels through half_matmul.cu's GemmEx call, accumulating in float32. The checks, output and geometry
// are the op layer's (executor/ops/matmul.h), which the CPU factories call too, so this never runs them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <memory>
#include <optional>
#include <type_traits>

#include "executor/cuda/common.h"
#include "executor/cuda/device_util.cuh"
#include "executor/ops/matmul.h"

namespace onnxtrain::cuda {
namespace {

template <class T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const T* a, int64_t lda, int64_t sa,
          const T* b, int64_t ldb, int64_t sb, double beta, T* c, int64_t ldc, int64_t sc, int64_t batch) {
  // Column-major view: C^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m).
  const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    const DType t = std::is_same_v<T, __half> ? DType::Float16 : DType::BFloat16;
    gemm_half(t, opb, opa, n, m, k, static_cast<float>(alpha), b, ldb, sb, a, lda, sa, static_cast<float>(beta), c,
              ldc, sc, batch);
  } else {
    const T al = static_cast<T>(alpha), be = static_cast<T>(beta);
    if constexpr (std::is_same_v<T, float>)
      check(cublasSgemmStridedBatched(cublas(), opb, opa, n, m, k, &al, b, ldb, sb, a, lda, sa, &be, c, ldc, sc, batch),
            "cublasSgemmStridedBatched");
    else
      check(cublasDgemmStridedBatched(cublas(), opb, opa, n, m, k, &al, b, ldb, sb, a, lda, sa, &be, c, ldc, sc, batch),
            "cublasDgemmStridedBatched");
  }
}

// Batch offsets (in matrices) of A and B for each output batch, under numpy broadcasting.
struct BatchPlan {
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0;  // used when `uniform`
  bool uniform = true;
  std::vector<int64_t> off_a, off_b;   // otherwise, per output batch
};

BatchPlan plan_batches(std::vector<int64_t> ba, std::vector<int64_t> bb, const std::vector<int64_t>& out) {
  BatchPlan p;
  const size_t r = out.size();
  ba.insert(ba.begin(), r - ba.size(), 1);
  bb.insert(bb.begin(), r - bb.size(), 1);
  for (int64_t d : out) p.batch *= d;
  const int64_t na = numel_of(ba), nb = numel_of(bb);
  if ((na == p.batch || na == 1) && (nb == p.batch || nb == 1)) {
    p.stride_a = na == 1 ? 0 : 1;
    p.stride_b = nb == 1 ? 0 : 1;
    return p;
  }
  p.uniform = false;
  for (int64_t i = 0; i < p.batch; ++i) {
    int64_t rem = i, oa = 0, ob = 0, sa = 1, sb = 1;
    for (size_t d = r; d-- > 0;) {
      const int64_t c = rem % out[d];
      rem /= out[d];
      oa += (ba[d] == 1 ? 0 : c) * sa;
      ob += (bb[d] == 1 ? 0 : c) * sb;
      sa *= ba[d];
      sb *= bb[d];
    }
    p.off_a.push_back(oa);
    p.off_b.push_back(ob);
  }
  return p;
}

template <class T> class MatMulKernel final : public Kernel {
 public:
  MatMulKernel(int64_t m, int64_t n, int64_t k, BatchPlan p) : m_(m), n_(n), k_(k), p_(std::move(p)) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* a = in[0]->ptr<T>();
    const T* b = in[1]->ptr<T>();
    T* c = out[0]->ptr<T>();
    if (out[0]->numel() == 0) return;
    const int64_t ma = m_ * k_, mb = k_ * n_, mc = m_ * n_;
    if (k_ == 0) {
      check(cudaMemsetAsync(c, 0, out[0]->nbytes(), stream()), "MatMul zero fill");
      return;
    }
    if (p_.uniform) {
      gemm<T>(false, false, m_, n_, k_, 1.0, a, k_, p_.stride_a * ma, b, n_, p_.stride_b * mb, 0.0, c, n_, mc, p_.batch);
      return;
    }
    for (int64_t i = 0; i < p_.batch; ++i)
      gemm<T>(false, false, m_, n_, k_, 1.0, a + p_.off_a[i] * ma, k_, 0, b + p_.off_b[i] * mb, n_, 0, 0.0, c + i * mc,
              n_, 0, 1);
  }

 private:
  int64_t m_, n_, k_;
  BatchPlan p_;
};

std::unique_ptr<Kernel> make_matmul(PrepareContext& ctx) {
  const ops::MatMulGeometry g = ops::prepare_matmul(ctx);
  const int64_t m = g.M, n = g.N, k = g.K;
  BatchPlan p = plan_batches(g.a_batch, g.b_batch, g.out_batch);
  switch (ctx.inputs[0].dtype) {
    case DType::Float64: return std::make_unique<MatMulKernel<double>>(m, n, k, std::move(p));
    case DType::Float16: return std::make_unique<MatMulKernel<__half>>(m, n, k, std::move(p));
    case DType::BFloat16: return std::make_unique<MatMulKernel<__nv_bfloat16>>(m, n, k, std::move(p));
    default: return std::make_unique<MatMulKernel<float>>(m, n, k, std::move(p));
  }
}

template <class T> __global__ void broadcast_copy_kernel(Strides<1> s, int64_t count, const T* x, T* y) {
  for (int64_t i = global_index(); i < count; i += grid_stride()) {
    int64_t off[1];
    s.offsets(i, off);
    y[i] = x[off[0]];
  }
}

template <class T> class GemmKernel final : public Kernel {
 public:
  GemmKernel(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, double beta, std::optional<BroadcastPlan> c)
      : ta_(ta), tb_(tb), m_(m), n_(n), k_(k), alpha_(alpha), beta_(beta), c_(std::move(c)) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    T* y = out[0]->ptr<T>();
    const int64_t count = m_ * n_;
    if (count == 0) return;
    double beta = 0.0;
    if (c_ && in.size() > 2 && in[2]) {
      broadcast_copy_kernel<<<blocks_for(count), kBlock, 0, stream()>>>(strides_of<1>(*c_), count, in[2]->ptr<T>(), y);
      check_launch("Gemm bias broadcast");
      beta = beta_;
    }
    if (k_ == 0 && beta == 0.0) {
      check(cudaMemsetAsync(y, 0, out[0]->nbytes(), stream()), "Gemm zero fill");
      return;
    }
    gemm<T>(ta_, tb_, m_, n_, k_, alpha_, in[0]->ptr<T>(), ta_ ? m_ : k_, 0, in[1]->ptr<T>(), tb_ ? k_ : n_, 0, beta, y,
            n_, 0, 1);
  }

 private:
  bool ta_, tb_;
  int64_t m_, n_, k_;
  double alpha_, beta_;
  std::optional<BroadcastPlan> c_;
};

std::unique_ptr<Kernel> make_gemm(PrepareContext& ctx) {
  const ops::GemmGeometry g = ops::prepare_gemm(ctx);
  const bool ta = g.trans_a, tb = g.trans_b;
  const int64_t m = g.M, n = g.N, k = g.K;
  const double alpha = g.alpha, beta = g.beta;
  std::optional<BroadcastPlan> c;
  if (g.has_c && beta != 0.0) c = plan_broadcast(std::vector<std::vector<int64_t>>{g.c_shape}, ctx.outputs[0].shape);
  switch (ctx.inputs[0].dtype) {
    case DType::Float64: return std::make_unique<GemmKernel<double>>(ta, tb, m, n, k, alpha, beta, c);
    case DType::Float16: return std::make_unique<GemmKernel<__half>>(ta, tb, m, n, k, alpha, beta, c);
    case DType::BFloat16: return std::make_unique<GemmKernel<__nv_bfloat16>>(ta, tb, m, n, k, alpha, beta, c);
    default: return std::make_unique<GemmKernel<float>>(ta, tb, m, n, k, alpha, beta, c);
  }
}

}  // namespace

void register_cuda_matmul(KernelRegistry& r) {
  twin(r, "MatMul", make_matmul);
  twin(r, "Gemm", make_gemm);
}

}  // namespace onnxtrain::cuda
