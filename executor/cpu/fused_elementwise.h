#pragma once
// A chain of elementwise ops evaluated in one pass: the CPU's plan pass (executor/cpu/fusion_pass.cpp, plugged
// into the plan through executor/plan_pass.h) replaces runs of Add/Mul/Div/Sqrt/Erf/... steps over one shape by
// a single kernel that walks the output in L1-sized tiles and runs the whole straight-line program on each tile,
// so intermediates never go to memory. Every op computes exactly what its own kernel computes (same functor or
// Eigen expression, same element type, same order), so the fused plan's results match the unfused plan's.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "executor/kernel.h"

namespace onnxtrain {

enum class EwOp : uint8_t {
  // binary
  Add, Sub, Mul, Div, Max, Min, ReluGrad, SigmoidGrad, TanhGrad, GeluGrad, GeluTanhGrad,
  // unary
  Neg, Abs, Relu, Sqrt, Reciprocal, Exp, Log, Tanh, Sigmoid, Erf,
  // A copy of its operand, broadcast to the output: Expand, and the same-shape view steps the fusion pass adds
  // to a chain (executor/cpu/fusion_pass.cpp). Inside a chain only the broadcast read remains, so the copy is
  // never written unless something outside the chain reads it.
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
std::unique_ptr<Kernel> make_fused_elementwise(EwProgram p);

// "Mul(in0, Add(in1, in2))"-style text of a program, for errors and tests.
std::string ew_describe(const EwProgram& p);

// One compiled plan step as the elementwise fusion sees it: the op when the step is a fusable elementwise node
// (elementwise_op_of), and the values it reads and writes.
struct FusionStep {
  std::optional<EwOp> op;
  std::vector<const Tensor*> in;
  std::vector<const Tensor*> out;
};

// Steps that become one fused elementwise kernel, placed where the last of them was.
struct ElementwiseGroup {
  std::vector<size_t> steps;  // increasing
  EwProgram program;
  std::vector<const Tensor*> inputs;   // the kernel's inputs, in the program's order
  std::vector<const Tensor*> outputs;  // the kernel's outputs: results read outside the group (or `needed`)
};

// Groups elementwise steps of one shape and float type whose intermediates are read only inside the group, so
// that the group can run as one pass where its last step was. A step joins (and so merges) the groups whose
// results it reads when no other step reads those results in between; its other operands may be values of the
// group's shape, scalars, or blocks of its dims broadcast over the rest (a bias row, per-row statistics).
// `needed` are values the plan returns. Only groups of two or more steps are returned, each within the fused
// kernel's limits. (executor/cpu/fusion_pass.cpp)
std::vector<ElementwiseGroup> group_elementwise_steps(const std::vector<FusionStep>& steps,
                                                      const std::unordered_set<const Tensor*>& needed);

}  // namespace onnxtrain
