// Function bodies of the convolution-family fused gradients, in standard ONNX (opset 17). Both read the
// forward op's attributes by reference (ref_attr_name) and take every size from the runtime shapes of their
// inputs, so one body serves 1-D to 3-D and any geometry. They need explicit pads (the rules resolve
// auto_pad first): ConvTranspose's auto_pad means something else than Conv's.
#include <cstdint>
#include <limits>

#include "gradients/fused_body.h"

namespace onnxtrain {

namespace {

using fused_body::add;
using fused_body::caller_attribute;
using fused_body::int64s;
using fused_body::kInt;
using fused_body::kInts;

// Dims [start, end) of `of`'s shape (end omitted: to the last).
std::string shape(Function& f, const std::string& out, const std::string& of, int64_t start, int64_t end = 0) {
  std::map<std::string, Attribute> a{{"start", start}};
  if (end) a["end"] = end;
  return add(f, "Shape", {of}, out, std::move(a));
}

// X's part of a full transposed convolution `full` [A, B, F...] (no pads: padded coordinates [0, F)): the
// positions [pb, pb + in) along each spatial axis, with zeros where F falls short (by less than a stride).
// Needs the 1-D tensors pb, s (strides), x_sp (X's spatial dims) and zero2 = [0, 0].
std::string crop_to_input(Function& f, const std::string& out, const std::string& full) {
  add(f, "Shape", {full}, out + "_full_shape");
  add(f, "Sub", {out + "_full_shape", out + "_full_shape"}, out + "_zeros");
  add(f, "Concat", {out + "_zeros", "zero2", "s"}, out + "_pads", {{"axis", int64_t{0}}});
  add(f, "Pad", {full, out + "_pads"}, out + "_padded");
  add(f, "Concat", {"zero2", "pb"}, out + "_starts", {{"axis", int64_t{0}}});
  add(f, "Add", {"pb", "x_sp"}, out + "_sp_ends");
  shape(f, out + "_lead", full, 0, 2);
  add(f, "Concat", {out + "_lead", out + "_sp_ends"}, out + "_ends", {{"axis", int64_t{0}}});
  return add(f, "Slice", {out + "_padded", out + "_starts", out + "_ends"}, out);
}

// pb and pe (1-D) from the pads tensor p, r = Shape(the kernel dims tensor k).
void split_pads(Function& f, const std::string& k) {
  add(f, "Shape", {k}, "r");
  add(f, "Slice", {"p", "zero1", "r"}, "pb");
  int64s(f, "to_end", {std::numeric_limits<int64_t>::max()});
  add(f, "Slice", {"p", "r", "to_end"}, "pe");
}

// Swaps the first two axes of `in` whatever its rank: through [A, B, rest] and back to `to_shape`.
std::string swap01(Function& f, const std::string& out, const std::string& in, const std::string& to_shape) {
  add(f, "Reshape", {in, "flat3"}, out + "_3d");
  add(f, "Transpose", {out + "_3d"}, out + "_3dt", {{"perm", std::vector<int64_t>{1, 0, 2}}});
  return add(f, "Reshape", {out + "_3dt", to_shape}, out);
}

Function conv_grad() {
  Function f = fused_body::function(
      "ConvGrad", {"dY", "X", "W"}, {"dX", "dW", "dB"},
      "Gradient of Conv (with its attributes, explicit pads and strides) for all three inputs: dX = the full "
      "ConvTranspose(dY, W) cropped to X's positions; dW = Conv of X (batch and channels swapped) by dY (likewise) with "
      "strides and dilations exchanged, cropped to W's size; dB = sum of dY over batch and space. An omitted "
      "output is not needed.",
      {"dilations", "group", "kernel_shape", "pads", "strides"});
  int64s(f, "flat3", {0, 0, -1});
  int64s(f, "zero2", {0, 0});
  int64s(f, "zero1", {0});
  int64s(f, "minus1", {-1});
  int64s(f, "axes02", {0, 2});
  // dX: the full transposed convolution (no pads), cropped to X's positions. (ConvTranspose's own pads
  // would crop Conv's end pad even where the last window reads X rather than padding.)
  caller_attribute(f, "p", "pads", kInts);
  caller_attribute(f, "s", "strides", kInts);
  shape(f, "k_sp", "W", 2);
  split_pads(f, "k_sp");
  add(f, "ConvTranspose", {"dY", "W"}, "ct", {},
      {{"strides", "strides", kInts}, {"dilations", "dilations", kInts}, {"group", "group", kInt},
       {"kernel_shape", "kernel_shape", kInts}});
  shape(f, "x_sp", "X", 2);
  crop_to_input(f, "dX", "ct");
  // dW: X as [C/G, G*N, in...] (channel-in-group first; the input groups are then the forward groups over
  // the batch) convolved by dY as [M, N, out...], grouped: [C/G, M, k' >= k].
  add(f, "Reshape", {"X", "flat3"}, "x3");
  shape(f, "x_s", "x3", 2, 3);
  shape(f, "cg", "W", 1, 2);
  add(f, "Concat", {"zero1", "minus1", "cg", "x_s"}, "x4_shape", {{"axis", int64_t{0}}});
  add(f, "Reshape", {"x3", "x4_shape"}, "x4");
  add(f, "Transpose", {"x4"}, "x4t", {{"perm", std::vector<int64_t>{2, 1, 0, 3}}});
  add(f, "Concat", {"cg", "minus1", "x_sp"}, "a_shape", {{"axis", int64_t{0}}});
  add(f, "Reshape", {"x4t", "a_shape"}, "a");
  shape(f, "dy_n", "dY", 0, 1);
  shape(f, "dy_m", "dY", 1, 2);
  shape(f, "dy_sp", "dY", 2);
  add(f, "Concat", {"dy_m", "dy_n", "dy_sp"}, "b_shape", {{"axis", int64_t{0}}});
  swap01(f, "dy_t", "dY", "b_shape");
  add(f, "Conv", {"a", "dy_t"}, "dw_full", {},
      {{"strides", "dilations", kInts}, {"dilations", "strides", kInts}, {"pads", "pads", kInts},
       {"group", "group", kInt}});
  add(f, "Shape", {"dw_full"}, "dw_full_shape");
  add(f, "Sub", {"dw_full_shape", "dw_full_shape"}, "dw_starts");
  shape(f, "dw_lead", "dw_full", 0, 2);
  add(f, "Concat", {"dw_lead", "k_sp"}, "dw_ends", {{"axis", int64_t{0}}});
  add(f, "Slice", {"dw_full", "dw_starts", "dw_ends"}, "dw_t");
  add(f, "Shape", {"W"}, "w_shape");
  swap01(f, "dW", "dw_t", "w_shape");
  // dB
  add(f, "Reshape", {"dY", "flat3"}, "dy3");
  add(f, "ReduceSum", {"dy3", "axes02"}, "dB", {{"keepdims", int64_t{0}}});
  return f;
}

Function average_pool_grad() {
  // ceil_mode is declared for the caller's sake; the body takes the output size from dY.
  Function f = fused_body::function(
      "AveragePoolGrad", {"dY", "X"}, {"dX"},
      "Gradient of AveragePool (with its attributes; kernel_shape, strides, pads and count_include_pad "
      "explicit, no dilations): dY divided by each window's divisor (prod(kernel_shape) with "
      "count_include_pad, else the taps inside X, counted by a Conv of ones) and spread back over the "
      "window by a ConvTranspose with a kernel of ones on (batch*channel) planes. The output geometry comes "
      "from dY's shape, so ceil_mode needs no special case.",
      {"ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides"});
  caller_attribute(f, "k", "kernel_shape", kInts);
  caller_attribute(f, "s", "strides", kInts);
  caller_attribute(f, "p", "pads", kInts);
  caller_attribute(f, "cip", "count_include_pad", kInt);
  int64s(f, "zero1", {0});
  int64s(f, "zero2", {0, 0});
  int64s(f, "one2", {1, 1});
  int64s(f, "planes_lead", {-1, 1});
  split_pads(f, "k");
  // A [1, 1, k...] kernel of ones in dY's type; its sum is prod(kernel_shape).
  add(f, "Concat", {"one2", "k"}, "k_shape", {{"axis", int64_t{0}}});
  add(f, "ConstantOfShape", {"k_shape"}, "ones_k_f",
      {{"value", TensorData::from<float>({1}, std::vector<float>{1.0f})}});
  add(f, "CastLike", {"ones_k_f", "dY"}, "ones_k");
  add(f, "ReduceSum", {"ones_k"}, "k_prod", {{"keepdims", int64_t{0}}});
  // Taps inside X per window: ones over X's plane, padded (pads, plus a stride at the end so a ceil_mode
  // window fits), summed by a Conv and cropped to dY's size.
  shape(f, "x_sp", "X", 2);
  shape(f, "y_sp", "dY", 2);
  add(f, "Concat", {"one2", "x_sp"}, "plane_shape", {{"axis", int64_t{0}}});
  add(f, "Constant", {}, "one_f", {{"value", TensorData::from<float>({1}, std::vector<float>{1.0f})}});
  add(f, "Expand", {"one_f", "plane_shape"}, "ones_x_f");
  add(f, "CastLike", {"ones_x_f", "dY"}, "ones_x");
  add(f, "Add", {"pe", "s"}, "pe_s");
  add(f, "Concat", {"zero2", "pb", "zero2", "pe_s"}, "count_pads", {{"axis", int64_t{0}}});
  add(f, "Pad", {"ones_x", "count_pads"}, "ones_padded");
  add(f, "Conv", {"ones_padded", "ones_k"}, "count_full", {}, {{"strides", "strides", kInts}});
  add(f, "Shape", {"count_full"}, "count_full_shape");
  add(f, "Sub", {"count_full_shape", "count_full_shape"}, "count_starts");
  add(f, "Concat", {"one2", "y_sp"}, "count_ends", {{"axis", int64_t{0}}});
  add(f, "Slice", {"count_full", "count_starts", "count_ends"}, "count");
  add(f, "Cast", {"cip"}, "cip_b", {{"to", int64_t{9}}});  // BOOL
  add(f, "Where", {"cip_b", "k_prod", "count"}, "divisor");
  add(f, "Div", {"dY", "divisor"}, "scaled");
  // Spread back: the full transposed result, cropped to X.
  add(f, "Concat", {"planes_lead", "y_sp"}, "planes_shape", {{"axis", int64_t{0}}});
  add(f, "Reshape", {"scaled", "planes_shape"}, "planes");
  add(f, "ConvTranspose", {"planes", "ones_k"}, "full", {}, {{"strides", "strides", kInts}});
  crop_to_input(f, "dx_planes", "full");
  add(f, "Shape", {"X"}, "x_shape");
  add(f, "Reshape", {"dx_planes", "x_shape"}, "dX");
  return f;
}

}  // namespace

std::vector<Function> fused_conv_functions() { return {conv_grad(), average_pool_grad()}; }

}  // namespace onnxtrain
