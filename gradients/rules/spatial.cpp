// Gradients of the spatial op family (see register_spatial_rules in gradients/rule.h).
#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

void register_spatial_rules(GradientRegistry& /*r*/) {}

}  // namespace onnxtrain
