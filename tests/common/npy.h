#pragma once
// Minimal .npy writer so C++ tests can hand tensors to an independent numpy check.
#include <filesystem>

#include "executor/tensor.h"

namespace onnxtrain::test {

void write_npy(const std::filesystem::path& p, const Tensor& t);  // float32, float64, int64

}  // namespace onnxtrain::test
