// Half-precision products for mixed precision: float16/bfloat16 operands and result, float32 accumulation and
// scalars (CUBLAS_COMPUTE_32F), through cublasGemmEx / cublasGemmStridedBatchedEx. matmul.cu's MatMul and Gemm
// kernels call this for their half-precision instantiations, so batching and Gemm's bias stay in one place.
// Never run here (no GPU on the build machine); tests/executor/test_cuda_parity.cpp compares it with the CPU.
#include "executor/cuda/common.h"
#include "graph/error.h"

namespace onnxtrain::cuda {

void gemm_half(DType t, cublasOperation_t opb, cublasOperation_t opa, int64_t n, int64_t m, int64_t k, float alpha,
               const void* b, int64_t ldb, int64_t sb, const void* a, int64_t lda, int64_t sa, float beta, void* c,
               int64_t ldc, int64_t sc, int64_t batch) {
  if (t != DType::Float16 && t != DType::BFloat16)
    throw Error("half-precision GEMM called for " + dtype_name(t) + " (float16 or bfloat16 expected)");
  const cudaDataType_t dt = t == DType::Float16 ? CUDA_R_16F : CUDA_R_16BF;
  // The default algorithm may use tensor cores; with float32 compute they accumulate in float32.
  if (batch == 1) {
    check(cublasGemmEx(cublas(), opb, opa, n, m, k, &alpha, b, dt, ldb, a, dt, lda, &beta, c, dt, ldc,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
    return;
  }
  check(cublasGemmStridedBatchedEx(cublas(), opb, opa, n, m, k, &alpha, b, dt, ldb, sb, a, dt, lda, sa, &beta, c, dt,
                                   ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
}

}  // namespace onnxtrain::cuda
