// The allocation-free GEMM we could have: Eigen's own product kernel, fed packing buffers allocated once, against
// the oneDNN sgemm the executor calls (which mallocs a workspace per call; docs/performance.md, "Heap allocations
// per steady-state step"). At W1's and W3's product shapes, one thread by default:
//
//   OMP_NUM_THREADS=1 build/release/benchmarks/bench_gemm [--repeats 7] [--iters 20]
//
// Prints GFLOP/s of both, their ratio (eigen / dnnl: below 1, Eigen is slower) and the largest difference of
// their results. Ratios only mean something within one run: this machine is shared.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#pragma GCC diagnostic pop
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

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

// W3 (1024 tokens, d 128, FF 512, vocab 1000) and W1 (batch 128, 64 -> 256 -> 256): forward products (N, N),
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
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(size_t{1} << 20), b(size_t{1} << 20), c_dnnl(size_t{1} << 20), c_eigen(size_t{1} << 20);
  for (float& v : a) v = u(rng);
  for (float& v : b) v = u(rng);
  std::printf("%-22s %-3s %5s %5s %5s  %12s %12s  %s  %s\n", "product", "op", "M", "N", "K", "dnnl GF/s", "eigen GF/s",
              "eigen/dnnl", "max |diff|");
  std::vector<double> ratios;
  bool agree = true;
  for (const Shape& s : kShapes) {
    const Index lda = s.ta == 'N' ? s.k : s.m, ldb = s.tb == 'N' ? s.n : s.k, ldc = s.n;
    OwnedBlocking blocking(s.m, s.n, s.k);
    auto run_dnnl = [&] {
      if (dnnl_sgemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c_dnnl.data(), ldc) !=
          dnnl_success)
        std::abort();
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
    run_eigen();
    double diff = 0;
    for (Index i = 0; i < s.m * s.n; ++i)
      diff = std::max(diff, double(std::abs(c_dnnl[static_cast<size_t>(i)] - c_eigen[static_cast<size_t>(i)])));
    agree = agree && diff < 1e-3;  // sums of up to 1024 products of values in [-1, 1]: float rounding is ~1e-5
    double best_dnnl = 1e30, best_eigen = 1e30;
    for (int r = 0; r < repeats; ++r) {  // alternating, best of each
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) run_dnnl();
      const auto t1 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) run_eigen();
      const auto t2 = std::chrono::steady_clock::now();
      best_dnnl = std::min(best_dnnl, std::chrono::duration<double>(t1 - t0).count() / iters);
      best_eigen = std::min(best_eigen, std::chrono::duration<double>(t2 - t1).count() / iters);
    }
    const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
    ratios.push_back(best_dnnl / best_eigen);
    std::printf("%-22s %c%c  %5ld %5ld %5ld  %12.1f %12.1f  %10.2f  %.1e\n", s.what, s.ta, s.tb, long(s.m), long(s.n),
                long(s.k), flops / best_dnnl / 1e9, flops / best_eigen / 1e9, best_dnnl / best_eigen, diff);
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf("eigen / dnnl over the shapes: %.2f to %.2f (median %.2f)\n", ratios.front(), ratios.back(),
              ratios[ratios.size() / 2]);
  if (!agree) std::fprintf(stderr, "bench_gemm: Eigen's and oneDNN's products differ by more than 1e-3\n");
  return agree ? 0 : 1;
}
