// The executor's float32 GEMM (executor/cpu/gemm.h: onnxtrain's own AVX-512 kernel, which allocates nothing per
// call) against oneDNN's dnnl_sgemm, which it replaced (a malloc'd workspace per call), and against the other
// allocation-free option, Eigen's product kernel fed packing buffers allocated once (docs/performance.md, "An
// allocation-free GEMM"). At W1's and W3's product shapes, on OMP_NUM_THREADS threads:
//
//   OMP_NUM_THREADS=1 build/release/benchmarks/bench_gemm [--repeats 7] [--iters 20]
//
// Prints GFLOP/s of each, the ratios to dnnl (below 1: slower than oneDNN) and the largest difference of their
// results from oneDNN's. Ratios only mean something within one run: this machine is shared.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#pragma GCC diagnostic pop
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "executor/cpu/gemm.h"

namespace {

using Eigen::Index;

// Eigen's blocking descriptor with buffers it does not allocate per product: the internal kernel packs into them.
struct OwnedBlocking : Eigen::internal::level3_blocking<float, float> {
  std::vector<float, Eigen::aligned_allocator<float>> a, b;
  OwnedBlocking(Index m, Index n, Index k) {
    this->m_mc = m;
    this->m_nc = n;
    this->m_kc = k;
    Eigen::internal::computeProductBlockingSizes<float, float, 1, Index>(this->m_kc, this->m_mc, this->m_nc, Index(1));
    a.resize(static_cast<size_t>(this->m_kc * this->m_mc));
    b.resize(static_cast<size_t>(this->m_kc * this->m_nc));
    this->m_blockA = a.data();
    this->m_blockB = b.data();
  }
};

// Row-major C = op(A) op(B): the kernel accumulates, so C is zeroed first, as a beta = 0 product must.
template <int LhsOrder, int RhsOrder>
void eigen_gemm(Index m, Index n, Index k, const float* a, Index lda, const float* b, Index ldb, float* c, Index ldc,
                OwnedBlocking& blocking) {
  for (Index i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
  Eigen::internal::general_matrix_matrix_product<Index, float, LhsOrder, false, float, RhsOrder, false, Eigen::RowMajor,
                                                 1>::run(m, n, k, a, lda, b, ldb, c, 1, ldc, 1.0f, blocking, nullptr);
}

struct Shape {
  const char* what;
  char ta, tb;
  Index m, n, k;
};

// W3 (1024 tokens, d 128, FF 512, vocab 1000), W1 (batch 128, 64 -> 256 -> 256): forward products (N, N),
// input gradients (N, T) and weight gradients (T, N).
const Shape kShapes[] = {
    {"w3 qkv/o forward", 'N', 'N', 1024, 128, 128},  {"w3 qkv/o input grad", 'N', 'T', 1024, 128, 128},
    {"w3 ff1 forward", 'N', 'N', 1024, 512, 128},    {"w3 ff2 forward", 'N', 'N', 1024, 128, 512},
    {"w3 head forward", 'N', 'N', 1024, 1000, 128},  {"w3 head input grad", 'N', 'T', 1024, 128, 1000},
    {"w3 qkv weight grad", 'T', 'N', 128, 128, 1024}, {"w3 ff1 weight grad", 'T', 'N', 128, 512, 1024},
    {"w3 ff2 weight grad", 'T', 'N', 512, 128, 1024}, {"w3 head weight grad", 'T', 'N', 128, 1000, 1024},
    {"w1 fc1 forward", 'N', 'N', 128, 256, 64},      {"w1 fc2 forward", 'N', 'N', 128, 256, 256},
    {"w1 fc1 weight grad", 'T', 'N', 64, 256, 128},  {"w1 fc2 weight grad", 'T', 'N', 256, 256, 128},
    {"w1 fc2 input grad", 'N', 'T', 128, 256, 256},
    // One attention head of W3 (64 tokens, 32 dims), as each of the 64 matrices of a batched product:
    // scores Q K^T and their gradient dP V^T, P V and dS K, and the weight-like P^T dO and dS^T Q.
    {"w3 attn scores", 'N', 'T', 64, 64, 32},        {"w3 attn P V", 'N', 'N', 64, 32, 64},
    {"w3 attn P^T dO", 'T', 'N', 64, 32, 64},
    // W5, all-MiniLM-L6-v2 at batch 16 x 128 (2048 tokens, d 384, FF 1536), and one of its 192 attention heads
    // per layer (128 tokens, 32 dims).
    {"w5 qkv/o forward", 'N', 'N', 2048, 384, 384},  {"w5 qkv/o input grad", 'N', 'T', 2048, 384, 384},
    {"w5 qkv/o weight grad", 'T', 'N', 384, 384, 2048},
    {"w5 ff1 forward", 'N', 'N', 2048, 1536, 384},   {"w5 ff2 forward", 'N', 'N', 2048, 384, 1536},
    {"w5 ff1 input grad", 'N', 'T', 2048, 384, 1536}, {"w5 ff2 input grad", 'N', 'T', 2048, 1536, 384},
    {"w5 ff1 weight grad", 'T', 'N', 384, 1536, 2048}, {"w5 ff2 weight grad", 'T', 'N', 1536, 384, 2048},
    {"w5 attn scores", 'N', 'T', 128, 128, 32},      {"w5 attn P V", 'N', 'N', 128, 32, 128},
    {"w5 attn P^T dO", 'T', 'N', 128, 32, 128},
};

}  // namespace

int main(int argc, char** argv) {
  int repeats = 7, iters = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--repeats" || a == "--iters") && i + 1 < argc) (a == "--repeats" ? repeats : iters) = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_gemm [--repeats R] [--iters N]\n");
      return 2;
    }
  }
  if (repeats < 1 || iters < 1) {
    std::fprintf(stderr, "bench_gemm: --repeats and --iters must be positive\n");
    return 2;
  }
  if (!onnxtrain::cpu::own_sgemm_available())
    std::printf("this build has no AVX-512 kernel: the \"own\" column below is oneDNN's sgemm again\n");
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  size_t kElems = 0;  // the largest operand or result of any shape
  for (const Shape& s : kShapes)
    kElems = std::max({kElems, static_cast<size_t>(s.m * s.k), static_cast<size_t>(s.k * s.n),
                       static_cast<size_t>(s.m * s.n)});
  std::vector<float> a(kElems), b(kElems), c_dnnl(kElems), c_own(kElems), c_eigen(kElems);
  for (float& v : a) v = u(rng);
  for (float& v : b) v = u(rng);
  std::printf("threads: %d\n", omp_get_max_threads());
  std::printf("%-22s %-3s %5s %5s %5s  %9s %9s %9s  %8s %10s  %s\n", "product", "op", "M", "N", "K", "dnnl GF/s",
              "own GF/s", "eigen GF/s", "own/dnnl", "eigen/dnnl", "max |diff| own, eigen");
  std::vector<double> own_ratios, eigen_ratios;
  bool agree = true;
  for (const Shape& s : kShapes) {
    const Index lda = s.ta == 'N' ? s.k : s.m, ldb = s.tb == 'N' ? s.n : s.k, ldc = s.n;
    OwnedBlocking blocking(s.m, s.n, s.k);
    auto run_dnnl = [&] {
      if (dnnl_sgemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c_dnnl.data(), ldc) !=
          dnnl_success)
        std::abort();
    };
    auto run_own = [&] {
      if (!onnxtrain::cpu::own_sgemm_available()) {
        dnnl_sgemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c_own.data(), ldc);
        return;
      }
      onnxtrain::cpu::own_sgemm(s.ta == 'T', s.tb == 'T', s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f,
                                c_own.data(), ldc);
    };
    auto run_eigen = [&] {
      using Eigen::ColMajor;
      using Eigen::RowMajor;
      if (s.ta == 'N' && s.tb == 'N')
        eigen_gemm<RowMajor, RowMajor>(s.m, s.n, s.k, a.data(), lda, b.data(), ldb, c_eigen.data(), ldc, blocking);
      else if (s.ta == 'N')
        eigen_gemm<RowMajor, ColMajor>(s.m, s.n, s.k, a.data(), lda, b.data(), ldb, c_eigen.data(), ldc, blocking);
      else
        eigen_gemm<ColMajor, RowMajor>(s.m, s.n, s.k, a.data(), lda, b.data(), ldb, c_eigen.data(), ldc, blocking);
    };
    run_dnnl();
    run_own();
    run_eigen();
    double diff_own = 0, diff_eigen = 0;
    for (Index i = 0; i < s.m * s.n; ++i) {
      const double ref = c_dnnl[static_cast<size_t>(i)];
      diff_own = std::max(diff_own, std::abs(c_own[static_cast<size_t>(i)] - ref));
      diff_eigen = std::max(diff_eigen, std::abs(c_eigen[static_cast<size_t>(i)] - ref));
    }
    // Sums of up to 1024 products of values in [-1, 1]: float rounding is ~1e-5.
    agree = agree && diff_own < 1e-3 && diff_eigen < 1e-3;
    double best_dnnl = 1e30, best_own = 1e30, best_eigen = 1e30;
    auto time = [&](auto&& run, double& best) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) run();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
    };
    for (int r = 0; r < repeats; ++r) {  // interleaved, best of each
      time(run_dnnl, best_dnnl);
      time(run_own, best_own);
      time(run_eigen, best_eigen);
    }
    const double gflop = 2.0 * double(s.m) * double(s.n) * double(s.k) / 1e9;
    own_ratios.push_back(best_dnnl / best_own);
    eigen_ratios.push_back(best_dnnl / best_eigen);
    std::printf("%-22s %c%c  %5ld %5ld %5ld  %9.1f %9.1f %9.1f  %8.2f %10.2f  %.1e, %.1e\n", s.what, s.ta, s.tb,
                long(s.m), long(s.n), long(s.k), gflop / best_dnnl, gflop / best_own, gflop / best_eigen,
                best_dnnl / best_own, best_dnnl / best_eigen, diff_own, diff_eigen);
  }
  for (auto* r : {&own_ratios, &eigen_ratios}) std::sort(r->begin(), r->end());
  std::printf("own / dnnl over the shapes: %.2f to %.2f (median %.2f)\n", own_ratios.front(), own_ratios.back(),
              own_ratios[own_ratios.size() / 2]);
  std::printf("eigen / dnnl over the shapes: %.2f to %.2f (median %.2f)\n", eigen_ratios.front(), eigen_ratios.back(),
              eigen_ratios[eigen_ratios.size() / 2]);
  if (!agree) std::fprintf(stderr, "bench_gemm: the products differ from oneDNN's by more than 1e-3\n");
  return agree ? 0 : 1;
}
