#pragma once
// Shared by the CUDA kernel files: twin registration.
//
// A CUDA kernel is registered as the twin of the CPU kernel defs of the same op: same domain, opset ranges,
// dtypes and shape_only flag, copied from the registry, so the two cannot drift. What both backends read of an op
// at plan time (checks, attributes, output dtypes and shapes) is a function of executor/ops/ that the CPU factory
// and the CUDA factory both call (executor/ops/README.md, "A CUDA factory never runs a CPU factory"): twin() takes
// only the key from the CPU defs, never their factory, so a CUDA factory cannot run CPU code by way of it. The
// factories' helpers (dispatch, inputs, axes) are executor/ops/kernel_util.h's.
#include <functional>
#include <memory>
#include <string>

#include "executor/cuda/runtime.h"
#include "executor/kernel.h"
#include "executor/ops/kernel_util.h"

namespace onnxtrain::cuda {

using ops::dispatch;
using ops::Tag;

// Adds a CUDA def with factory f for every CPU def of (domain, op) already in r; fails if there is none. f checks
// the node and sets its outputs through the op layer (executor/ops/<family>.h), as the CPU factory does.
void twin(KernelRegistry& r, const std::string& domain, const std::string& op, KernelFactory f);
inline void twin(KernelRegistry& r, const std::string& op, KernelFactory f) { twin(r, "", op, std::move(f)); }

// Output 0 is input 0's bytes (Reshape, Identity, a same-type Cast, ...): the plan usually makes it a view;
// otherwise one device copy.
class DeviceCopyKernel final : public Kernel {
 public:
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    if (out[0]->data != in[0]->data && out[0]->nbytes())
      check(cudaMemcpyAsync(out[0]->data, in[0]->data, out[0]->nbytes(), cudaMemcpyDeviceToDevice, stream()),
            "device copy");
  }
  bool output_is_view_of_input0() const override { return true; }
};

// Column-major C = op(B) op(A) (matmul.cu's argument order) for float16/bfloat16 data with float32 accumulation
// (half_matmul.cu); strides are in elements, batch 1 ignores them.
void gemm_half(DType t, cublasOperation_t opb, cublasOperation_t opa, int64_t n, int64_t m, int64_t k, float alpha,
               const void* b, int64_t ldb, int64_t sb, const void* a, int64_t lda, int64_t sa, float beta, void* c,
               int64_t ldc, int64_t sc, int64_t batch);

// Per-family registration (one per file in executor/cuda/, named by the family as in executor/cpu/ and
// gradients/rules/; docs/executor.md, "Families"), called from register_cuda_kernels().
void register_cuda_elementwise(KernelRegistry& r);
void register_cuda_unary(KernelRegistry& r);
void register_cuda_activation(KernelRegistry& r);
void register_cuda_training_ops(KernelRegistry& r);
void register_cuda_shape(KernelRegistry& r);
void register_cuda_matmul(KernelRegistry& r);
void register_cuda_softmax(KernelRegistry& r);
void register_cuda_norm(KernelRegistry& r);
void register_cuda_conv(KernelRegistry& r);
void register_cuda_pool(KernelRegistry& r);
void register_cuda_reduce(KernelRegistry& r);
void register_cuda_loss(KernelRegistry& r);
void register_cuda_index(KernelRegistry& r);
void register_cuda_resize(KernelRegistry& r);
void register_cuda_einsum(KernelRegistry& r);
void register_cuda_dropout(KernelRegistry& r);

}  // namespace onnxtrain::cuda

namespace onnxtrain {
// Every CUDA kernel, registered after the CPU ones (kernel.cpp); the twins copy their keys.
void register_cuda_kernels(KernelRegistry& r);
}  // namespace onnxtrain
