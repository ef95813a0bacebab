// Placeholder: filled in by the gradient-rules work; registers nothing yet.
#include "gradients/rule.h"

namespace onnxtrain {

void register_activation_rules(GradientRegistry& r) {}

}  // namespace onnxtrain
