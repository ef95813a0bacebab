#pragma once
// Kernels and their registry. A KernelDef is keyed by (domain, op, opset range, device, dtype). At plan time
// its factory sees the node, the input dtypes and concrete shapes (and values of inputs known at plan time),
// fills in the output dtypes and shapes, and returns a Kernel bound to them. run() then only computes.
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "executor/tensor.h"
#include "graph/ir.h"

namespace onnxtrain {

struct PlanPasses;  // executor/plan_pass.h

struct KernelInput {
  DType dtype = DType::Undefined;  // Undefined: optional input not given
  std::vector<int64_t> shape;
  const Tensor* value = nullptr;  // set when the value is known at plan time (constants, shapes)
  bool present() const { return dtype != DType::Undefined; }
};

struct KernelOutput {
  DType dtype = DType::Undefined;
  std::vector<int64_t> shape;
};

struct PrepareContext {
  const Node& node;
  int64_t opset;  // the model's opset for the node's domain
  Device device;
  std::vector<KernelInput> inputs;   // one per node input
  std::vector<KernelOutput> outputs;  // one per node output; the factory fills them

  // Throws Error "node 'n' (Op): what".
  [[noreturn]] void fail(const std::string& what) const;
  // The constant value of input i; fails naming the input when it is not known at plan time.
  const Tensor& constant_input(size_t i) const;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  // Inputs and outputs have the dtypes and shapes seen by the factory; an absent optional input is nullptr.
  virtual void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) = 0;
  // True when output 0 is input 0's bytes unchanged (Reshape, Flatten, Squeeze, Identity, a same-type Cast):
  // the plan may then make the output a view of the input, and run() must do nothing when they coincide.
  virtual bool output_is_view_of_input0() const { return false; }
};

using KernelFactory = std::function<std::unique_ptr<Kernel>(PrepareContext&)>;

struct KernelDef {
  std::string domain;  // "" for ai.onnx
  std::string op_type;
  int64_t since_version = 1;
  int64_t end_version = 1 << 30;  // inclusive
  Device device = Device::CPU;
  std::vector<DType> dtypes;  // dtypes of the first input accepted; empty = any
  KernelFactory factory;
  // The kernel reads only the shapes of its inputs (Shape, Size): the plan may run it at compile time.
  bool shape_only = false;
};

// The device whose kernels run a plan for d: the guarded test device runs the CPU kernels (on its own memory,
// opened by KernelScope), every other device its own.
inline Device kernel_device(Device d) { return d == Device::Guarded ? Device::CPU : d; }

class KernelRegistry {
 public:
  void add(KernelDef def);
  // The kernel for a node at the model's opset on a device (kernel_device(device)'s); nullptr if none. dtype is
  // the first present input's dtype (Undefined when the node has none).
  const KernelDef* find(const std::string& domain, const std::string& op, int64_t opset, Device device,
                        DType dtype) const;
  const std::vector<KernelDef>& all() const { return defs_; }
  // Every registered (domain, op) once, sorted, for tests and docs.
  std::vector<std::pair<std::string, std::string>> ops(Device device) const;
  // True for default_kernels() and its copies to which only new ops were added (a data-parallel session's
  // AllReduce): plans may then replace built-in steps by their fused kernels, which implement the built-in
  // semantics. A registry that adds a kernel for an op it already has loses it.
  bool extends_defaults() const { return extends_defaults_; }
  // A backend's plan passes for its device (executor/plan_pass.h), at most one set per device; a second call
  // replaces the first.
  void set_plan_passes(Device device, PlanPasses passes);
  // The passes plans for `device` run: nullptr when none were set for that device exactly (the guarded test
  // device, which runs the CPU kernels, keeps every node as written) or when the registry no longer
  // extends_defaults(), since the passes replace built-in steps by kernels with the built-in semantics.
  const PlanPasses* plan_passes(Device device) const;

 private:
  friend const KernelRegistry& default_kernels();
  std::vector<KernelDef> defs_;
  bool extends_defaults_ = false;
  std::vector<std::pair<Device, std::shared_ptr<const PlanPasses>>> passes_;  // shared by the registry's copies
};

// The registry with every built-in kernel (CPU, and CUDA when built with it).
const KernelRegistry& default_kernels();

// Per-family registration, called once from default_kernels(); one per file in executor/cpu/, named by the family
// as in gradients/rules/ and executor/cuda/ (docs/executor.md, "Families").
void register_cpu_elementwise(KernelRegistry& r);
void register_cpu_unary(KernelRegistry& r);
void register_cpu_reduce(KernelRegistry& r);          // Reduce*, ArgMax/ArgMin, CumSum, TopK
void register_cpu_shape(KernelRegistry& r);
void register_cpu_matmul(KernelRegistry& r);
void register_cpu_half_matmul(KernelRegistry& r);  // float16/bfloat16 MatMul, Gemm; after register_cpu_matmul
void register_cpu_softmax(KernelRegistry& r);
void register_cpu_index(KernelRegistry& r);           // Gather/ScatterElements, Gather/ScatterND
void register_cpu_training_ops(KernelRegistry& r);  // ai.onnx.preview.training
void register_cpu_activation(KernelRegistry& r);     // activation functions, Hardmax, GeluGrad/GeluTanhGrad
void register_cpu_norm(KernelRegistry& r);           // Batch/Instance/Layer/Group normalization
void register_cpu_conv(KernelRegistry& r);           // Conv, ConvTranspose, ConvGrad (oneDNN, own AVX-512)
void register_cpu_pool(KernelRegistry& r);           // MaxPool, AveragePool, LpPool, global pools, their grads
void register_cpu_dropout(KernelRegistry& r);        // Dropout, onnxtrain.DropoutMask
void register_cpu_einsum(KernelRegistry& r);         // Einsum
void register_cpu_loss(KernelRegistry& r);           // NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss
void register_cpu_resize(KernelRegistry& r);         // Resize (nearest, linear, cubic)
void register_cpu_recurrent(KernelRegistry& r);      // LSTM, GRU, RNN
void register_cpu_spatial(KernelRegistry& r);        // GridSample, Col2Im, MaxRoiPool, MaxUnpool
void register_cpu_control_flow(KernelRegistry& r);  // If, Loop, Scan (subgraphs run by nested executors)
void register_cpu_linalg(KernelRegistry& r);         // Det
void register_cpu_plan_passes(KernelRegistry& r);    // Transpose folding, elementwise and update fusion

}  // namespace onnxtrain
