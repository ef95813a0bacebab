#pragma once
// Native bfloat16 products for mixed precision on CPUs with AVX-512 BF16 (vdpbf16ps), and AMX-BF16 tiles where
// the CPU has them: Y = bf16(alpha * A·B + beta * C) with float32 accumulation, the numerics of a bfloat16
// tensor-core GEMM with a float32 accumulator.
//
// Why our own kernel rather than oneDNN's bf16 matmul primitive: every oneDNN primitive execute builds its
// argument map on the heap (5 operator new per call), and a steady training step allocates nothing
// (tests/training/test_steady_state.cpp). Like own_sgemm (gemm.h), this packs into per-thread buffers made by the
// first product on each thread. Where the CPU lacks AVX-512 BF16, MatMul and Gemm on bfloat16 keep the float32
// emulation of half_matmul.cpp (widen, float32 GEMM, round once), which says so once on stderr.
#include <cstdint>
#include <span>
#include <string>

namespace onnxtrain::cpu {

// bfloat16 elements of a matrix: element (i, j) at p[i * rs + j * cs]. Any strides (a transposed or permuted
// operand is read in place); rows or columns contiguous are the fast cases.
struct Bf16Matrix {
  const uint16_t* p = nullptr;
  int64_t rs = 0, cs = 0;
};

// True when this CPU runs vdpbf16ps (AVX-512 BF16 with AVX-512BW, by cpuid) and this build can target it.
bool bf16_native_supported();
// True when bfloat16 MatMul/Gemm kernels made from now on run natively: supported, and not forced off.
bool bf16_native_enabled();
// Tests: make kernels built from now on use the float32 emulation even where native products run (false restores
// the automatic choice). Kernels already built keep their path.
void force_bf16_emulation(bool on);
// True when the CPU also has AMX-BF16 and Linux grants this process its tile state (asked once): bf16_gemm then
// multiplies 16 x 32 x 16 blocks per instruction (tdpbf16ps) instead of vectors (vdpbf16ps).
bool bf16_amx_supported();
// Tests: use the vdpbf16ps kernel even where AMX is there (false restores AMX).
void force_bf16_avx512_kernel(bool on);
// One line saying which path bfloat16 products take on this machine, and why (docs/performance.md).
std::string bf16_path_description();

// Y[i, j] = bf16(alpha * sum_k A[i, k] B[k, j] + (c.p ? beta * C[i, j] : 0)) for M x N x K, with Y's rows ldy
// apart and its columns contiguous, accumulated in float32 and rounded to nearest even once. For each of the
// `offsets.size() / 3` products of a batch, (a, b, y) offsets in elements: A at a.p + off[3t], B at
// b.p + off[3t + 1], Y at y + off[3t + 2] (C is the same for all). Splits the work across omp_get_max_threads()
// threads (over the batch when it has enough products, else within each). Requires bf16_native_supported().
void bf16_gemm(int64_t M, int64_t N, int64_t K, Bf16Matrix a, Bf16Matrix b, float alpha, Bf16Matrix c, float beta,
               uint16_t* y, int64_t ldy, std::span<const int64_t> offsets);

}  // namespace onnxtrain::cpu
