#pragma once
// Plan-time helpers of the kernel factories, shared by both backends (executor/cpu/, executor/cuda/): dtype
// dispatch, registration, and reading a node's inputs, attributes and axes. Kept out of executor/kernel.h because
// they are conveniences of the factories, not part of the kernel interface. The CPU backend re-exports them from
// executor/cpu/kernel_util.h, beside its threading helpers.
#include <string>
#include <vector>

#include "executor/kernel.h"

namespace onnxtrain::ops {

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

// The (dY, Y) inputs of a fused gradient op: both present, same dtype and shape, one output (dX).
void expect_grad_inputs(const PrepareContext& ctx);

}  // namespace onnxtrain::ops
