#include "executor/kernel_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "graph/error.h"

namespace onnxtrain::test {

Node make_node(const std::string& op, size_t n_in, std::map<std::string, Attribute> attrs, const std::string& domain,
               size_t n_out) {
  Node n;
  n.name = "n_" + op;
  n.op_type = op;
  n.domain = domain;
  // append, not "x" + std::to_string(i): GCC 12 reports a false -Wrestrict on the latter.
  for (size_t i = 0; i < n_in; ++i) n.inputs.push_back(std::string(1, 'x').append(std::to_string(i)));
  for (size_t i = 0; i < n_out; ++i) n.outputs.push_back(std::string(1, 'y').append(std::to_string(i)));
  n.attributes = std::move(attrs);
  return n;
}

std::vector<Tensor> run_kernel(const Node& node, int64_t opset, std::vector<const Tensor*> ins,
                               const std::vector<size_t>& known, Tensor* out_alias) {
  DType first = DType::Undefined;
  for (const Tensor* t : ins)
    if (t) {
      first = t->dtype;
      break;
    }
  const KernelDef* def = default_kernels().find(node.domain, node.op_type, opset, Device::CPU, first);
  if (!def)
    throw Error("no kernel for " + node.op_type + " " + dtype_name(first) + " at opset " + std::to_string(opset));
  PrepareContext ctx{node, opset, Device::CPU, {}, std::vector<KernelOutput>(node.outputs.size())};
  for (size_t i = 0; i < ins.size(); ++i) {
    KernelInput ki;
    if (ins[i]) {
      ki.dtype = ins[i]->dtype;
      ki.shape = ins[i]->shape;
      if (std::find(known.begin(), known.end(), i) != known.end()) ki.value = ins[i];
    }
    ctx.inputs.push_back(ki);
  }
  std::unique_ptr<Kernel> k = def->factory(ctx);
  std::vector<Tensor> outs;
  for (const KernelOutput& o : ctx.outputs) outs.push_back(Tensor::empty(o.dtype, o.shape));
  for (Tensor& t : outs) {
    if (t.dtype == DType::Float32) std::ranges::fill(t.span<float>(), std::numeric_limits<float>::quiet_NaN());
    if (t.dtype == DType::Float64) std::ranges::fill(t.span<double>(), std::numeric_limits<double>::quiet_NaN());
  }
  if (out_alias) {
    EXPECT_EQ(out_alias->shape, ctx.outputs[0].shape);
    outs[0] = Tensor::view(out_alias->dtype, out_alias->shape, out_alias->data);
  }
  std::vector<Tensor*> out_ptrs;
  for (Tensor& t : outs) out_ptrs.push_back(&t);
  k->run(ins, out_ptrs);
  return outs;
}

std::vector<Tensor> run_node(const Node& node, int64_t opset, const std::vector<Tensor>& inputs,
                             const std::vector<size_t>& known) {
  std::vector<const Tensor*> ins;
  for (const Tensor& t : inputs) ins.push_back(t.defined() ? &t : nullptr);
  return run_kernel(node, opset, std::move(ins), known);
}

Tensor run1(const Node& node, int64_t opset, std::vector<const Tensor*> ins) {
  return std::move(run_kernel(node, opset, std::move(ins))[0]);
}

Tensor run_single(const Node& node, int64_t opset, const std::vector<Tensor>& inputs,
                  const std::vector<size_t>& known) {
  return std::move(run_node(node, opset, inputs, known)[0]);
}

std::vector<int64_t> unravel(int64_t i, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    idx[k] = i % shape[k];
    i /= shape[k];
  }
  return idx;
}

int64_t ravel(const std::vector<int64_t>& idx, const std::vector<int64_t>& shape) {
  int64_t r = 0;
  for (size_t k = 0; k < shape.size(); ++k) r = r * shape[k] + idx[k];
  return r;
}

}  // namespace onnxtrain::test
