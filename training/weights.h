#pragma once
// Reading and writing the trainable weights held in a session's TensorStore; shared by TrainingSession and
// ForwardBackwardSession so both check names, dtypes and shapes the same way.
#include <map>
#include <string>
#include <vector>

#include "executor/executor.h"

namespace onnxtrain {

// Host copies (whatever device the store is on); set_trainable copies from any device. Errors name the weight when it is not one of `trainable`, or when the value's type differs.
Tensor get_trainable(const TensorStore& store, const std::vector<std::string>& trainable, const std::string& name);
std::map<std::string, Tensor> copy_trainable(const TensorStore& store, const std::vector<std::string>& trainable);
void set_trainable(TensorStore& store, const std::vector<std::string>& trainable, const std::string& name,
                   const Tensor& value);

}  // namespace onnxtrain
