#pragma once
// Functors written once for host and device: ONNXTRAIN_HD is __host__ __device__ under nvcc and empty
// otherwise, so the CPU tests check the GPU's maths too. (A macro because CUDA's qualifiers are keywords.)
#if defined(__CUDACC__)
#define ONNXTRAIN_HD __host__ __device__
#else
#define ONNXTRAIN_HD
#endif
