// The plan-time part of the optimizer's update ops (optimizer_updates.h), shared by the CPU and CUDA kernels.
#include "executor/ops/optimizer_updates.h"

#include <string>

#include "executor/ops/kernel_util.h"
#include "executor/tensor.h"

namespace onnxtrain::ops {

void prepare_update(PrepareContext& ctx, size_t arrays, bool flag, size_t scalars, size_t outputs) {
  const size_t inputs = arrays + (flag ? 1 : 0) + scalars;
  if (ctx.inputs.size() != inputs)
    ctx.fail("expected " + std::to_string(arrays) + " tensors, " + (flag ? "a bool flag, " : "") +
             std::to_string(scalars) + " scalars, got " + std::to_string(ctx.inputs.size()) + " inputs");
  if (ctx.outputs.size() != outputs)
    ctx.fail("expected " + std::to_string(outputs) + " outputs, got " + std::to_string(ctx.outputs.size()));
  const KernelInput& p = required_input(ctx, 0, "the weight");
  if (p.dtype != DType::Float32 && p.dtype != DType::Float64)
    ctx.fail("the weight (input 0) must be float32 or float64, got " + dtype_name(p.dtype));
  for (size_t i = 0; i < inputs; ++i) {
    const std::string name = "input " + std::to_string(i);
    const KernelInput& in = required_input(ctx, i, name.c_str());
    const bool is_flag = flag && i == arrays;
    const DType want = is_flag ? DType::Bool : p.dtype;
    if (in.dtype != want) ctx.fail(name + " is " + dtype_name(in.dtype) + ", expected " + dtype_name(want));
    if (i < arrays && in.shape != p.shape)
      ctx.fail(name + " has shape " + shape_string(in.shape) + ", expected the weight's " + shape_string(p.shape));
    if (i >= arrays && numel_of(in.shape) != 1)
      ctx.fail(name + " must have one element, got shape " + shape_string(in.shape));
  }
  for (size_t o = 0; o < outputs; ++o) set_output(ctx, o, p.dtype, p.shape);
}

}  // namespace onnxtrain::ops
