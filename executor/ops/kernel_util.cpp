// The factories' plan-time helpers (kernel_util.h), shared by the CPU and CUDA kernels.
#include "executor/ops/kernel_util.h"

namespace onnxtrain::ops {

void add(KernelRegistry& r, const std::string& op, int64_t since, std::vector<DType> dtypes, KernelFactory f) {
  add(r, "", op, since, std::move(dtypes), std::move(f));
}

void add(KernelRegistry& r, const std::string& domain, const std::string& op, int64_t since, std::vector<DType> dtypes,
         KernelFactory f) {
  KernelDef d;
  d.domain = domain;
  d.op_type = op;
  d.since_version = since;
  d.dtypes = std::move(dtypes);
  d.factory = std::move(f);
  r.add(std::move(d));
}

const KernelInput& required_input(const PrepareContext& ctx, size_t i, const char* name) {
  if (i >= ctx.inputs.size() || !ctx.inputs[i].present())
    ctx.fail("input " + std::to_string(i) + " (" + name + ") is required");
  return ctx.inputs[i];
}

bool has_input(const PrepareContext& ctx, size_t i) { return i < ctx.inputs.size() && ctx.inputs[i].present(); }

size_t elem_size(const PrepareContext& ctx, DType t) {
  const size_t s = dtype_size(t);
  if (s == 0) ctx.fail("tensors of type " + dtype_name(t) + " are not supported");
  return s;
}

void fail_dtype(const PrepareContext& ctx, size_t input) {
  ctx.fail("input " + std::to_string(input) + " has unsupported dtype " + dtype_name(ctx.inputs[input].dtype));
}

void set_output(PrepareContext& ctx, size_t i, DType t, std::vector<int64_t> shape) {
  ctx.outputs.at(i).dtype = t;
  ctx.outputs.at(i).shape = std::move(shape);
}

std::vector<int64_t> ints_of(const PrepareContext& ctx, const Tensor& t, const std::string& what) {
  std::vector<int64_t> v;
  if (t.dtype == DType::Int64) {
    auto s = t.span<int64_t>();
    v.assign(s.begin(), s.end());
  } else if (t.dtype == DType::Int32) {
    auto s = t.span<int32_t>();
    v.assign(s.begin(), s.end());
  } else {
    ctx.fail(what + " must be int64, got " + dtype_name(t.dtype));
  }
  return v;
}

int64_t normalize_axis(const PrepareContext& ctx, int64_t axis, int64_t rank, const std::string& what) {
  if (axis < -rank || axis >= rank)
    ctx.fail(what + " " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

void expect_grad_inputs(const PrepareContext& ctx) {
  if (ctx.inputs.size() != 2 || !ctx.inputs[0].present() || !ctx.inputs[1].present())
    ctx.fail("expected 2 inputs (dY, Y), got " + std::to_string(ctx.inputs.size()));
  if (ctx.outputs.size() != 1) ctx.fail("expected 1 output (dX), got " + std::to_string(ctx.outputs.size()));
  const KernelInput& dy = ctx.inputs[0];
  const KernelInput& y = ctx.inputs[1];
  if (dy.dtype != y.dtype)
    ctx.fail("dY and Y must have the same dtype, got " + dtype_name(dy.dtype) + " and " + dtype_name(y.dtype));
  if (dy.shape != y.shape)
    ctx.fail("dY and Y must have the same shape, got " + shape_string(dy.shape) + " and " + shape_string(y.shape));
}

}  // namespace onnxtrain::ops
