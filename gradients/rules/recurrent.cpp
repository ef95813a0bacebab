// Gradients of the recurrent op family (see register_recurrent_rules in gradients/rule.h).
#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

void register_recurrent_rules(GradientRegistry& /*r*/) {}

}  // namespace onnxtrain
