#pragma once
// Functions written once for host and device: ONNXTRAIN_HD is __host__ __device__ under nvcc and empty
// otherwise, so the CPU tests check the GPU's maths too. It lives in graph/ because the lowest layer needs it
// (graph/float16.h) and every layer above may include graph/. (A macro because CUDA's qualifiers are keywords.)
#if defined(__CUDACC__)
#define ONNXTRAIN_HD __host__ __device__
#else
#define ONNXTRAIN_HD
#endif
