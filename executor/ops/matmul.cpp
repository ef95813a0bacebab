// The plan-time part of MatMul and Gemm (matmul.h), shared by the CPU and CUDA kernels. The checks and messages are
// the float32 CPU factory's, which the float16/bfloat16 paths (widened or native bfloat16) now share.
#include "executor/ops/matmul.h"

#include <algorithm>
#include <cstddef>
#include <string>

#include "executor/ops/kernel_util.h"
#include "graph/error.h"

namespace onnxtrain::ops {
namespace {

// A and B present and of one dtype.
void expect_operands(const PrepareContext& ctx) {
  const KernelInput& a = required_input(ctx, 0, "A");
  const KernelInput& b = required_input(ctx, 1, "B");
  if (a.dtype != b.dtype) ctx.fail("A is " + dtype_name(a.dtype) + " but B is " + dtype_name(b.dtype));
}

}  // namespace

int64_t MatMulGeometry::batch() const {
  int64_t n = 1;
  for (int64_t d : out_batch) n *= d;
  return n;
}

MatMulGeometry prepare_matmul(PrepareContext& ctx) {
  required_input(ctx, 0, "A");
  required_input(ctx, 1, "B");
  return prepare_matmul(ctx, ctx.inputs[0].shape, ctx.inputs[1].shape);
}

MatMulGeometry prepare_matmul(PrepareContext& ctx, const std::vector<int64_t>& a_shape,
                              const std::vector<int64_t>& b_shape) {
  expect_operands(ctx);
  if (a_shape.empty() || b_shape.empty()) ctx.fail("MatMul inputs must have rank >= 1");
  MatMulGeometry g;
  // numpy: a 1-D A is a row [1, K], a 1-D B a column [K, 1]; the added dim is dropped from the output.
  g.a_vector = a_shape.size() == 1;
  g.b_vector = b_shape.size() == 1;
  std::vector<int64_t> as = a_shape, bs = b_shape;
  if (g.a_vector) as.insert(as.begin(), 1);
  if (g.b_vector) bs.push_back(1);
  g.M = as[as.size() - 2];
  g.K = as.back();
  g.N = bs.back();
  // Errors name the operands as the graph wrote them (on the CPU, a folded Transpose included).
  const std::string a_str = shape_string(a_shape), b_str = shape_string(b_shape);
  if (bs[bs.size() - 2] != g.K) ctx.fail("inner dims differ: A " + a_str + " and B " + b_str);
  const size_t r = std::max(as.size(), bs.size()) - 2;
  g.a_batch.assign(r, 1);
  g.b_batch.assign(r, 1);
  std::copy(as.begin(), as.end() - 2, g.a_batch.end() - static_cast<std::ptrdiff_t>(as.size() - 2));
  std::copy(bs.begin(), bs.end() - 2, g.b_batch.end() - static_cast<std::ptrdiff_t>(bs.size() - 2));
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = g.a_batch[i], db = g.b_batch[i];
    if (da != db && da != 1 && db != 1) ctx.fail("batch dims of A " + a_str + " and B " + b_str + " do not broadcast");
    g.out_batch.push_back(da == 1 ? db : da);
  }
  std::vector<int64_t> out = g.out_batch;
  if (!g.a_vector) out.push_back(g.M);
  if (!g.b_vector) out.push_back(g.N);
  set_output(ctx, 0, ctx.inputs[0].dtype, std::move(out));
  return g;
}

GemmGeometry prepare_gemm(PrepareContext& ctx) {
  expect_operands(ctx);
  const KernelInput& a = ctx.inputs[0];
  const KernelInput& b = ctx.inputs[1];
  if (a.shape.size() != 2 || b.shape.size() != 2)
    ctx.fail("A and B must be 2-D, got " + shape_string(a.shape) + " and " + shape_string(b.shape));
  GemmGeometry g;
  g.trans_a = ctx.node.attr_int("transA", 0) != 0;
  g.trans_b = ctx.node.attr_int("transB", 0) != 0;
  g.M = g.trans_a ? a.shape[1] : a.shape[0];
  g.K = g.trans_a ? a.shape[0] : a.shape[1];
  const int64_t kb = g.trans_b ? b.shape[1] : b.shape[0];
  g.N = g.trans_b ? b.shape[0] : b.shape[1];
  if (kb != g.K)
    ctx.fail("inner dims differ: A " + shape_string(a.shape) + (g.trans_a ? " (transposed)" : "") + " and B " +
             shape_string(b.shape) + (g.trans_b ? " (transposed)" : ""));
  g.alpha = ctx.node.attr_float("alpha", 1.0f);
  g.beta = ctx.node.attr_float("beta", 1.0f);
  g.has_c = has_input(ctx, 2);
  if (g.has_c) {
    const KernelInput& c = ctx.inputs[2];
    if (c.dtype != a.dtype) ctx.fail("C is " + dtype_name(c.dtype) + " but A is " + dtype_name(a.dtype));
    // Unidirectional broadcast of C to [M, N]: a dim of 1 (or a missing one) repeats.
    if (c.shape.size() > 2) ctx.fail("C must have rank <= 2, got " + shape_string(c.shape));
    g.c_shape.assign(2 - c.shape.size(), 1);
    g.c_shape.insert(g.c_shape.end(), c.shape.begin(), c.shape.end());
    if ((g.c_shape[0] != 1 && g.c_shape[0] != g.M) || (g.c_shape[1] != 1 && g.c_shape[1] != g.N))
      ctx.fail("C " + shape_string(c.shape) + " does not broadcast to [" + std::to_string(g.M) + "," +
               std::to_string(g.N) + "]");
  }
  set_output(ctx, 0, a.dtype, {g.M, g.N});
  return g;
}

}  // namespace onnxtrain::ops
