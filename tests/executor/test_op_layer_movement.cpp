// Issue 27's op layer for the data-movement ops (Transpose, Slice, Expand, Tile, Concat, Split, Pad, DepthToSpace,
// SpaceToDepth, Trilu). Their CUDA kernel gathers each output element from the element its map names (or the fill
// value); the maps used to come from running the CPU kernel on index tensors at plan time, and are now built by the
// op layer from the geometry the CPU kernels copy by (executor/ops/shape.h, *_gather_maps). This runs, for many
// nodes, the CPU factory and kernel on int64 index tensors exactly as that tracer did, and expects the op layer's
// maps to be the traced ones; and expects the CPU factory, the op layer and the CUDA factory to refuse a bad node
// with the same message. No GPU is needed: the CUDA factory is only called on nodes it refuses before uploading.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "executor/device.h"
#include "executor/kernel.h"
#include "executor/ops/shape.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

// One node input: data (no value), a plan-time constant (value), or absent (dtype Undefined).
struct Arg {
  DType dtype = DType::Undefined;
  std::vector<int64_t> shape;
  std::optional<Tensor> value;
};

Arg x(std::vector<int64_t> shape, DType t = DType::Int64) { return {t, std::move(shape), std::nullopt}; }
Arg ints(std::vector<int64_t> v) {
  const std::vector<int64_t> shape{static_cast<int64_t>(v.size())};
  return {DType::Int64, shape, Tensor::from_vector<int64_t>(shape, v)};
}
Arg ints32(const std::vector<int64_t>& v) {
  const std::vector<int64_t> shape{static_cast<int64_t>(v.size())};
  return {DType::Int32, shape, Tensor::from_vector<int32_t>(shape, std::vector<int32_t>(v.begin(), v.end()))};
}
Arg scalar(int64_t v) { return {DType::Int64, {}, Tensor::from_vector<int64_t>({}, {v})}; }
Arg none() { return {}; }

using Attrs = std::map<std::string, Attribute>;

struct Case {
  std::string op;
  int64_t opset;
  std::vector<Arg> args;
  Attrs attrs = {};
  size_t outputs = 1;
  // A substring of the error the CPU factory and the op layer must both raise (word for word the same); empty
  // when both plan.
  std::string error = {};
  // A substring of an error only the CUDA factory raises (its own limits); empty when it plans as the CPU one.
  std::string cuda_error = {};
};

std::string label(const Case& c) {
  // Appended piece by piece (GCC 12 warns falsely on "..." + std::string temporaries, -Wrestrict).
  std::string s = c.op;
  s.append(" opset ").append(std::to_string(c.opset));
  for (const Arg& a : c.args) s.append(" ").append(a.dtype == DType::Undefined ? std::string("-") : shape_string(a.shape));
  for (const auto& [k, v] : c.attrs) s.append(" ").append(k);
  return s;
}

Node node_of(const Case& c) {
  Node n;
  n.name = "n";
  n.op_type = c.op;
  for (size_t i = 0; i < c.args.size(); ++i)
    n.inputs.push_back(c.args[i].dtype == DType::Undefined ? std::string() : std::string("x").append(std::to_string(i)));
  for (size_t i = 0; i < c.outputs; ++i) n.outputs.push_back(std::string("y").append(std::to_string(i)));
  n.attributes = c.attrs;
  return n;
}

std::vector<KernelInput> inputs_of(const Case& c) {
  std::vector<KernelInput> in;
  for (const Arg& a : c.args) in.push_back({a.dtype, a.shape, a.value ? &*a.value : nullptr});
  return in;
}

using MapsFn = ops::GatherMaps (*)(PrepareContext&);
MapsFn maps_of(const std::string& op) {
  static const std::map<std::string, MapsFn> fns = {
      {"Transpose", ops::transpose_gather_maps},
      {"Slice", ops::slice_gather_maps},
      {"Expand", ops::expand_gather_maps},
      {"Tile", ops::tile_gather_maps},
      {"Concat", ops::concat_gather_maps},
      {"Split", ops::split_gather_maps},
      {"Pad", ops::pad_gather_maps},
      {"DepthToSpace", ops::depth_to_space_gather_maps},
      {"SpaceToDepth", ops::space_to_depth_gather_maps},
      {"Trilu", ops::trilu_gather_maps},
  };
  return fns.at(op);
}

struct Planned {
  std::vector<KernelOutput> outputs;
  std::optional<std::string> error;
  std::unique_ptr<Kernel> kernel;
  ops::GatherMaps maps;
};

Planned plan_factory(const Node& node, int64_t opset, Device device, const std::vector<KernelInput>& in, size_t nout) {
  Planned p;
  const KernelDef* def = default_kernels().find("", node.op_type, opset, device, in.empty() ? DType::Undefined : in[0].dtype);
  EXPECT_NE(def, nullptr) << node.op_type << " has no kernel on " << (device == Device::CUDA ? "cuda" : "cpu");
  if (!def) return p;
  PrepareContext ctx{node, opset, device, in, std::vector<KernelOutput>(nout)};
  try {
    p.kernel = def->factory(ctx);
  } catch (const Error& e) {
    p.error = e.what();
  }
  p.outputs = ctx.outputs;
  return p;
}

Planned plan_op_layer(const Node& node, int64_t opset, const std::vector<KernelInput>& in, size_t nout) {
  Planned p;
  PrepareContext ctx{node, opset, Device::CUDA, in, std::vector<KernelOutput>(nout)};
  try {
    p.maps = maps_of(node.op_type)(ctx);
  } catch (const Error& e) {
    p.error = e.what();
  }
  p.outputs = ctx.outputs;
  return p;
}

// What cuda/shape.cu's tracer did before issue 27 (make_traced): the CPU factory and kernel run with int64 index
// tensors as the data (element j of data input k holds base_k + j + 1) and a zero fill, so each output element
// holds 1 + the index it read, or 0 for the fill.
std::vector<std::vector<int64_t>> trace_cpu(const Case& c, const Node& node, std::vector<KernelInput> in) {
  const bool all_data = c.op == "Concat";
  const int fill_input = c.op == "Pad" && c.opset >= 11 ? 2 : -1;
  std::vector<size_t> data;
  for (size_t i = 0; i < in.size(); ++i)
    if ((i == 0 || all_data) && in[i].present()) data.push_back(i);
  std::vector<Tensor> iotas;
  int64_t total = 0;
  for (size_t i : data) {
    Tensor idx = Tensor::empty(DType::Int64, in[i].shape);
    for (int64_t j = 0; j < idx.numel(); ++j) idx.ptr<int64_t>()[j] = total + j + 1;
    total += idx.numel();
    in[i] = {DType::Int64, in[i].shape, nullptr};
    iotas.push_back(std::move(idx));
  }
  const Tensor zero = Tensor::from_vector<int64_t>({}, {0});
  if (fill_input >= 0 && static_cast<size_t>(fill_input) < in.size() && in[fill_input].present())
    in[fill_input] = {DType::Int64, in[fill_input].shape, &zero};
  Planned p = plan_factory(node, c.opset, Device::CPU, in, c.outputs);
  if (p.error || !p.kernel) {
    ADD_FAILURE() << "the CPU factory refuses the traced node: " << p.error.value_or("no kernel");
    return {};
  }
  std::vector<const Tensor*> ins(in.size(), nullptr);
  for (size_t k = 0; k < data.size(); ++k) ins[data[k]] = &iotas[k];
  for (size_t i = 0; i < in.size(); ++i)
    if (!ins[i] && in[i].present()) ins[i] = in[i].value;
  std::vector<Tensor> outs;
  for (const KernelOutput& o : p.outputs) {
    Tensor t = Tensor::empty(DType::Int64, o.shape);
    for (int64_t j = 0; j < t.numel(); ++j) t.ptr<int64_t>()[j] = -12345;  // unwritten elements show
    outs.push_back(std::move(t));
  }
  std::vector<Tensor*> out_ptrs;
  for (Tensor& t : outs) out_ptrs.push_back(&t);
  p.kernel->run(ins, out_ptrs);
  std::vector<std::vector<int64_t>> maps;
  for (const Tensor& t : outs) {
    std::vector<int64_t> m;
    for (int64_t j = 0; j < t.numel(); ++j) m.push_back(t.ptr<int64_t>()[j] - 1);
    maps.push_back(std::move(m));
  }
  return maps;
}

std::vector<Case> cases() {
  const DType f = DType::Float32, d = DType::Float64, i32 = DType::Int32, h = DType::Float16, b = DType::Bool;
  using I = std::vector<int64_t>;
  const auto s = [](const char* v) { return Attribute{std::string(v)}; };
  std::vector<Case> v = {
      // Transpose: default and explicit perms, ranks 0 to 5, empty tensors, bad perms.
      {"Transpose", 13, {x({2, 3})}},
      {"Transpose", 13, {x({2, 3, 4})}, {{"perm", I{1, 0, 2}}}},
      {"Transpose", 13, {x({2, 3, 4})}, {{"perm", I{2, 0, 1}}}},
      {"Transpose", 13, {x({2, 1, 3, 4, 2})}, {{"perm", I{4, 2, 0, 3, 1}}}},
      {"Transpose", 13, {x({})}},
      {"Transpose", 13, {x({5})}},
      {"Transpose", 13, {x({0, 3})}, {{"perm", I{1, 0}}}},
      {"Transpose", 1, {x({17, 9}, f)}},
      {"Transpose", 13, {x({2, 3, 4})}, {{"perm", I{1, 0}}}, 1, "perm has 2 entries but the input has rank 3"},
      {"Transpose", 13, {x({2, 3})}, {{"perm", I{0, 0}}}, 1, "perm [0,0] is not a permutation of 0..1"},
      {"Transpose", 13, {x({2, 3})}, {{"perm", I{0, -1}}}, 1, "is not a permutation of 0..1"},
      {"Transpose", 13, {x(I(17, 1))}, {}, 1, "tensors of rank above 16 are not supported"},
      {"Transpose", 13, {x({2}, DType::String)}, {}, 1, "tensors of type string are not supported"},
      {"Transpose", 13, {}, {}, 1, "input 0 (data) is required"},
      // Slice, opset 10+: inputs, negative starts/ends/axes/steps, clamping, int32 parameters, empty results.
      {"Slice", 13, {x({5, 6}), ints({1, 2}), ints({4, 5})}},
      {"Slice", 13, {x({5, 6}), ints({-2}), ints({100}), ints({-1})}},
      {"Slice", 13, {x({5, 6}), ints({4, 5}), ints({0, -100}), ints({0, 1}), ints({-1, -2})}},
      {"Slice", 13, {x({7}), ints({-1}), ints({-8}), none(), ints({-3})}},
      {"Slice", 13, {x({4, 5, 6}), ints({0, 1}), ints({4, 6}), ints({2, -2}), ints({2, 3})}},
      {"Slice", 13, {x({4, 5}), ints32({1}), ints32({3}), ints32({1}), ints32({1})}},
      {"Slice", 13, {x({4, 5}), ints({3}), ints({1}), ints({0})}},  // empty: start past end
      {"Slice", 13, {x({4, 5}), ints({1}), ints({3}), ints({0}), ints({-1})}},  // empty: negative step forward
      {"Slice", 13, {x({0, 5}), ints({0}), ints({2}), ints({1})}},
      {"Slice", 10, {x({6, 2}, f), ints({1}), ints({5}), ints({0}), ints({2})}},
      {"Slice", 13, {x({5}), ints({1}), ints({2}), ints({0}), ints({0})}, {}, 1, "steps must not be 0"},
      {"Slice", 13, {x({5}), ints({1, 1}), ints({2})}, {}, 1, "starts and ends must have the same length"},
      {"Slice", 13, {x({5, 5}), ints({1, 1}), ints({2, 2}), ints({0, -2})}, {}, 1, "axis -2 is repeated in axes"},
      {"Slice", 13, {x({5, 5}), ints({1}), ints({2}), ints({2})}, {}, 1, "out of range"},
      {"Slice", 13, {x({5, 5}), ints({1}), ints({2}), ints({0, 1})}, {}, 1,
       "starts, ends, axes and steps must have the same length"},
      {"Slice", 13, {x({5}), x({1}), ints({2})}, {}, 1, "must be known before the step runs"},
      {"Slice", 13, {x({5}), ints({1})}, {}, 1, "input 2 (ends) is required"},
      // Slice before opset 10: attributes.
      {"Slice", 9, {x({5, 6})}, {{"starts", I{1, -3}}, {"ends", I{4, 1000}}}},
      {"Slice", 1, {x({5, 6, 2})}, {{"starts", I{1}}, {"ends", I{-1}}, {"axes", I{-2}}}},
      {"Slice", 9, {x({5, 6})}, {{"starts", I{1}}, {"ends", I{4, 5}}}, 1, "starts and ends must have the same length"},
      // Expand: broadcasting from the back, rank growth, 1 -> n and n -> 1 targets, empty targets.
      {"Expand", 13, {x({3, 1}), ints({2, 3, 4})}},
      {"Expand", 13, {x({1}), ints({4})}},
      {"Expand", 13, {x({2, 3}), ints({1, 1})}},
      {"Expand", 13, {x({}), ints({2, 2})}},
      {"Expand", 13, {x({1, 3, 1}), ints({2, 1, 1, 5})}},
      {"Expand", 13, {x({3, 1}), ints({0, 1})}, {}, 1, "cannot broadcast input [3,1] to shape [0,1]"},
      {"Expand", 8, {x({2, 1}, d), ints({2, 2})}},
      {"Expand", 13, {x({2, 3}), ints({4})}, {}, 1, "cannot broadcast input [2,3] to shape [4]"},
      {"Expand", 13, {x({2, 3})}, {}, 1, "input 1 (shape) is required"},
      // Tile: repeats of 0, 1 and more per axis.
      {"Tile", 13, {x({2, 3}), ints({2, 3})}},
      {"Tile", 13, {x({2, 3}), ints({1, 1})}},
      {"Tile", 13, {x({4}), ints({0})}},
      {"Tile", 13, {x({2, 1, 3}), ints({1, 4, 2})}},
      {"Tile", 6, {x({2, 2}, i32), ints32({3, 1})}},
      {"Tile", 13, {x({2, 3}), ints({2})}, {}, 1, "repeats has 1 entries but the input has rank 2"},
      {"Tile", 13, {x({2, 3}), ints({2, -1})}, {}, 1, "repeats must not be negative"},
      {"Tile", 13, {x(I(9, 1)), ints(I(9, 1))}, {}, 1, "tensors of rank above 16 are not supported"},
      // Concat: several inputs, any axis (negative too), empty inputs, mismatches.
      {"Concat", 13, {x({2, 3}), x({2, 1}), x({2, 4})}, {{"axis", int64_t{1}}}},
      {"Concat", 13, {x({2, 3}), x({1, 3}), x({0, 3}), x({3, 3})}, {{"axis", int64_t{0}}}},
      {"Concat", 13, {x({2, 3, 2}), x({2, 3, 5})}, {{"axis", int64_t{-1}}}},
      {"Concat", 13, {x({2, 2, 3}), x({2, 4, 3})}, {{"axis", int64_t{-2}}}},
      {"Concat", 13, {x({4})}, {{"axis", int64_t{0}}}},
      {"Concat", 1, {x({2, 3}, f), x({2, 2}, f)}},  // opset 1: axis defaults to 1
      {"Concat", 13, {x({2, 3}), x({2, 3})}, {}, 1, "attribute 'axis' is required"},
      {"Concat", 13, {x({2, 3}), x({3, 3})}, {{"axis", int64_t{1}}}, 1,
       "input 1 has shape [3,3], which does not match [2,3] outside axis 1"},
      {"Concat", 13, {x({2, 3}), x({2, 3}, f)}, {{"axis", int64_t{0}}}, 1, "input 1 has type float32 but input 0 has int64"},
      {"Concat", 13, {x({})}, {{"axis", int64_t{0}}}, 1, "inputs must have rank >= 1"},
      {"Concat", 13, {x({2}), none()}, {{"axis", int64_t{0}}}, 1, "input 1 (inputs) is required"},
      {"Concat", 13, {}, {{"axis", int64_t{0}}}, 1, "needs at least one input"},
      // Split: even, sizes as input (13+) or attribute (before), num_outputs (18), zero-size parts.
      {"Split", 13, {x({6, 2})}, {}, 3},
      {"Split", 13, {x({2, 6})}, {{"axis", int64_t{-1}}}, 2},
      {"Split", 13, {x({2, 7, 3}), ints({2, 0, 5})}, {{"axis", int64_t{1}}}, 3},
      {"Split", 11, {x({7, 2})}, {{"split", I{3, 4}}}, 2},
      {"Split", 2, {x({3, 5})}, {{"axis", int64_t{1}}, {"split", I{1, 1, 3}}}, 3},
      {"Split", 18, {x({7, 3})}, {{"num_outputs", int64_t{3}}}, 3},
      {"Split", 18, {x({4})}, {{"num_outputs", int64_t{3}}}, 3},
      {"Split", 13, {x({5})}, {}, 1},
      {"Split", 13, {x({5, 2})}, {}, 2, "axis 0 of size 5 does not split evenly into 2 outputs"},
      {"Split", 13, {x({5, 2}), ints({2, 2})}, {}, 2, "split sizes add up to 4 but axis 0 has size 5"},
      {"Split", 13, {x({5, 2}), ints({6, -1})}, {}, 2, "split sizes must not be negative"},
      {"Split", 13, {x({5, 2}), ints({5})}, {}, 2, "split has 1 entries but the node has 2 outputs"},
      {"Split", 18, {x({7})}, {{"num_outputs", int64_t{2}}}, 3, "num_outputs is 2 but the node has 3 outputs"},
      {"Split", 13, {x({5, 2})}, {{"axis", int64_t{2}}}, 1, "out of range"},
      // Pad from opset 11: pads (and axes, 18+) as inputs, the constant as input 2; negative pads crop.
      {"Pad", 13, {x({2, 3}), ints({1, 0, 0, 2})}},
      {"Pad", 13, {x({2, 3}), ints({1, 2, 3, 1}), x({})}},
      {"Pad", 13, {x({3, 4}), ints({-1, 1, 0, -2}), scalar(7)}},
      {"Pad", 13, {x({3, 4}), ints({-3, 0, 0, 0})}},  // everything cropped on one axis: all fill
      {"Pad", 13, {x({2, 3, 4}), ints({0, -1, 2, 1, 0, -3})}},
      {"Pad", 13, {x({}), ints({})}},
      {"Pad", 13, {x({0, 2}), ints({1, 1, 1, 1})}},
      {"Pad", 18, {x({2, 3, 4}), ints({1, 2}), none(), ints({-1})}},
      {"Pad", 18, {x({2, 3, 4}), ints({1, 0, -1, 2}), x({}), ints32({0, 2})}},
      {"Pad", 11, {x({2, 3}, f), ints({0, 1, 1, 0}), x({}, f)}},
      {"Pad", 13, {x({2, 3}), ints({-3, 0, 0, 0})}, {}, 1, "crop more than the 2 elements of axis 0"},
      {"Pad", 13, {x({2, 3}), ints({1, 0, 0})}, {}, 1,
       "pads has 3 values, expected 4 (begin and end for each of 2 axes)"},
      {"Pad", 13, {x({2, 3}), ints32({1, 0, 0, 1})}, {}, 1, "pads must be int64, got int32"},
      {"Pad", 13, {x({2, 3}), ints({1, 0, 0, 1}), x({}, f)}, {}, 1, "constant_value must have data's dtype int64, got float32"},
      {"Pad", 13, {x({2, 3}), ints({1, 0, 0, 1}), x({2})}, {}, 1, "constant_value must hold one value, got shape [2]"},
      {"Pad", 13, {x({2, 3}), ints({1, 1}), none(), ints({0})}, {}, 1, "the axes input exists from opset 18, the model has 13"},
      {"Pad", 18, {x({2, 3}), ints({1, 1, 1, 1}), none(), ints({0, -2})}, {}, 1, "axis -2 is repeated in axes"},
      {"Pad", 18, {x({2, 3}), ints({1, 1}), none(), {DType::Float32, {1}, Tensor::from_vector<float>({1}, {0})}}, {},
       1, "axes must be int32 or int64, got float32"},
      {"Pad", 13, {x({2, 3}), x({4})}, {}, 1, "must be known before the step runs"},
      // Only the constant mode exists on either backend; the others are refused alike.
      {"Pad", 13, {x({2, 3}), ints({1, 0, 0, 1})}, {{"mode", s("reflect")}}, 1, "mode 'reflect' is not supported (only 'constant')"},
      {"Pad", 13, {x({2, 3}), ints({1, 0, 0, 1})}, {{"mode", s("edge")}}, 1, "mode 'edge' is not supported (only 'constant')"},
      {"Pad", 19, {x({2, 3}), ints({1, 0, 0, 1})}, {{"mode", s("wrap")}}, 1, "mode 'wrap' is not supported (only 'constant')"},
      {"Pad", 2, {x({2, 3}), ints({1, 0, 0, 1})}, {{"mode", s("reflect")}, {"pads", I{1, 0, 0, 1}}}, 1,
       "mode 'reflect' is not supported (only 'constant')"},
      // Pad before opset 11: pads and value as attributes. The CUDA gather fills only zeros there.
      {"Pad", 2, {x({2, 3})}, {{"pads", I{0, 2, 0, -1}}}},
      {"Pad", 10, {x({2, 3}, f)}, {{"pads", I{1, 0, 1, 0}}, {"value", 0.0f}}},
      {"Pad", 10, {x({2, 3}, f)}, {{"pads", I{1, 0, 1, 0}}, {"value", -7.0f}}, 1, "", "on CUDA, Pad before opset 11 supports only value = 0"},
      {"Pad", 10, {x({2, 3})}, {{"pads", I{1, 0, 1, 0}}, {"value", 2.0f}}, 1,
       "a non-zero value attribute is supported for float32 and float64 only, the data is int64",
       "on CUDA, Pad before opset 11 supports only value = 0"},
      {"Pad", 10, {x({2, 3})}, {{"pads", I{1, 0}}}, 1, "pads has 2 values, expected 4"},
      // DepthToSpace (DCR, CRD; mode only from opset 11) and SpaceToDepth.
      {"DepthToSpace", 13, {x({2, 8, 2, 3})}, {{"blocksize", int64_t{2}}}},
      {"DepthToSpace", 13, {x({1, 8, 2, 3})}, {{"blocksize", int64_t{2}}, {"mode", s("CRD")}}},
      {"DepthToSpace", 11, {x({1, 9, 1, 2})}, {{"blocksize", int64_t{3}}, {"mode", s("DCR")}}},
      {"DepthToSpace", 1, {x({1, 4, 2, 2}, h)}, {{"blocksize", int64_t{2}}, {"mode", s("CRD")}}},  // no mode before 11
      {"DepthToSpace", 13, {x({1, 4, 2, 2})}, {{"blocksize", int64_t{1}}}},
      {"DepthToSpace", 13, {x({1, 8, 2, 3})}, {{"blocksize", int64_t{2}}, {"mode", s("XYZ")}}, 1, "mode must be DCR or CRD, got 'XYZ'"},
      {"DepthToSpace", 13, {x({1, 6, 2, 3})}, {{"blocksize", int64_t{2}}}, 1, "channels 6 are not divisible by blocksize^2 = 4"},
      {"DepthToSpace", 13, {x({8, 2, 3})}, {{"blocksize", int64_t{2}}}, 1, "input must be 4-D [N, C, H, W], got [8,2,3]"},
      {"DepthToSpace", 13, {x({1, 8, 2, 3})}, {}, 1, "attribute 'blocksize' is required"},
      {"DepthToSpace", 13, {x({1, 8, 2, 3})}, {{"blocksize", int64_t{0}}}, 1, "blocksize must be positive, got 0"},
      {"SpaceToDepth", 13, {x({2, 3, 4, 6})}, {{"blocksize", int64_t{2}}}},
      {"SpaceToDepth", 1, {x({1, 1, 6, 3}, b)}, {{"blocksize", int64_t{3}}}},
      {"SpaceToDepth", 13, {x({1, 2, 4, 5})}, {{"blocksize", int64_t{2}}}, 1,
       "height and width [1,2,4,5] are not divisible by blocksize 2"},
      // Trilu: upper and lower, k positive and negative, batches, non-square and empty matrices.
      {"Trilu", 14, {x({4, 5})}},
      {"Trilu", 14, {x({4, 5})}, {{"upper", int64_t{0}}}},
      {"Trilu", 14, {x({2, 3, 4}), scalar(1)}},
      {"Trilu", 14, {x({2, 3, 4}), scalar(-2)}, {{"upper", int64_t{0}}}},
      {"Trilu", 14, {x({5, 3}), ints({-1})}},
      {"Trilu", 14, {x({3, 3}), scalar(7)}, {{"upper", int64_t{0}}}},
      {"Trilu", 14, {x({3, 3}), scalar(-7)}},
      {"Trilu", 14, {x({2, 0, 3})}},
      {"Trilu", 14, {x({3, 3}), none()}, {{"upper", int64_t{0}}}},
      {"Trilu", 14, {x({3, 3}, f), scalar(1)}},
      {"Trilu", 14, {x({3})}, {}, 1, "input must have rank >= 2, got [3]"},
      {"Trilu", 14, {x({3, 3}), ints({1, 2})}, {}, 1, "k must hold one value"},
      {"Trilu", 14, {x({3, 3}), x({})}, {}, 1, "must be known before the step runs"},
  };
  // More data inputs than the CUDA gather takes: the CPU concatenates them; the CUDA factory refuses.
  Case many{"Concat", 13, {}, {{"axis", int64_t{0}}}, 1, "", "the CUDA kernel takes at most 32 data inputs, got 33"};
  for (int i = 0; i < 33; ++i) many.args.push_back(x({1, 2}));
  v.push_back(std::move(many));
  return v;
}

TEST(OpLayerMovement, GatherMapsAreTheCpuKernelsTraced) {
  int traced = 0, refused = 0;
  for (const Case& c : cases()) {
    SCOPED_TRACE(label(c) + (c.error.empty() ? "" : ", expecting: " + c.error));
    const Node node = node_of(c);
    const std::vector<KernelInput> in = inputs_of(c);
    const Planned cpu = plan_factory(node, c.opset, Device::CPU, in, c.outputs);
    const Planned ops = plan_op_layer(node, c.opset, in, c.outputs);
    if (c.error.empty()) {
      EXPECT_FALSE(cpu.error) << *cpu.error;
    } else {
      ASSERT_TRUE(cpu.error);
      EXPECT_NE(cpu.error->find(c.error), std::string::npos) << *cpu.error;
    }
    EXPECT_EQ(ops.error, cpu.error);
    if (cpu.error || ops.error) {
      ++refused;
      continue;
    }
    ASSERT_EQ(ops.outputs.size(), cpu.outputs.size());
    for (size_t i = 0; i < cpu.outputs.size(); ++i) {
      EXPECT_EQ(ops.outputs[i].dtype, cpu.outputs[i].dtype) << "output " << i;
      EXPECT_EQ(ops.outputs[i].shape, cpu.outputs[i].shape) << "output " << i;
    }
    // The sources the CUDA kernel reads: input 0, or every input of a Concat, laid end to end; Pad's constant
    // from opset 11.
    std::vector<size_t> data;
    std::vector<int64_t> bases;
    int64_t total = 0;
    for (size_t i = 0; i < in.size(); ++i)
      if (i == 0 || c.op == "Concat") {
        data.push_back(i);
        bases.push_back(total);
        total += numel_of(in[i].shape);
      }
    EXPECT_EQ(ops.maps.data, data);
    EXPECT_EQ(ops.maps.bases, bases);
    EXPECT_EQ(ops.maps.total, total);
    EXPECT_EQ(ops.maps.fill_input, c.op == "Pad" && c.opset >= 11 ? 2 : -1);
    if (!c.cuda_error.empty()) continue;  // the CUDA factory refuses it: no maps are used (and none traced before)
    const std::vector<std::vector<int64_t>> want = trace_cpu(c, node, in);
    ASSERT_EQ(ops.maps.maps.size(), want.size());
    for (size_t o = 0; o < want.size(); ++o) {
      EXPECT_EQ(static_cast<int64_t>(ops.maps.maps[o].size()), numel_of(cpu.outputs[o].shape)) << "output " << o;
      EXPECT_EQ(ops.maps.maps[o], want[o]) << "output " << o;
    }
    ++traced;
  }
  // Guards against a table whose cases all fail early.
  EXPECT_GE(traced, 60);
  EXPECT_GE(refused, 50);
}

TEST(OpLayerMovement, CudaFactoriesRefuseAsTheCpuOnes) {
  if (!built_with_cuda()) GTEST_SKIP() << "built without CUDA, so no CUDA factories to compare";
  // Only nodes the CUDA factory refuses: it fails while planning, before uploading its maps, so no GPU is needed.
  int checked = 0;
  for (const Case& c : cases()) {
    if (c.error.empty() && c.cuda_error.empty()) continue;
    SCOPED_TRACE(label(c) + ", expecting: " + (c.cuda_error.empty() ? c.error : c.cuda_error));
    const Node node = node_of(c);
    const std::vector<KernelInput> in = inputs_of(c);
    const Planned cuda = plan_factory(node, c.opset, Device::CUDA, in, c.outputs);
    ASSERT_TRUE(cuda.error);
    if (c.cuda_error.empty()) {
      EXPECT_EQ(cuda.error, plan_factory(node, c.opset, Device::CPU, in, c.outputs).error);
    } else {
      EXPECT_NE(cuda.error->find(c.cuda_error), std::string::npos) << *cuda.error;
    }
    ++checked;
  }
  EXPECT_GE(checked, 50);
}

// The shared formulas against hand-worked maps: they are also the CPU kernels' (so the test above cannot see
// them change), and these pin them.
TEST(OpLayerMovement, SharedFormulasMatchHandWorkedMaps) {
  // Trilu of a 3 x 3 matrix, flat indices 0..8.
  ops::TriluGeometry upper{1, 3, 3, 0, true}, lower{1, 3, 3, -1, false}, shifted{1, 3, 3, 1, true};
  EXPECT_EQ(ops::trilu_map(upper), (std::vector<int64_t>{0, 1, 2, -1, 4, 5, -1, -1, 8}));
  EXPECT_EQ(ops::trilu_map(lower), (std::vector<int64_t>{-1, -1, -1, 3, -1, -1, 6, 7, -1}));
  EXPECT_EQ(ops::trilu_map(shifted), (std::vector<int64_t>{-1, 1, 2, -1, -1, 5, -1, -1, -1}));
  // Pad of 4 elements by (begin, end) = (1, -2): fill, then the input's elements 0 and 1.
  const ops::PadSpan sp = ops::pad_span(4, 1, -2);
  EXPECT_EQ(sp.src, 0);
  EXPECT_EQ(sp.dst, 1);
  EXPECT_EQ(sp.len, 2);
  const ops::PadSpan crop = ops::pad_span(4, -1, 2);  // elements 1..3 at 0..2, then two fills
  EXPECT_EQ(crop.src, 1);
  EXPECT_EQ(crop.dst, 0);
  EXPECT_EQ(crop.len, 3);
  std::vector<int64_t> along;
  for (int64_t o = 0; o < 5; ++o) along.push_back(ops::pad_source(crop, o));
  EXPECT_EQ(along, (std::vector<int64_t>{1, 2, 3, -1, -1}));
  ops::PadGeometry g{{2, 2}, {3, 3}, {1, 0}, {0, 1}, {}};
  EXPECT_EQ(ops::pad_map(g), (std::vector<int64_t>{-1, -1, -1, 0, 1, -1, 2, 3, -1}));
  // A 2 x 3 transpose and a Concat of a [2, 1] and a [2, 2] along axis 1.
  EXPECT_EQ(ops::gather_map(ops::StridedView{{3, 2}, {1, 3}, 0}), (std::vector<int64_t>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(ops::concat_map(ops::AxisChunks{2, {1, 2}}), (std::vector<int64_t>{0, 2, 3, 1, 4, 5}));
  EXPECT_EQ(ops::split_maps(ops::AxisChunks{2, {1, 2}}),
            (std::vector<std::vector<int64_t>>{{0, 3}, {1, 2, 4, 5}}));
}

}  // namespace
}  // namespace onnxtrain
