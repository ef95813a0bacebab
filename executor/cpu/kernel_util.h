#pragma once
// Plan-time helpers of the CPU kernel files in executor/cpu/: the CPU-only ones (threading, the host copy kernel)
// and, re-exported so the kernel files name them unqualified, the device-neutral ones whose home is
// executor/ops/kernel_util.h.
#include <omp.h>

#include "executor/kernel.h"
#include "executor/ops/kernel_util.h"

namespace onnxtrain::cpu {

using ops::add;
using ops::contiguous_strides;
using ops::dispatch;
using ops::elem_size;
using ops::expect_grad_inputs;
using ops::fail_dtype;
using ops::has_input;
using ops::ints_of;
using ops::normalize_axis;
using ops::required_input;
using ops::set_output;
using ops::Tag;

// Elements below which threading an elementwise loop costs more than it saves: cheap ops are memory bound,
// expensive ones (pow, fmod, erf) pay off sooner.
constexpr int64_t kCheapGrain = 1 << 15;
constexpr int64_t kCostlyGrain = 1 << 12;

// Calls f(i) for every i in [0, n), split statically across the OpenMP threads when `parallel`. The serial case
// (also: one thread) is a plain loop rather than `omp parallel for if (false)`, for which libgomp still starts
// (and allocates) a one-thread team on every call.
template <class F> void parallel_for(int64_t n, bool parallel, F&& f) {
  if (!parallel || n < 2 || omp_get_max_threads() < 2) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) f(i);
}

// Output 0 = input 0's bytes. The plan usually makes the output a view, and then there is nothing to do.
class CopyKernel final : public Kernel {
 public:
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override;
  bool output_is_view_of_input0() const override { return true; }
};

}  // namespace onnxtrain::cpu
