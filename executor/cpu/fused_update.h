#pragma once
// The optimizer updates that optimizers/ emits as standard ops, recognised in a fused elementwise program and
// run as one hand-written loop. The fused interpreter (fused_elementwise.cpp) writes every op's result to a
// tile buffer, so a 13-op Adam update is bound by those stores; the loop keeps each element in registers and
// reads 4 arrays and writes 3. It computes the same ops in the same order with no contraction into FMAs, so its
// results are bit-identical to the interpreter's (tests/executor/test_fused_update.cpp).
#include <memory>

#include "executor/cpu/fused_elementwise.h"

namespace onnxtrain {

// "adam", "adam+l2" or "adamw" when `p` is exactly one weight's update of that kind as optimizers/ emits it
// (no amsgrad, scalar hyper-parameters, outputs m, v and the weight); nullptr otherwise.
const char* ew_native_update(const EwProgram& p);

// The hand-written kernel for a program ew_native_update recognises; nullptr for any other program.
std::unique_ptr<Kernel> make_native_update(const EwProgram& p);

}  // namespace onnxtrain
