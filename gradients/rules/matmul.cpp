// Gradients of MatMul and Gemm.
#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

// [d0, ..., dn-2, dn-1] -> [d0*...*dn-2, dn-1]: folds batch and row dims into one.
Expr flatten_rows(const Expr& x) {
  const Shape& s = *x.shape();
  Dim rows = Dim::of(1);
  for (size_t i = 0; i + 1 < s.size(); ++i)
    rows = rows.known() && s[i].known() ? Dim::of(rows.value * s[i].value) : Dim{};
  return apply(*x.b, "Flatten", {x}, TypeInfo{x.dtype(), Shape{rows, s.back()}},
               {{"axis", static_cast<int64_t>(s.size() - 1)}});
}

void matmul_rule(RuleContext& c) {
  Expr a = c.X(0), b = c.X(1), dy = c.dY(0);
  if (!a.rank() || !b.rank()) c.fail("needs the ranks of both inputs");
  const size_t ra = *a.rank(), rb = *b.rank();
  if (ra == 1 && rb == 1) {
    // y = a . b, a scalar
    if (c.needs_dX(0)) c.set_dX(0, dy * b);
    if (c.needs_dX(1)) c.set_dX(1, dy * a);
  } else if (ra == 1) {
    // a [K] acts as [1, K]: y [..., N] acts as [..., 1, N]
    Expr dy2 = rules::unsqueeze(dy, {-2}, c.opset());
    if (c.needs_dX(0)) c.set_dX(0, rules::squeeze(matmul(dy2, transpose_last2(b)), {-2}, c.opset()));
    if (c.needs_dX(1)) c.set_dX(1, matmul(rules::unsqueeze(a, {1}, c.opset()), dy2));
  } else if (rb == 1) {
    // b [K] acts as [K, 1]: y [..., M] acts as [..., M, 1]
    if (c.needs_dX(0)) c.set_dX(0, rules::unsqueeze(dy, {-1}, c.opset()) * b);
    if (c.needs_dX(1)) {
      Expr a2 = ra == 2 ? a : flatten_rows(a);
      Expr dy1 = ra == 2 ? dy : reshape(dy, int64s(c.builder(), {-1}));
      c.set_dX(1, matmul(transpose_last2(a2), dy1));
    }
  } else {
    if (c.needs_dX(0)) c.set_dX(0, matmul(dy, transpose_last2(b)));
    if (c.needs_dX(1)) {
      // A 2-D weight under a batched input: fold the batch into the rows so no [batch, K, N] intermediate
      // is built and summed away.
      if (rb == 2 && ra > 2)
        c.set_dX(1, matmul(transpose_last2(flatten_rows(a)), flatten_rows(dy)));
      else
        c.set_dX(1, matmul(transpose_last2(a), dy));
    }
  }
}

Expr gemm(RuleContext& c, const Expr& p, const Expr& q, bool trans_p, bool trans_q, double alpha, TypeInfo out) {
  std::map<std::string, Attribute> attrs{{"transA", int64_t{trans_p}}, {"transB", int64_t{trans_q}}};
  if (alpha != 1.0) attrs["alpha"] = static_cast<float>(alpha);
  return apply(c.builder(), "Gemm", {p, q}, std::move(out), std::move(attrs));
}

void gemm_rule(RuleContext& c) {
  // y = alpha * A' B' + beta * C, with A' = transA ? A^T : A and B' likewise.
  const bool ta = c.node().attr_int("transA", 0) != 0, tb = c.node().attr_int("transB", 0) != 0;
  const double alpha = c.node().attr_float("alpha", 1.0f), beta = c.node().attr_float("beta", 1.0f);
  Expr dy = c.dY(0);
  if (c.needs_dX(0)) {
    Expr a = c.X(0), b = c.X(1);
    // dA' = alpha dY B'^T;  dA = dA' (or its transpose, alpha B' dY^T, when transA)
    c.set_dX(0, ta ? gemm(c, b, dy, tb, true, alpha, a.type) : gemm(c, dy, b, false, !tb, alpha, a.type));
  }
  if (c.needs_dX(1)) {
    Expr a = c.X(0), b = c.X(1);
    // dB' = alpha A'^T dY;  dB = dB' (or alpha dY^T A' when transB)
    c.set_dX(1, tb ? gemm(c, dy, a, true, ta, alpha, b.type) : gemm(c, a, dy, !ta, false, alpha, b.type));
  }
  if (c.has_input(2) && c.needs_dX(2)) c.set_dX(2, dy * beta);
}

}  // namespace

void register_matmul_rules(GradientRegistry& r) {
  r.add("MatMul", matmul_rule);
  r.add("Gemm", gemm_rule);
}

}  // namespace onnxtrain
