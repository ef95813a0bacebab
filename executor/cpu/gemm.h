#pragma once
// onnxtrain's own float32 GEMM for AVX-512 CPUs: row-major C = alpha * op(A) · op(B) + beta * C.
//
// Why not oneDNN's dnnl_sgemm, which it replaces in MatMul and Gemm: sgemm mallocs its packing workspace on
// every call and, on two threads, wraps its parallel body in a std::function, so a steady-state training step
// was never free of heap allocations (W3: 39 per step). This one packs into a per-thread buffer allocated once
// (the first product on each thread), and runs within a few percent of sgemm on the benchmark shapes
// (benchmarks/bench_gemm.cpp; docs/performance.md, "An allocation-free GEMM").
#include <cstdint>

namespace onnxtrain::cpu {

// True when this build has the kernel (compiled for AVX-512F); otherwise callers keep dnnl_sgemm.
bool own_sgemm_available();

// Row-major C[M, N] = alpha * op(A)[M, K] · op(B)[K, N] + beta * C. op(A) is A stored [M, K] with row stride lda,
// or with trans_a the transpose of A stored [K, M]; the same for B. beta == 0 writes C without reading it (NaN
// in C does not leak). Splits the product across omp_get_max_threads() threads. Requires
// own_sgemm_available().
void own_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace onnxtrain::cpu
