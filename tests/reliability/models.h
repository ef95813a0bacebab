#pragma once
// Small models built in memory for the reliability tests, loaded through the real byte path (checker, our
// validation, shape inference) so they carry inferred types like a model from a file.
#include <cstdint>
#include <vector>

#include "executor/tensor.h"
#include "graph/ir.h"

namespace onnxtrain::test {

// y = Gemm(x [batch, in], fc.weight [out, in], fc.bias [out], transB=1), weights deterministic and small.
Model linear_model(int64_t in, int64_t out);
// y = x [batch, 2] * Sqrt(w [2]); w starts at {0, 1}, where the loss is finite but d(loss)/dw[0] is Inf.
Model sqrt_model();

Tensor filled(std::vector<int64_t> shape, float start, float step);
Tensor labels(const std::vector<int64_t>& v);

}  // namespace onnxtrain::test
