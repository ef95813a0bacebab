#pragma once
// Einsum's equation, parsed once for both the CPU kernel (executor/cpu/einsum.cpp) and the gradient rule
// (gradients/rules/einsum.cpp), so that the two agree on what an equation means.
#include <string>
#include <vector>

namespace onnxtrain {

struct EinsumEquation {
  std::string text;                // the equation with its spaces removed
  std::vector<std::string> terms;  // one per operand, "..." kept as written
  // The output term: as written after "->", else ONNX's implicit output ("..." when some operand has an
  // ellipsis, then the letters used exactly once, alphabetically).
  std::string output;
  bool explicit_output = false;
};

EinsumEquation parse_einsum_equation(const std::string& equation);

}  // namespace onnxtrain
