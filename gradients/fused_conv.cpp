// Function bodies of the convolution-family fused gradients, in standard ONNX (opset 17). Both read the
// forward op's attributes by reference (ref_attr_name) and take every size from the runtime shapes of their
// inputs, so one body serves 1-D to 3-D and any geometry. They need explicit pads (the rules resolve
// auto_pad first): ConvTranspose's auto_pad means something else than Conv's.
#include <cstdint>
#include <limits>
#include <tuple>

#include "gradients/fused.h"

namespace onnxtrain {

namespace {

constexpr int32_t kInt = 2, kInts = 7;  // AttributeProto type codes

// Builds one body's nodes; every node is named after its single (or first) output.
struct Body {
  Function f;

  Body(const std::string& name, std::vector<std::string> in, std::vector<std::string> out, std::string doc) {
    f.name = name;
    f.domain = kFusedGradDomain;
    f.inputs = std::move(in);
    f.outputs = std::move(out);
    f.opset_imports = {{"", 17}};
    f.doc = std::move(doc);
  }

  // refs: (the node's attribute, the caller's attribute it takes, the attribute type).
  const std::string& add(const std::string& type, std::vector<std::string> in, const std::string& out,
                         std::map<std::string, Attribute> attrs = {},
                         const std::vector<std::tuple<std::string, std::string, int32_t>>& refs = {}) {
    Node n;
    n.name = out;
    n.op_type = type;
    n.inputs = std::move(in);
    n.outputs = {out};
    n.attributes = std::move(attrs);
    for (const auto& [attr, caller, type_code] : refs) n.attribute_refs[attr] = {caller, type_code};
    f.nodes.push_back(std::move(n));
    return out;
  }

  const std::string& ints(const std::string& out, const std::vector<int64_t>& v) {
    return add("Constant", {}, out,
               {{"value", TensorData::from<int64_t>({static_cast<int64_t>(v.size())}, std::span<const int64_t>(v))}});
  }

  // Dims [start, end) of `of`'s shape (end omitted: to the last).
  const std::string& shape(const std::string& out, const std::string& of, int64_t start, int64_t end = 0) {
    std::map<std::string, Attribute> a{{"start", start}};
    if (end) a["end"] = end;
    return add("Shape", {of}, out, std::move(a));
  }

  // The caller's INTS attribute as a 1-D int64 tensor.
  const std::string& attr_tensor(const std::string& out, const std::string& attr) {
    return add("Constant", {}, out, {}, {{"value_ints", attr, kInts}});
  }

  // X's part of a full transposed convolution `full` [A, B, F...] (no pads: padded coordinates [0, F)): the
  // positions [pb, pb + in) along each spatial axis, with zeros where F falls short (by less than a stride).
  // Needs the 1-D tensors pb, s (strides), x_sp (X's spatial dims) and zero2 = [0, 0].
  const std::string& crop_to_input(const std::string& out, const std::string& full) {
    add("Shape", {full}, out + "_full_shape");
    add("Sub", {out + "_full_shape", out + "_full_shape"}, out + "_zeros");
    add("Concat", {out + "_zeros", "zero2", "s"}, out + "_pads", {{"axis", int64_t{0}}});
    add("Pad", {full, out + "_pads"}, out + "_padded");
    add("Concat", {"zero2", "pb"}, out + "_starts", {{"axis", int64_t{0}}});
    add("Add", {"pb", "x_sp"}, out + "_sp_ends");
    shape(out + "_lead", full, 0, 2);
    add("Concat", {out + "_lead", out + "_sp_ends"}, out + "_ends", {{"axis", int64_t{0}}});
    return add("Slice", {out + "_padded", out + "_starts", out + "_ends"}, out);
  }

  // pb and pe (1-D) from the pads tensor p, r = Shape(the kernel dims tensor k).
  void split_pads(const std::string& k) {
    add("Shape", {k}, "r");
    add("Slice", {"p", "zero1", "r"}, "pb");
    ints("to_end", {std::numeric_limits<int64_t>::max()});
    add("Slice", {"p", "r", "to_end"}, "pe");
  }

  // Swaps the first two axes of `in` whatever its rank: through [A, B, rest] and back to `to_shape`.
  const std::string& swap01(const std::string& out, const std::string& in, const std::string& to_shape) {
    add("Reshape", {in, "flat3"}, out + "_3d");
    add("Transpose", {out + "_3d"}, out + "_3dt", {{"perm", std::vector<int64_t>{1, 0, 2}}});
    return add("Reshape", {out + "_3dt", to_shape}, out);
  }
};

Function conv_grad() {
  Body b("ConvGrad", {"dY", "X", "W"}, {"dX", "dW", "dB"},
         "Gradient of Conv (with its attributes, explicit pads and strides) for all three inputs: dX = the full "
         "ConvTranspose(dY, W) cropped to X's positions; dW = Conv of X (batch and channels swapped) by dY (likewise) with "
         "strides and dilations exchanged, cropped to W's size; dB = sum of dY over batch and space. An omitted "
         "output is not needed.");
  b.f.attributes = {"dilations", "group", "kernel_shape", "pads", "strides"};
  b.ints("flat3", {0, 0, -1});
  b.ints("zero2", {0, 0});
  b.ints("zero1", {0});
  b.ints("minus1", {-1});
  b.ints("axes02", {0, 2});
  // dX: the full transposed convolution (no pads), cropped to X's positions. (ConvTranspose's own pads
  // would crop Conv's end pad even where the last window reads X rather than padding.)
  b.attr_tensor("p", "pads");
  b.attr_tensor("s", "strides");
  b.shape("k_sp", "W", 2);
  b.split_pads("k_sp");
  b.add("ConvTranspose", {"dY", "W"}, "ct", {},
        {{"strides", "strides", kInts}, {"dilations", "dilations", kInts}, {"group", "group", kInt},
         {"kernel_shape", "kernel_shape", kInts}});
  b.shape("x_sp", "X", 2);
  b.crop_to_input("dX", "ct");
  // dW: X as [C/G, G*N, in...] (channel-in-group first; the input groups are then the forward groups over
  // the batch) convolved by dY as [M, N, out...], grouped: [C/G, M, k' >= k].
  b.add("Reshape", {"X", "flat3"}, "x3");
  b.shape("x_s", "x3", 2, 3);
  b.shape("cg", "W", 1, 2);
  b.add("Concat", {"zero1", "minus1", "cg", "x_s"}, "x4_shape", {{"axis", int64_t{0}}});
  b.add("Reshape", {"x3", "x4_shape"}, "x4");
  b.add("Transpose", {"x4"}, "x4t", {{"perm", std::vector<int64_t>{2, 1, 0, 3}}});
  b.add("Concat", {"cg", "minus1", "x_sp"}, "a_shape", {{"axis", int64_t{0}}});
  b.add("Reshape", {"x4t", "a_shape"}, "a");
  b.shape("dy_n", "dY", 0, 1);
  b.shape("dy_m", "dY", 1, 2);
  b.shape("dy_sp", "dY", 2);
  b.add("Concat", {"dy_m", "dy_n", "dy_sp"}, "b_shape", {{"axis", int64_t{0}}});
  b.swap01("dy_t", "dY", "b_shape");
  b.add("Conv", {"a", "dy_t"}, "dw_full", {},
        {{"strides", "dilations", kInts}, {"dilations", "strides", kInts}, {"pads", "pads", kInts},
         {"group", "group", kInt}});
  b.add("Shape", {"dw_full"}, "dw_full_shape");
  b.add("Sub", {"dw_full_shape", "dw_full_shape"}, "dw_starts");
  b.shape("dw_lead", "dw_full", 0, 2);
  b.add("Concat", {"dw_lead", "k_sp"}, "dw_ends", {{"axis", int64_t{0}}});
  b.add("Slice", {"dw_full", "dw_starts", "dw_ends"}, "dw_t");
  b.add("Shape", {"W"}, "w_shape");
  b.swap01("dW", "dw_t", "w_shape");
  // dB
  b.add("Reshape", {"dY", "flat3"}, "dy3");
  b.add("ReduceSum", {"dy3", "axes02"}, "dB", {{"keepdims", int64_t{0}}});
  return std::move(b.f);
}

Function average_pool_grad() {
  Body b("AveragePoolGrad", {"dY", "X"}, {"dX"},
         "Gradient of AveragePool (with its attributes; kernel_shape, strides, pads and count_include_pad "
         "explicit, no dilations): dY divided by each window's divisor (prod(kernel_shape) with "
         "count_include_pad, else the taps inside X, counted by a Conv of ones) and spread back over the "
         "window by a ConvTranspose with a kernel of ones on (batch*channel) planes. The output geometry comes "
         "from dY's shape, so ceil_mode needs no special case.");
  // ceil_mode is declared for the caller's sake; the body takes the output size from dY.
  b.f.attributes = {"ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides"};
  b.attr_tensor("k", "kernel_shape");
  b.attr_tensor("s", "strides");
  b.attr_tensor("p", "pads");
  b.add("Constant", {}, "cip", {}, {{"value_int", "count_include_pad", kInt}});
  b.ints("zero1", {0});
  b.ints("zero2", {0, 0});
  b.ints("one2", {1, 1});
  b.ints("planes_lead", {-1, 1});
  b.split_pads("k");
  // A [1, 1, k...] kernel of ones in dY's type; its sum is prod(kernel_shape).
  b.add("Concat", {"one2", "k"}, "k_shape", {{"axis", int64_t{0}}});
  b.add("ConstantOfShape", {"k_shape"}, "ones_k_f", {{"value", TensorData::from<float>({1}, std::vector<float>{1.0f})}});
  b.add("CastLike", {"ones_k_f", "dY"}, "ones_k");
  b.add("ReduceSum", {"ones_k"}, "k_prod", {{"keepdims", int64_t{0}}});
  // Taps inside X per window: ones over X's plane, padded (pads, plus a stride at the end so a ceil_mode
  // window fits), summed by a Conv and cropped to dY's size.
  b.shape("x_sp", "X", 2);
  b.shape("y_sp", "dY", 2);
  b.add("Concat", {"one2", "x_sp"}, "plane_shape", {{"axis", int64_t{0}}});
  b.add("Constant", {}, "one_f", {{"value", TensorData::from<float>({1}, std::vector<float>{1.0f})}});
  b.add("Expand", {"one_f", "plane_shape"}, "ones_x_f");
  b.add("CastLike", {"ones_x_f", "dY"}, "ones_x");
  b.add("Add", {"pe", "s"}, "pe_s");
  b.add("Concat", {"zero2", "pb", "zero2", "pe_s"}, "count_pads", {{"axis", int64_t{0}}});
  b.add("Pad", {"ones_x", "count_pads"}, "ones_padded");
  b.add("Conv", {"ones_padded", "ones_k"}, "count_full", {}, {{"strides", "strides", kInts}});
  b.add("Shape", {"count_full"}, "count_full_shape");
  b.add("Sub", {"count_full_shape", "count_full_shape"}, "count_starts");
  b.add("Concat", {"one2", "y_sp"}, "count_ends", {{"axis", int64_t{0}}});
  b.add("Slice", {"count_full", "count_starts", "count_ends"}, "count");
  b.add("Cast", {"cip"}, "cip_b", {{"to", int64_t{9}}});  // BOOL
  b.add("Where", {"cip_b", "k_prod", "count"}, "divisor");
  b.add("Div", {"dY", "divisor"}, "scaled");
  // Spread back: the full transposed result, cropped to X.
  b.add("Concat", {"planes_lead", "y_sp"}, "planes_shape", {{"axis", int64_t{0}}});
  b.add("Reshape", {"scaled", "planes_shape"}, "planes");
  b.add("ConvTranspose", {"planes", "ones_k"}, "full", {}, {{"strides", "strides", kInts}});
  b.crop_to_input("dx_planes", "full");
  b.add("Shape", {"X"}, "x_shape");
  b.add("Reshape", {"dx_planes", "x_shape"}, "dX");
  return std::move(b.f);
}

}  // namespace

std::vector<Function> fused_conv_functions() { return {conv_grad(), average_pool_grad()}; }

}  // namespace onnxtrain
