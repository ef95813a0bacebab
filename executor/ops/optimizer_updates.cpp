// The plan-time part of the optimizer's update ops (optimizer_updates.h), shared by the CPU and CUDA kernels.
#include "executor/ops/optimizer_updates.h"

#include <string>

#include "executor/ops/kernel_util.h"
#include "executor/tensor.h"

namespace onnxtrain::ops {

void prepare_adam_update(PrepareContext& ctx, formulas::AdamDecay decay, bool amsgrad) {
  const size_t arrays = static_cast<size_t>(formulas::adam_array_inputs(amsgrad));
  const size_t scalars = static_cast<size_t>(formulas::adam_scalar_inputs(decay));
  if (ctx.inputs.size() != arrays + scalars)
    ctx.fail("expected " + std::to_string(arrays) + " tensors and " + std::to_string(scalars) + " scalars, got " +
             std::to_string(ctx.inputs.size()) + " inputs");
  if (ctx.outputs.size() != arrays - 1)
    ctx.fail("expected " + std::to_string(arrays - 1) + " outputs, got " + std::to_string(ctx.outputs.size()));
  const KernelInput& p = required_input(ctx, 0, "P");
  if (p.dtype != DType::Float32 && p.dtype != DType::Float64)
    ctx.fail("P must be float32 or float64, got " + dtype_name(p.dtype));
  for (size_t i = 0; i < arrays + scalars; ++i) {
    static const char* const kArrays[] = {"P", "G", "M", "V", "Vmax"};
    const char* name = i < arrays ? kArrays[i] : formulas::kAdamScalarNames[i - arrays];
    const KernelInput& in = required_input(ctx, i, name);
    if (in.dtype != p.dtype)
      ctx.fail(std::string(name) + " is " + dtype_name(in.dtype) + ", expected " + dtype_name(p.dtype) + " like P");
    if (i < arrays && in.shape != p.shape)
      ctx.fail(std::string(name) + " has shape " + shape_string(in.shape) + ", expected P's " + shape_string(p.shape));
    if (i >= arrays && numel_of(in.shape) != 1)
      ctx.fail(std::string(name) + " must have one element, got shape " + shape_string(in.shape));
  }
  for (size_t o = 0; o + 1 < arrays; ++o) set_output(ctx, o, p.dtype, p.shape);
}

}  // namespace onnxtrain::ops
