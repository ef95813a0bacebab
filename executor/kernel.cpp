#include "executor/kernel.h"

#include <algorithm>

#include "executor/plan_pass.h"
#include "graph/error.h"

namespace onnxtrain {
void register_cpu_gather_grad(KernelRegistry& r);  // executor/cpu/gather_grad.cpp: GatherGrad, SumToShape
}

#ifdef ONNXTRAIN_WITH_CUDA
namespace onnxtrain {
void register_cuda_kernels(KernelRegistry& r);  // executor/cuda/registry.cpp
}
#endif

namespace onnxtrain {

void PrepareContext::fail(const std::string& what) const { onnxtrain::fail(node.describe(), what); }

const Tensor& PrepareContext::constant_input(size_t i) const {
  if (i >= inputs.size() || !inputs[i].present()) fail("input " + std::to_string(i) + " is required");
  if (!inputs[i].value)
    fail("input " + std::to_string(i) + " ('" + node.inputs[i] +
         "') must be known before the step runs (a constant, an initializer that is not trained, or computed "
         "from shapes); data-dependent shapes are not supported");
  return *inputs[i].value;
}

void KernelRegistry::add(KernelDef def) {
  if (extends_defaults_)
    for (const KernelDef& d : defs_)
      if (d.op_type == def.op_type && d.domain == def.domain && d.device == def.device) extends_defaults_ = false;
  defs_.push_back(std::move(def));
}

const KernelDef* KernelRegistry::find(const std::string& domain, const std::string& op, int64_t opset, Device device,
                                      DType dtype) const {
  const std::string& dom = domain == "ai.onnx" ? std::string() : domain;
  device = kernel_device(device);
  for (const KernelDef& d : defs_) {
    if (d.op_type != op || d.domain != dom || d.device != device) continue;
    if (opset < d.since_version || opset > d.end_version) continue;
    if (!d.dtypes.empty() && std::find(d.dtypes.begin(), d.dtypes.end(), dtype) == d.dtypes.end()) continue;
    return &d;
  }
  return nullptr;
}

void KernelRegistry::set_plan_passes(Device device, PlanPasses passes) {
  auto shared = std::make_shared<const PlanPasses>(std::move(passes));
  for (auto& [d, p] : passes_)
    if (d == device) {
      p = std::move(shared);
      return;
    }
  passes_.emplace_back(device, std::move(shared));
}

const PlanPasses* KernelRegistry::plan_passes(Device device) const {
  if (!extends_defaults_) return nullptr;
  for (const auto& [d, p] : passes_)
    if (d == device) return p.get();
  return nullptr;
}

std::vector<std::pair<std::string, std::string>> KernelRegistry::ops(Device device) const {
  std::vector<std::pair<std::string, std::string>> r;
  device = kernel_device(device);
  for (const KernelDef& d : defs_)
    if (d.device == device) r.emplace_back(d.domain, d.op_type);
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

const KernelRegistry& default_kernels() {
  static const KernelRegistry reg = [] {
    KernelRegistry r;
    register_cpu_elementwise(r);
    register_cpu_unary(r);
    register_cpu_reduce(r);
    register_cpu_shape(r);
    register_cpu_matmul(r);
    register_cpu_half_matmul(r);
    register_cpu_softmax(r);
    register_cpu_index(r);
    register_cpu_training_ops(r);
    register_cpu_activation(r);
    register_cpu_norm(r);
    register_cpu_conv(r);
    register_cpu_pool(r);
    register_cpu_dropout(r);
    register_cpu_einsum(r);
    register_cpu_loss(r);
    register_cpu_resize(r);
    register_cpu_recurrent(r);
    register_cpu_spatial(r);
    register_cpu_control_flow(r);
    register_cpu_linalg(r);
    register_cpu_gather_grad(r);
    register_cpu_plan_passes(r);
#ifdef ONNXTRAIN_WITH_CUDA
    register_cuda_kernels(r);  // after the CPU kernels: each CUDA def copies its CPU twin's key
#endif
    r.extends_defaults_ = true;
    return r;
  }();
  return reg;
}

}  // namespace onnxtrain
