#include "executor/cuda/common.h"
#include "graph/error.h"

namespace onnxtrain {
namespace cuda {

void register_cuda_gather_grad(KernelRegistry& r);  // gather_grad.cu: GatherGrad, SumToShape

void twin(KernelRegistry& r, const std::string& domain, const std::string& op, KernelFactory f) {
  std::vector<KernelDef> defs;
  for (const KernelDef& d : r.all())
    if (d.device == Device::CPU && d.domain == domain && d.op_type == op) defs.push_back(d);
  if (defs.empty()) throw Error("CUDA kernel for '" + op + "' registered without a CPU kernel to twin");
  for (KernelDef& d : defs) {
    d.device = Device::CUDA;
    d.factory = f;  // the CPU def's key, not its factory
    r.add(std::move(d));
  }
}

}  // namespace cuda

void register_cuda_kernels(KernelRegistry& r) {
  cuda::register_cuda_elementwise(r);
  cuda::register_cuda_unary(r);
  cuda::register_cuda_activation(r);
  cuda::register_cuda_training_ops(r);
  cuda::register_cuda_shape(r);
  cuda::register_cuda_matmul(r);
  cuda::register_cuda_softmax(r);
  cuda::register_cuda_norm(r);
  cuda::register_cuda_gather_grad(r);
  cuda::register_cuda_conv(r);
  cuda::register_cuda_pool(r);
  cuda::register_cuda_reduce(r);
  cuda::register_cuda_loss(r);
  cuda::register_cuda_index(r);
  cuda::register_cuda_resize(r);
  cuda::register_cuda_einsum(r);
  cuda::register_cuda_dropout(r);
}

}  // namespace onnxtrain
