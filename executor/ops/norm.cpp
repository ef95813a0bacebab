// The plan-time part of the normalizations with kernels on both backends (norm.h), shared by the CPU and CUDA
// kernels.
#include "executor/ops/norm.h"

#include <span>
#include <string>

#include "executor/ops/kernel_util.h"
#include "graph/error.h"

namespace onnxtrain::ops {
namespace {

int64_t prod(const std::vector<int64_t>& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

void expect_float(const PrepareContext& ctx, size_t i, DType t, const char* name) {
  const KernelInput& in = required_input(ctx, i, name);
  if (in.dtype != t)
    ctx.fail(std::string("input ") + std::to_string(i) + " (" + name + ") must have the input's dtype " +
             dtype_name(t) + ", got " + dtype_name(in.dtype));
}

// Input i must have exactly `want` elements in a 1-D shape.
void expect_vector(const PrepareContext& ctx, size_t i, const char* name, int64_t want) {
  const KernelInput& in = ctx.inputs[i];
  int64_t n = 1;
  for (int64_t d : in.shape) n *= d;
  if (in.shape.size() != 1 || n != want)
    ctx.fail(std::string("input ") + std::to_string(i) + " (" + name + ") must have shape [" + std::to_string(want) +
             "], got " + shape_string(in.shape));
}

// LayerNormalization's Scale and B broadcast (numpy, unidirectionally) to the normalised row's shape.
void expect_broadcast(const PrepareContext& ctx, const std::vector<int64_t>& row_shape, const std::vector<int64_t>& s,
                      const char* name) {
  if (s == row_shape) return;
  if (s.size() > row_shape.size())
    ctx.fail(std::string(name) + " of shape " + shape_string(s) + " does not broadcast to the normalised shape " +
             shape_string(row_shape));
  const size_t off = row_shape.size() - s.size();
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] != 1 && s[i] != row_shape[off + i])
      ctx.fail(std::string(name) + " of shape " + shape_string(s) + " does not broadcast to the normalised shape " +
               shape_string(row_shape));
}

// The inputs of a normalisation's fused gradient: all present, of dY's type, and X of dY's shape. Returns X.
const KernelInput& expect_grad_operands(const PrepareContext& ctx, std::span<const char* const> names) {
  const KernelInput& dy = required_input(ctx, 0, names[0]);
  for (size_t i = 1; i < names.size(); ++i) {
    required_input(ctx, i, names[i]);
    expect_float(ctx, i, dy.dtype, names[i]);
  }
  const KernelInput& x = ctx.inputs[1];
  if (x.shape != dy.shape)
    ctx.fail("dY " + shape_string(dy.shape) + " and X " + shape_string(x.shape) + " must have the same shape");
  return x;
}

}  // namespace

LayerNormAttrs prepare_layer_norm(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "X");
  const KernelInput& s = required_input(ctx, 1, "Scale");
  expect_float(ctx, 1, x.dtype, "Scale");
  LayerNormAttrs a;
  a.has_bias = has_input(ctx, 2);
  if (a.has_bias) expect_float(ctx, 2, x.dtype, "B");
  const auto rank = static_cast<int64_t>(x.shape.size());
  if (rank == 0) ctx.fail("input X must have rank >= 1, got a scalar");
  a.axis = normalize_axis(ctx, ctx.node.attr_int("axis", -1), rank);
  a.row_shape.assign(x.shape.begin() + a.axis, x.shape.end());
  expect_broadcast(ctx, a.row_shape, s.shape, "Scale");
  if (a.has_bias) expect_broadcast(ctx, a.row_shape, ctx.inputs[2].shape, "B");
  // stash_type is the type of Mean and InvStdDev (the schema allows float; double is accepted too). The
  // statistics are always accumulated in double, at least as precise as either choice.
  const int64_t stash = ctx.node.attr_int("stash_type", 1);
  if (stash != 1 && stash != 11)
    ctx.fail("stash_type " + std::to_string(stash) + " is not supported (1 = float, 11 = double)");
  a.stash = stash == 1 ? DType::Float32 : DType::Float64;
  a.eps = ctx.node.attr_float("epsilon", 1e-5f);
  if (ctx.outputs.empty() || ctx.outputs.size() > 3)
    ctx.fail("expected 1 to 3 outputs (Y, Mean, InvStdDev), got " + std::to_string(ctx.outputs.size()));
  set_output(ctx, 0, x.dtype, x.shape);
  std::vector<int64_t> stat_shape(x.shape.begin(), x.shape.begin() + a.axis);
  stat_shape.resize(rank, 1);
  for (size_t i = 1; i < ctx.outputs.size(); ++i) set_output(ctx, i, a.stash, stat_shape);
  a.rows = prod(x.shape, 0, a.axis);
  a.len = prod(x.shape, a.axis, rank);
  return a;
}

RowNormGeometry prepare_instance_norm(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "input");
  required_input(ctx, 1, "scale");
  required_input(ctx, 2, "B");
  expect_float(ctx, 1, x.dtype, "scale");
  expect_float(ctx, 2, x.dtype, "B");
  if (x.shape.size() < 2) ctx.fail("input must have rank >= 2 (N, C, ...), got " + shape_string(x.shape));
  const int64_t c = x.shape[1];
  expect_vector(ctx, 1, "scale", c);
  expect_vector(ctx, 2, "B", c);
  RowNormGeometry g;
  g.eps = ctx.node.attr_float("epsilon", 1e-5f);
  set_output(ctx, 0, x.dtype, x.shape);
  g.plane = g.len = prod(x.shape, 2, x.shape.size());
  g.rows = x.shape[0] * c;
  g.channels = c;
  return g;
}

RowNormGeometry prepare_group_norm(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "X");
  required_input(ctx, 1, "scale");
  required_input(ctx, 2, "bias");
  expect_float(ctx, 1, x.dtype, "scale");
  expect_float(ctx, 2, x.dtype, "bias");
  if (x.shape.size() < 2) ctx.fail("input X must have rank >= 2 (N, C, ...), got " + shape_string(x.shape));
  if (!ctx.node.has_attr("num_groups")) ctx.fail("attribute 'num_groups' is required");
  const int64_t groups = ctx.node.attr_int("num_groups", 1), c = x.shape[1];
  if (groups <= 0 || c % groups != 0)
    ctx.fail("num_groups " + std::to_string(groups) + " must be positive and divide the channel count " +
             std::to_string(c));
  const bool per_channel = ctx.opset >= 21;
  expect_vector(ctx, 1, "scale", per_channel ? c : groups);
  expect_vector(ctx, 2, "bias", per_channel ? c : groups);
  RowNormGeometry g;
  g.eps = ctx.node.attr_float("epsilon", 1e-5f);
  set_output(ctx, 0, x.dtype, x.shape);
  const int64_t spatial = prod(x.shape, 2, x.shape.size());
  g.rows = x.shape[0] * groups;
  g.len = (c / groups) * spatial;
  // Per group, the parameter is constant over the whole row.
  g.plane = per_channel ? spatial : g.len;
  g.channels = per_channel ? c : groups;
  return g;
}

BatchNormAttrs prepare_batch_norm(PrepareContext& ctx) {
  const KernelInput& x = required_input(ctx, 0, "X");
  const char* names[] = {"X", "scale", "B", "input_mean", "input_var"};
  for (size_t i = 1; i < 5; ++i) {
    required_input(ctx, i, names[i]);
    expect_float(ctx, i, x.dtype, names[i]);
  }
  if (x.shape.size() < 2) ctx.fail("input X must have rank >= 2 (N, C, ...), got " + shape_string(x.shape));
  BatchNormAttrs a;
  a.c = x.shape[1];
  for (size_t i = 1; i < 5; ++i) expect_vector(ctx, i, names[i], a.c);
  a.training = ctx.opset >= 14 && ctx.node.attr_int("training_mode", 0) != 0;
  if (ctx.opset < 14 && ctx.outputs.size() > 1)
    ctx.fail("training-mode outputs (mean, var, saved_mean, saved_var) of opset " + std::to_string(ctx.opset) +
             " BatchNormalization are not supported; use opset 14+ training_mode");
  if (!a.training && ctx.outputs.size() > 1)
    ctx.fail("outputs running_mean and running_var exist only with training_mode=1, got " +
             std::to_string(ctx.outputs.size()) + " outputs");
  if (ctx.outputs.size() > 3) ctx.fail("expected at most 3 outputs, got " + std::to_string(ctx.outputs.size()));
  a.eps = ctx.node.attr_float("epsilon", 1e-5f);
  a.momentum = ctx.node.attr_float("momentum", 0.9f);
  set_output(ctx, 0, x.dtype, x.shape);
  for (size_t i = 1; i < ctx.outputs.size(); ++i) set_output(ctx, i, x.dtype, {a.c});
  a.n = x.shape[0];
  a.plane = prod(x.shape, 2, x.shape.size());
  return a;
}

BatchNormAttrs prepare_batch_norm_grad(PrepareContext& ctx) {
  const char* names[] = {"dY", "X", "Scale"};
  const KernelInput& x = expect_grad_operands(ctx, names);
  if (x.shape.size() < 2) ctx.fail("input X must have rank >= 2 (N, C, ...), got " + shape_string(x.shape));
  BatchNormAttrs a;
  a.c = x.shape[1];
  expect_vector(ctx, 2, "Scale", a.c);
  if (ctx.outputs.empty() || ctx.outputs.size() > 3)
    ctx.fail("expected 1 to 3 outputs (dX, dScale, dBias), got " + std::to_string(ctx.outputs.size()));
  a.eps = ctx.node.attr_float("epsilon", 1e-5f);
  set_output(ctx, 0, x.dtype, x.shape);
  for (size_t i = 1; i < ctx.outputs.size(); ++i) set_output(ctx, i, x.dtype, {a.c});
  a.n = x.shape[0];
  a.plane = prod(x.shape, 2, x.shape.size());
  return a;
}

LayerNormGradGeometry prepare_layer_norm_grad(PrepareContext& ctx) {
  const char* names[] = {"dY", "X", "Scale", "Mean", "InvStdDev"};
  const KernelInput& x = expect_grad_operands(ctx, names);
  const auto rank = static_cast<int64_t>(x.shape.size());
  if (rank == 0) ctx.fail("input X must have rank >= 1, got a scalar");
  const int64_t axis = normalize_axis(ctx, ctx.node.attr_int("axis", -1), rank);
  const std::vector<int64_t> row_shape(x.shape.begin() + axis, x.shape.end());
  if (ctx.inputs[2].shape != row_shape)
    ctx.fail("Scale must have the normalised shape " + shape_string(row_shape) + ", got " +
             shape_string(ctx.inputs[2].shape));
  LayerNormGradGeometry g;
  g.rows = prod(x.shape, 0, axis);
  g.len = prod(x.shape, axis, rank);
  for (size_t i = 3; i < 5; ++i)
    if (prod(ctx.inputs[i].shape, 0, ctx.inputs[i].shape.size()) != g.rows)
      ctx.fail(std::string(names[i]) + " must have one value per normalised row (" + std::to_string(g.rows) +
               "), got " + shape_string(ctx.inputs[i].shape));
  if (ctx.outputs.empty() || ctx.outputs.size() > 3)
    ctx.fail("expected 1 to 3 outputs (dX, dScale, dBias), got " + std::to_string(ctx.outputs.size()));
  set_output(ctx, 0, x.dtype, x.shape);
  for (size_t i = 1; i < ctx.outputs.size(); ++i) set_output(ctx, i, x.dtype, row_shape);
  return g;
}

}  // namespace onnxtrain::ops
