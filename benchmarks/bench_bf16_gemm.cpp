// The native bfloat16 GEMM (executor/cpu/bf16_gemm.h) against the float32 one (own_sgemm, gemm.h) on the product
// shapes of W3 and of the MiniLM fine-tune, forward (X·W), input gradient (dY·W^T) and weight gradient (X^T·dY):
//   bench_bf16_gemm [--threads N] [--repeats 20]
// Each product runs once to warm up, then `repeats` times; the best time of each is printed with GFLOP/s and the
// ratio bf16/float32. The AMX kernel runs where the CPU has it; ONNXTRAIN_BF16_KERNEL=vdpbf16ps forces the vector
// kernel. Values are constants (the time does not depend on them).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "executor/cpu/bf16_gemm.h"
#include "executor/cpu/gemm.h"

using namespace onnxtrain::cpu;

namespace {

struct Shape {
  int64_t M, N, K;
  bool ta, tb;
  const char* what;
};

template <class F> double best_ms(F f, int repeats) {
  f();
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, repeats = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--threads") threads = std::atoi(argv[i + 1]);
    else if (std::string(argv[i]) == "--repeats") repeats = std::atoi(argv[i + 1]);
  }
  omp_set_num_threads(threads);
  if (!bf16_native_supported() || !own_sgemm_available()) {
    std::printf("%s; own_sgemm %s: nothing to compare\n", bf16_path_description().c_str(),
                own_sgemm_available() ? "available" : "not built");
    return 0;
  }
  if (const char* k = std::getenv("ONNXTRAIN_BF16_KERNEL"); k && std::strcmp(k, "vdpbf16ps") == 0)
    force_bf16_avx512_kernel(true);
  std::printf("%s, %d threads, best of %d\n", bf16_path_description().c_str(), threads, repeats);
  const Shape shapes[] = {
      {1024, 384, 128, false, false, "W3 q,k,v fwd (x3)"}, {1024, 1000, 128, false, false, "W3 head fwd"},
      {1024, 128, 1000, false, true, "W3 head dX"},        {128, 1000, 1024, true, false, "W3 head dW"},
      {2048, 1536, 384, false, false, "MiniLM FF1 fwd"},   {2048, 384, 1536, false, false, "MiniLM FF2 fwd"},
      {2048, 384, 1536, false, true, "MiniLM FF1 dX"},     {384, 1536, 2048, true, false, "MiniLM FF1 dW"},
  };
  for (const Shape& s : shapes) {
    std::vector<float> a(static_cast<size_t>(s.M * s.K), 0.5f), b(static_cast<size_t>(s.K * s.N), 0.25f),
        c(static_cast<size_t>(s.M * s.N));
    std::vector<uint16_t> ah(a.size(), 0x3F00), bh(b.size(), 0x3E80), ch(c.size());
    const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    const Bf16Matrix A = s.ta ? Bf16Matrix{ah.data(), 1, s.M} : Bf16Matrix{ah.data(), s.K, 1};
    const Bf16Matrix B = s.tb ? Bf16Matrix{bh.data(), 1, s.K} : Bf16Matrix{bh.data(), s.N, 1};
    const int64_t off[3] = {0, 0, 0};
    const double f32 = best_ms(
        [&] { own_sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), s.N); }, repeats);
    const double b16 = best_ms([&] { bf16_gemm(s.M, s.N, s.K, A, B, 1.0f, {}, 0.0f, ch.data(), s.N, off); }, repeats);
    const double gflop = 2.0 * double(s.M) * double(s.N) * double(s.K) / 1e9;
    std::printf("%-20s %5lld x %5lld x %5lld  float32 %8.3f ms (%5.0f GFLOP/s)  bfloat16 %8.3f ms (%5.0f GFLOP/s)  "
                "ratio %.2f\n",
                s.what, static_cast<long long>(s.M), static_cast<long long>(s.N), static_cast<long long>(s.K), f32,
                gflop / f32 * 1e3, b16, gflop / b16 * 1e3, b16 / f32);
  }
}
