#pragma once
// Plan-time helpers shared by the CPU kernel files in executor/cpu/. Kept out of executor/kernel.h because
// they are conveniences of this backend's factories, not part of the kernel interface.
#include <omp.h>

#include <string>
#include <vector>

#include "executor/kernel.h"

namespace onnxtrain::cpu {

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

template <class T> struct Tag {
  using type = T;
};
// Calls f(Tag<T>{}) for the T in Ts whose dtype is t; false when t is none of them.
template <class... Ts, class F> bool dispatch(DType t, F&& f) {
  return ((t == dtype_of<Ts>() ? (f(Tag<Ts>{}), true) : false) || ...);
}

// Registers an ai.onnx (or, with `domain`, another domain's) kernel valid from opset `since` on.
void add(KernelRegistry& r, const std::string& op, int64_t since, std::vector<DType> dtypes, KernelFactory f);
void add(KernelRegistry& r, const std::string& domain, const std::string& op, int64_t since, std::vector<DType> dtypes,
         KernelFactory f);

const KernelInput& required_input(const PrepareContext& ctx, size_t i, const char* name);
bool has_input(const PrepareContext& ctx, size_t i);
// The element size of t; fails for dtypes without a fixed size.
size_t elem_size(const PrepareContext& ctx, DType t);
[[noreturn]] void fail_dtype(const PrepareContext& ctx, size_t input = 0);

void set_output(PrepareContext& ctx, size_t i, DType t, std::vector<int64_t> shape);

// An int64 or int32 tensor's values; `what` names it in the error.
std::vector<int64_t> ints_of(const PrepareContext& ctx, const Tensor& t, const std::string& what);
// Negative axes count from the back; valid range is [-rank, rank).
int64_t normalize_axis(const PrepareContext& ctx, int64_t axis, int64_t rank, const std::string& what = "axis");
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);

// Output 0 = input 0's bytes. The plan usually makes the output a view, and then there is nothing to do.
class CopyKernel final : public Kernel {
 public:
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override;
  bool output_is_view_of_input0() const override { return true; }
};

// The (dY, Y) inputs of a fused gradient op: both present, same dtype and shape, one output (dX).
void expect_grad_inputs(const PrepareContext& ctx);

}  // namespace onnxtrain::cpu
