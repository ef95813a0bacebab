// Placeholder: filled in by the op-coverage work; registers nothing yet.
#include "gradients/rule.h"

namespace onnxtrain {

void register_misc_rules(GradientRegistry& r) {}

}  // namespace onnxtrain
