#pragma once
// A chain of elementwise ops evaluated in one pass: the plan (executor/plan_fusion.h) replaces runs of
// Add/Mul/Div/Sqrt/Erf/... steps over one shape by a single kernel that walks the output in L1-sized tiles and
// runs the whole straight-line program on each tile, so intermediates never go to memory. Every op computes
// exactly what its own kernel computes (same functor or Eigen expression, same element type, same order), so
// the fused plan's results match the unfused plan's.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "executor/kernel.h"

namespace onnxtrain {

enum class EwOp : uint8_t {
  // binary
  Add, Sub, Mul, Div, Max, Min, ReluGrad, SigmoidGrad, TanhGrad, GeluGrad, GeluTanhGrad,
  // unary
  Neg, Abs, Relu, Sqrt, Reciprocal, Exp, Log, Tanh, Sigmoid, Erf,
  // A copy of its operand, broadcast to the output: Expand, and the same-shape view steps the plan adds to a
  // chain (executor/plan.cpp). Inside a chain only the broadcast read remains, so the copy is never written
  // unless something outside the chain reads it.
  Broadcast,
};

// The fusable op a node computes (ai.onnx elementwise ops, binary Sum/Max/Min, the onnxtrain activation
// gradients, Expand), or nullopt. Only ops with one output of their inputs' float type; attributes are never
// needed. Expand counts as unary: its second input (the shape) is not an operand of the fused program.
std::optional<EwOp> elementwise_op_of(const Node& n);
int ew_arity(EwOp op);
const char* ew_name(EwOp op);

// How an input of the fused kernel maps onto the iteration space of `numel` elements.
struct EwInput {
  enum class Kind : uint8_t { Full, Scalar, Broadcast };
  Kind kind = Kind::Full;
  // Broadcast: element i reads input[(i / inner) % period]. A bias over the trailing dims has inner 1; per-row
  // statistics ([N, 1] onto [N, C]) have inner C.
  int64_t period = 0;
  int64_t inner = 1;
};

// Value ids: [0, inputs.size()) are the kernel's inputs, then one per instruction in order.
struct EwInstr {
  EwOp op;
  int32_t a = -1, b = -1;
};

struct EwProgram {
  DType dtype = DType::Float32;  // Float32 or Float64, every value
  int64_t numel = 0;
  std::vector<EwInput> inputs;
  std::vector<EwInstr> code;
  std::vector<int32_t> outputs;  // value ids written to the kernel's outputs, in order (instruction results)
};

// Tile buffers a program needs (scalar and broadcast inputs plus the most temporaries alive at once); the plan keeps
// groups within kMaxEwSlots, which bounds the kernel's stack use.
inline constexpr size_t kMaxEwSlots = 40;
size_t ew_slots_needed(const EwProgram& p);

// Throws Error when the program is malformed (an operand defined later, a slot count over kMaxEwSlots, ...).
// An optimizer update it recognises runs as a hand-written loop (executor/cpu/fused_update.h) unless
// native_updates is false (tests compare the two).
std::unique_ptr<Kernel> make_fused_elementwise(EwProgram p, bool native_updates = true);

// "Mul(in0, Add(in1, in2))"-style text of a program, for errors and tests.
std::string ew_describe(const EwProgram& p);

}  // namespace onnxtrain
