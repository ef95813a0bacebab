#pragma once
// .npy files (numpy's array format): the simplest way to hand tensors to and from Python tools.
#include <filesystem>

#include "executor/tensor.h"

namespace onnxtrain {

// float32, float64, int64; throws Error naming the path on failure.
void write_npy(const std::filesystem::path& p, const Tensor& t);

}  // namespace onnxtrain
