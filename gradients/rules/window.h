#pragma once
// The window geometry that the convolution (rules/conv.cpp) and pooling (rules/pool.cpp) rules share: attributes
// read and checked, the forward window resolved to explicit pads (graph/window.h's arithmetic, as the kernels
// compute it), and the ConvTranspose that spreads values back over their windows.
#include <cstdint>
#include <string>
#include <vector>

#include "gradients/rule.h"
#include "graph/expr.h"

namespace onnxtrain::rules {

struct Win {
  size_t r = 0;
  std::vector<int64_t> in, out, k, s, d, pb, pe;
  std::vector<int64_t> pads() const {
    std::vector<int64_t> p = pb;
    p.insert(p.end(), pe.begin(), pe.end());
    return p;
  }
};

// Attribute list `name` with one entry per spatial dim (or `fallback`); fails naming it, and on values < 1
// (output_padding: < 0).
std::vector<int64_t> spatial_attr(RuleContext& c, const std::string& name, size_t n, int64_t fallback);
// The input's type with every spatial dim known; fails naming what is missing.
TypeInfo spatial_known(RuleContext& c, size_t i);
// The forward window geometry of Conv or a pooling op, as the kernels compute it.
Win window(RuleContext& c, const Shape& xs, const std::vector<int64_t>& kernel, bool ceil_mode);
// first, first + 1, ..., n values.
std::vector<int64_t> iota_from(int64_t first, size_t n);
// lead followed by the known dims rest.
Shape dims_shape(std::vector<Dim> lead, const std::vector<int64_t>& rest);
// ConvTranspose of `dy` by `w` whose output spatial size is exactly `target`: output_padding covers a short
// result, and a long one (pooling's ceil_mode windows past the end pad) is cropped by growing the end pad.
Expr conv_transpose_to(RuleContext& c, const Expr& dy, const Expr& w, const Win& g, const std::vector<int64_t>& target,
                       int64_t group, TypeInfo out);

}  // namespace onnxtrain::rules
