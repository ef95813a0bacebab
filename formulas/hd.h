#pragma once
// Formulas are evaluated on the host and on CUDA devices: ONNXTRAIN_FORMULA_HD is __host__ __device__ under nvcc and
// empty otherwise. formulas/ includes no project header (it is the bottom layer, below graph/), so it cannot use
// graph/hd.h's ONNXTRAIN_HD; a name of its own keeps the two from redefining each other. (A macro because CUDA's
// qualifiers are keywords.)
#if defined(__CUDACC__)
#define ONNXTRAIN_FORMULA_HD __host__ __device__
#else
#define ONNXTRAIN_FORMULA_HD
#endif
