#pragma once
// The per-op table the gradient checker (test_gradcheck.cpp) runs: each case is one forward node in
// float64 whose non-constant inputs are sampled and differentiated. Every op in default_rules() must have
// at least one case.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain::test {

struct RuleCase {
  std::string op;
  std::string domain;
  // One per node input. A constant input takes its shape from const_inputs; {-1} marks an omitted
  // optional input (its name is left empty).
  std::vector<std::vector<int64_t>> input_shapes;
  // Uniform sampling range per input (by input position); missing entries sample [-1, 1].
  std::vector<std::pair<double, double>> ranges;
  std::map<std::string, Attribute> attrs;
  // Empty, or one per input: a value (axes, shapes, indices, conditions) given as an initializer;
  // nullopt = a float64 input to differentiate.
  std::vector<std::optional<TensorData>> const_inputs;
  int64_t opset = 17;
  std::string label;
  // Kinks at zero (Abs, Relu): values with |x| < 0.1 are drawn again.
  bool avoid_zero = false;
  // Each sample's sign is flipped with probability 1/2 (ranges like [0.5, 2] then cover both signs).
  bool random_sign = false;
  int num_outputs = 1;
};

const std::vector<RuleCase>& rule_cases();

// Helpers the case files share (rule_cases.cpp).
using Shapes = std::vector<std::vector<int64_t>>;
using Ranges = std::vector<std::pair<double, double>>;
using Attrs = std::map<std::string, Attribute>;
RuleCase make(std::string label, std::string op, Shapes shapes, Attrs attrs = {}, Ranges ranges = {},
              int64_t opset = 17);
// A case whose input `i` is the constant `v` (the rest are float inputs).
RuleCase with_const(RuleCase c, size_t i, TensorData v);
RuleCase kinked(RuleCase c);   // avoid_zero
RuleCase signed_(RuleCase c);  // random_sign
TensorData ints(const std::vector<int64_t>& v);
TensorData bools(std::vector<int64_t> dims, const std::vector<bool>& v);

// Cases of op families kept beside their rules' own tests; rule_cases() appends them.
void add_recurrent_cases(std::vector<RuleCase>& v);      // rule_cases_recurrent.cpp
void add_spatial_cases(std::vector<RuleCase>& v);        // rule_cases_spatial.cpp
void add_normalization_cases(std::vector<RuleCase>& v);  // rule_cases_normalization.cpp

}  // namespace onnxtrain::test
