// The plan-time part of Conv, ConvTranspose and ConvGrad (conv.h), shared by the CPU and CUDA kernels.
#include "executor/ops/conv.h"

#include <string>
#include <vector>

#include "executor/ops/kernel_util.h"
#include "graph/error.h"

namespace onnxtrain::ops {

ConvAttrs prepare_conv(PrepareContext& ctx) {
  ConvAttrs a;
  a.g = conv_geometry(ctx, 0);
  const Geo& g = a.g;
  const DType t = ctx.inputs[0].dtype;
  a.has_bias = has_input(ctx, 2);
  if (a.has_bias) {
    const KernelInput& b = ctx.inputs[2];
    if (b.dtype != t || b.shape != std::vector<int64_t>{g.M})
      ctx.fail("B must be " + dtype_name(t) + "[" + std::to_string(g.M) + "], got " + dtype_name(b.dtype) +
               shape_string(b.shape));
  }
  set_output(ctx, 0, t, out_shape(g, g.M));
  return a;
}

ConvTransposeAttrs prepare_conv_transpose(PrepareContext& ctx) {
  ConvTransposeAttrs a;
  a.g = conv_transpose_geometry(ctx, a.right_pad);
  const Geo& g = a.g;
  const KernelInput& x = ctx.inputs[0];
  a.has_bias = has_input(ctx, 2);
  if (a.has_bias && (ctx.inputs[2].dtype != x.dtype || ctx.inputs[2].shape != std::vector<int64_t>{g.M}))
    ctx.fail("B must be " + dtype_name(x.dtype) + "[" + std::to_string(g.M) + "], got " +
             dtype_name(ctx.inputs[2].dtype) + shape_string(ctx.inputs[2].shape));
  set_output(ctx, 0, x.dtype, out_shape(g, g.M));
  return a;
}

ConvGradAttrs prepare_conv_grad(PrepareContext& ctx) {
  require_explicit(ctx, {"pads", "strides"});
  if (ctx.node.outputs.size() > 3) ctx.fail("has " + std::to_string(ctx.node.outputs.size()) + " outputs, expected up to 3 (dX, dW, dB)");
  ConvGradAttrs a;
  a.g = conv_geometry(ctx, 1);
  const Geo& g = a.g;
  const KernelInput& dy = required_input(ctx, 0, "dY");
  const DType t = ctx.inputs[1].dtype;
  if (dy.dtype != t || dy.shape != out_shape(g, g.M))
    ctx.fail("dY is " + dtype_name(dy.dtype) + shape_string(dy.shape) + ", expected Conv's output " + dtype_name(t) +
             shape_string(out_shape(g, g.M)));
  const std::vector<int64_t> shapes[3] = {ctx.inputs[1].shape, ctx.inputs[2].shape, {g.M}};
  for (size_t i = 0; i < ctx.outputs.size(); ++i) set_output(ctx, i, t, shapes[i]);
  a.want = wanted_outputs(ctx);
  return a;
}

}  // namespace onnxtrain::ops
