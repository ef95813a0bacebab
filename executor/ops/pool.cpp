// The plan-time part of the pooling ops with kernels on both backends (pool.h), shared by the CPU and CUDA kernels.
#include "executor/ops/pool.h"

#include <string>
#include <vector>

#include "executor/ops/kernel_util.h"
#include "graph/error.h"

namespace onnxtrain::ops {

MaxPoolAttrs prepare_max_pool(PrepareContext& ctx) {
  MaxPoolAttrs a;
  a.g = pool_geometry(ctx);
  const Geo& g = a.g;
  const DType t = ctx.inputs[0].dtype;
  a.indices = ctx.outputs.size() > 1 && !ctx.node.outputs[1].empty();
  const int64_t order = ctx.node.attr_int("storage_order", 0);
  if (order != 0 && order != 1) ctx.fail("storage_order must be 0 or 1");
  a.column_major = order == 1;
  set_output(ctx, 0, t, out_shape(g, g.C));
  if (ctx.outputs.size() > 1) set_output(ctx, 1, DType::Int64, out_shape(g, g.C));
  return a;
}

Geo prepare_max_pool_grad(PrepareContext& ctx) {
  const Geo g = pool_geometry(ctx, 1);
  const KernelInput& dy = required_input(ctx, 0, "dY");
  const DType t = ctx.inputs[1].dtype;
  if (dy.dtype != t || dy.shape != out_shape(g, g.C))
    ctx.fail("dY is " + dtype_name(dy.dtype) + shape_string(dy.shape) + ", expected MaxPool's output " +
             dtype_name(t) + shape_string(out_shape(g, g.C)));
  if (ctx.node.attr_int("storage_order", 0) != 0) ctx.fail("storage_order does not apply (no indices are output)");
  set_output(ctx, 0, t, ctx.inputs[1].shape);
  return g;
}

AvgPoolAttrs prepare_avg_pool(PrepareContext& ctx) {
  AvgPoolAttrs a;
  a.g = pool_geometry(ctx);
  a.include_pad = ctx.node.attr_int("count_include_pad", 0) != 0;
  set_output(ctx, 0, ctx.inputs[0].dtype, out_shape(a.g, a.g.C));
  return a;
}

AvgPoolAttrs prepare_avg_pool_grad(PrepareContext& ctx) {
  require_explicit(ctx, {"kernel_shape", "strides", "pads", "count_include_pad"});
  for (int64_t d : ctx.node.attr_ints("dilations", {}))
    if (d != 1) ctx.fail("dilations other than 1 are not supported (the function body has no dilated AveragePool)");
  AvgPoolAttrs a;
  a.g = pool_geometry(ctx, 1);
  const Geo& g = a.g;
  const KernelInput& dy = required_input(ctx, 0, "dY");
  const DType t = ctx.inputs[1].dtype;
  if (dy.dtype != t || dy.shape != out_shape(g, g.C))
    ctx.fail("dY is " + dtype_name(dy.dtype) + shape_string(dy.shape) + ", expected AveragePool's output " +
             dtype_name(t) + shape_string(out_shape(g, g.C)));
  a.include_pad = ctx.node.attr_int("count_include_pad", 0) != 0;
  set_output(ctx, 0, t, ctx.inputs[1].shape);
  return a;
}

GlobalPoolGeometry prepare_global_pool(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "X");
  if (x.shape.size() < 3) ctx.fail("X " + shape_string(x.shape) + " must have rank >= 3");
  std::vector<int64_t> out{x.shape[0], x.shape[1]};
  GlobalPoolGeometry g;
  for (size_t i = 2; i < x.shape.size(); ++i) {
    out.push_back(1);
    g.size *= x.shape[i];
  }
  if (g.size == 0) ctx.fail("X " + shape_string(x.shape) + " has an empty spatial plane");
  set_output(ctx, 0, x.dtype, out);
  g.planes = x.shape[0] * x.shape[1];
  return g;
}

}  // namespace onnxtrain::ops
