#pragma once
// The plan-time part of the binary, ternary and variadic elementwise ops (Add ... Xor, Pow, Mod, Where, Sum, Mean,
// Max, Min), shared by the CPU kernels (executor/cpu/elementwise.cpp) and their CUDA twins
// (executor/cuda/elementwise.cu): the arity and dtype checks and output 0, the ONNX multidirectional broadcast of
// the inputs. The maths is executor/functors.h (Mod's fmod: executor/functor_attrs.h); which element types run is
// each kernel's dispatch.
#include <cstdint>
#include <vector>

#include "executor/kernel.h"

namespace onnxtrain::ops {

// The input shapes, in input order, of an op whose output 0 is their multidirectional broadcast: what the kernels
// plan their broadcast walk (executor/broadcast.h) from.
using InputShapes = std::vector<std::vector<int64_t>>;

// Add, Sub, Mul, Div, Mod and the comparison and logical ops: two inputs of one dtype; output 0 has that dtype,
// or bool (`bool_out`, the comparisons and logical ops).
InputShapes prepare_binary(PrepareContext& ctx, bool bool_out);
// Pow: base and exponent may differ in dtype (each float32, float64, int64 or int32); output 0 has the base's.
InputShapes prepare_pow(PrepareContext& ctx);
// Where: a bool condition and two values of one dtype, which output 0 has.
InputShapes prepare_where(PrepareContext& ctx);
// Sum, Mean, Max, Min: one or more inputs of one dtype.
InputShapes prepare_variadic(PrepareContext& ctx);

}  // namespace onnxtrain::ops
