#pragma once
// The plan-time part of the unary elementwise ops (the maths functions, Relu/Sigmoid/Tanh/LeakyRelu/Softplus/Elu,
// the trigonometric ops and Round, Not, Identity, Cast, CastLike, Clip) and of the fused (dY, Y) -> dX gradients,
// shared by the CPU kernels (executor/cpu/unary.cpp, cpu/activation.cpp) and their CUDA twins (executor/cuda/unary.cu,
// cuda/activation.cu, cuda/map_kernels.cuh): input checks, attributes, output 0's dtype and shape. The maths is
// executor/functors.h, built from the attributes by executor/functor_attrs.h; which element types run is each
// kernel's dispatch.
#include "executor/functor_attrs.h"
#include "executor/kernel.h"

namespace onnxtrain::ops {

// One input, one output of the input's dtype and shape.
void prepare_unary(PrepareContext& ctx);
// prepare_unary, then the op's functor: the default one, or the one its attributes build.
template <class Op> Op prepare_unary_op(PrepareContext& ctx) {
  prepare_unary(ctx);
  return Op{};
}
LeakyReluOp prepare_leaky_relu(PrepareContext& ctx);
EluOp prepare_elu(PrepareContext& ctx);

// Identity: any dtype with a fixed element size.
void prepare_identity(PrepareContext& ctx);

// Cast (attribute `to`) and CastLike (input 1's dtype, opset 15+): the pair is one both backends convert
// (float32, float64, int64, int32, bool, uint8, int8 among themselves; float16/bfloat16 to and from float32).
struct CastTypes {
  DType from = DType::Float32, to = DType::Float32;
};
CastTypes prepare_cast(PrepareContext& ctx);
CastTypes prepare_cast_like(PrepareContext& ctx);

// Clip: bounds from attributes (opset 6-10, float inputs only) or optional scalar inputs of the input's dtype
// (11+), read at run time.
struct ClipAttrs {
  bool from_inputs = false;
};
ClipAttrs prepare_clip(PrepareContext& ctx);

// The fused gradients (ReluGrad, SigmoidGrad, TanhGrad; GeluGrad, GeluTanhGrad): (dY, Y or X) -> dX of dY's
// dtype and shape.
void prepare_fused_grad(PrepareContext& ctx);

}  // namespace onnxtrain::ops
