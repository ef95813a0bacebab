// Gradient of Resize, for every mode the forward op has (nearest, linear, cubic, antialias, every coordinate
// transformation). Resize is linear in X and separable: along each resized axis d, Y = W_d X for a matrix
// W_d [out_d, in_d] that depends only on shapes and attributes, so dX is dY multiplied by W_d^T along each
// such axis. W_d is itself a Resize: resizing the identity I[in_d, in_d] along its first axis, with the same
// attributes and that axis' scale (or size), gives exactly W_d. Outputs that tf_crop_and_resize extrapolates
// do not depend on X; with extrapolation_value 0 their rows of W_d are zero, as their gradient must be.
// So the rule is exact in standard ONNX, and nearest's ties follow the forward op's own rounding.
#include <cmath>

#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

// A 1-D float constant of dtype t (float32 or float64), for scales and roi.
Expr floats(GraphBuilder& b, DType t, const std::vector<double>& v) {
  const std::vector<int64_t> dims{static_cast<int64_t>(v.size())};
  if (t == DType::Float64) return constant(b, TensorData::from<double>(dims, std::span<const double>(v)));
  std::vector<float> f(v.begin(), v.end());
  return constant(b, TensorData::from<float>(dims, std::span<const float>(f)));
}

std::vector<double> float_values(const TensorData& t) {
  std::vector<double> v;
  if (t.dtype == DType::Float32)
    for (float f : t.as<float>()) v.push_back(f);
  else if (t.dtype == DType::Float64)
    for (double d : t.as<double>()) v.push_back(d);
  return v;
}

// How the forward op sized one axis, so that resizing the identity reproduces it.
struct AxisPlan {
  int64_t axis = 0, in = 0, out = 0;
  bool by_scale = true;  // scales input [scale, 1] (in scale_dtype); else sizes input [out, in]
  double scale = 1;
  DType scale_dtype = DType::Float32;
  double roi_start = 0, roi_end = 1;
};

// The constant value of optional input i; nullptr when absent or empty. Fails when it is computed at run time.
const TensorData* optional_constant(RuleContext& c, size_t i, const char* what) {
  if (!c.has_input(i)) return nullptr;
  const TensorData* t = rules::constant_tensor(c.builder().graph(), c.node().inputs[i]);
  if (!t) c.fail(std::string(what) + " must be a constant (an initializer or Constant node)");
  return t->numel() == 0 ? nullptr : t;
}

std::vector<AxisPlan> plan_axes(RuleContext& c, const std::vector<int64_t>& x_dims, const Shape& y_shape) {
  const Node& n = c.node();
  const auto rank = static_cast<int64_t>(x_dims.size());
  std::vector<int64_t> axes;
  if (c.opset() >= 18 && n.has_attr("axes")) {
    for (int64_t a : n.attr_ints("axes")) axes.push_back(a < 0 ? a + rank : a);
  } else {
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  }
  const TensorData* scales = optional_constant(c, 2, "scales");
  const TensorData* sizes = optional_constant(c, 3, "sizes");
  if ((scales != nullptr) == (sizes != nullptr)) c.fail("needs exactly one of scales and sizes");
  const std::string coordinate = n.attr_string("coordinate_transformation_mode", "half_pixel");
  const bool crop = coordinate == "tf_crop_and_resize";
  std::vector<double> roi;
  if (crop) {
    const TensorData* r = optional_constant(c, 1, "roi");
    if (!r) c.fail("tf_crop_and_resize needs roi");
    roi = float_values(*r);
    if (roi.size() != 2 * axes.size()) c.fail("roi must hold 2 values per resized axis");
  }
  std::vector<double> scale_values;
  if (scales) {
    scale_values = float_values(*scales);
    if (scale_values.size() != axes.size()) c.fail("scales must be float32 or float64, one per resized axis");
  }
  const std::string policy = c.opset() >= 18 ? n.attr_string("keep_aspect_ratio_policy", "stretch") : "stretch";
  std::vector<AxisPlan> plans;
  for (size_t i = 0; i < axes.size(); ++i) {
    AxisPlan p;
    p.axis = axes[i];
    if (p.axis < 0 || p.axis >= rank) c.fail("axes holds an axis out of range");
    p.in = x_dims[p.axis];
    p.out = y_shape[p.axis].value;
    if (crop) {
      p.roi_start = roi[i];
      p.roi_end = roi[axes.size() + i];
    }
    if (scales) {
      p.scale = scale_values[i];
      p.scale_dtype = scales->dtype;
    } else if (policy == "stretch") {
      p.by_scale = false;
      p.scale = p.in > 0 ? static_cast<double>(p.out) / static_cast<double>(p.in) : -1;
    } else {
      // The forward op used one scale for every axis; the identity's Resize must reproduce it through scales,
      // which give floor(scale * in) outputs where the policy rounded.
      auto sz = rules::constant_int64s(c.builder().graph(), n.inputs[3]);
      if (!sz || sz->size() != axes.size()) c.fail("sizes must be int64, one per resized axis");
      for (int64_t a : axes)
        if (x_dims[a] < 0) c.fail("needs X's size along resized axis " + std::to_string(a));
      double s = static_cast<double>((*sz)[0]) / static_cast<double>(x_dims[axes[0]]);
      for (size_t k = 0; k < axes.size(); ++k) {
        const double sk = static_cast<double>((*sz)[k]) / static_cast<double>(x_dims[axes[k]]);
        s = policy == "not_larger" ? std::min(s, sk) : std::max(s, sk);
      }
      p.scale = s;
      p.scale_dtype = DType::Float64;
      if (static_cast<int64_t>(std::floor(s * static_cast<double>(p.in))) != p.out)
        c.fail("keep_aspect_ratio_policy '" + policy + "' rounds axis " + std::to_string(p.axis) +
               " to a size that scales cannot reproduce; no gradient for this case");
    }
    if (!crop && p.scale == 1) continue;  // this axis is the identity (scale 1 keeps the size too)
    if (p.in < 0 || p.out < 0)
      c.fail("needs the sizes of X and Y along resized axis " + std::to_string(p.axis) + " to be known statically");
    plans.push_back(p);
  }
  return plans;
}

// W [out, in]: the identity resized along its first axis.
Expr weights(RuleContext& c, const AxisPlan& p, DType dtype) {
  GraphBuilder& b = c.builder();
  const Node& n = c.node();
  std::vector<double> eye(static_cast<size_t>(p.in * p.in), 0.0);
  for (int64_t i = 0; i < p.in; ++i) eye[i * p.in + i] = 1;
  Expr identity;
  if (dtype == DType::Float64) {
    identity = constant(b, TensorData::from<double>({p.in, p.in}, std::span<const double>(eye)));
  } else {
    std::vector<float> f(eye.begin(), eye.end());
    identity = constant(b, TensorData::from<float>({p.in, p.in}, std::span<const float>(f)));
  }
  std::map<std::string, Attribute> attrs = n.attributes;
  attrs.erase("axes");
  attrs.erase("keep_aspect_ratio_policy");
  attrs.erase("extrapolation_value");
  const bool crop = n.attr_string("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize";
  // Before opset 13 roi and scales are required inputs (an empty tensor stands for "not given").
  const bool required = c.opset() < 13;
  Expr roi = crop ? floats(b, DType::Float32, {p.roi_start, 0.0, p.roi_end, 1.0})
                  : (required ? floats(b, DType::Float32, {}) : Expr{});
  std::vector<Expr> ins{identity, roi};
  if (p.by_scale) {
    ins.push_back(floats(b, p.scale_dtype, {p.scale, 1.0}));
  } else {
    ins.push_back(required ? floats(b, DType::Float32, {}) : Expr{});
    ins.push_back(int64s(b, {p.out, p.in}));
  }
  return apply(b, "Resize", ins, TypeInfo{dtype, Shape{Dim::of(p.out), Dim::of(p.in)}}, std::move(attrs));
}

// g with W^T applied along `axis`: g's size there goes from out to in.
Expr contract(RuleContext& c, const Expr& g, const Expr& w, const AxisPlan& p) {
  GraphBuilder& b = c.builder();
  Shape shape = *g.shape();
  const auto rank = static_cast<int64_t>(shape.size());
  Shape result = shape;
  result[p.axis] = Dim::of(p.in);
  if (p.axis == rank - 1) return apply(b, "MatMul", {g, w}, TypeInfo{g.dtype(), result});
  // [pre, out, post] x W^T [in, out] on the left -> [pre, in, post]; one unknown dim becomes -1.
  int64_t pre = 1, post = 1, unknown = 0;
  for (int64_t i = 0; i < rank; ++i) {
    if (i == p.axis) continue;
    if (!shape[i].known()) {
      ++unknown;
      (i < p.axis ? pre : post) = -1;
    } else if (i < p.axis && pre != -1) {
      pre *= shape[i].value;
    } else if (i > p.axis && post != -1) {
      post *= shape[i].value;
    }
  }
  if (unknown > 1) c.fail("needs all but one of the output's dims to be known statically");
  Expr wt = transpose(w, {1, 0});
  Shape three{pre < 0 ? Dim{} : Dim::of(pre), Dim::of(p.out), post < 0 ? Dim{} : Dim::of(post)};
  Expr g3 = reshape(g, int64s(b, {pre, p.out, post}), three);
  Shape three_in = three;
  three_in[1] = Dim::of(p.in);
  Expr d3 = apply(b, "MatMul", {wt, g3}, TypeInfo{g.dtype(), three_in});
  std::vector<int64_t> back;
  for (const Dim& d : result) back.push_back(d.known() ? d.value : -1);
  return reshape(d3, int64s(b, back), result);
}

void resize_rule(RuleContext& c) {
  if (c.opset() < 11) c.fail("needs opset 11 or newer (Resize before 11 has no coordinate modes)");
  const TypeInfo xt = rules::input_type(c, 0);
  if (xt.dtype != DType::Float32 && xt.dtype != DType::Float64) c.fail("supports float32 and float64 inputs");
  Expr dy = c.dY(0);
  if (!xt.shape || !dy.shape() || dy.shape()->size() != xt.shape->size()) c.fail("needs the ranks of X and Y");
  std::vector<int64_t> x_dims;
  for (size_t i = 0; i < xt.shape->size(); ++i) x_dims.push_back((*xt.shape)[i].known() ? (*xt.shape)[i].value : -1);
  const std::vector<AxisPlan> plans = plan_axes(c, x_dims, *dy.shape());
  Expr g = dy;
  for (const AxisPlan& p : plans) g = contract(c, g, weights(c, p, xt.dtype), p);
  c.set_dX(0, g);
}

}  // namespace

void register_resize_rules(GradientRegistry& r) { r.add("Resize", resize_rule); }

}  // namespace onnxtrain
