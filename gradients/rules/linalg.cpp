// Gradients of the linear-algebra ops: Det.
//
// d det(A) / dA = cof(A), the cofactor matrix: cof(A)[i][j] = (-1)^(i+j) det(A without row i and column j).
// (For invertible A that is det(A) * inverse(A)^T, the usual form; ai.onnx has no inverse, and the cofactor
// form needs none.) It is built from standard ops, Det included: Gather picks the M^2 minors of every matrix
// ([..., M, M] -> [..., M, M, M-1, M-1]), Det takes their determinants, and a constant checkerboard gives the
// signs. So the backward graph stays standard ONNX (no onnxtrain fused op is needed), and singular matrices
// are no special case: the cofactor matrix is the exact derivative of det there too (it is 0 only where the
// rank is below M - 1). The cost is M^2 determinants of size M - 1, O(M^5) per matrix: meant for the small
// matrices Det is used on (2x2 to 4x4 transforms); M must be known statically.
#include <numeric>
#include <string>
#include <vector>

#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

TensorData int64_matrix(int64_t rows, int64_t cols, const std::vector<int64_t>& v) {
  return TensorData::from<int64_t>({rows, cols}, std::span<const int64_t>(v));
}

TensorData like(DType t, std::vector<int64_t> dims, const std::vector<double>& v) {
  if (t == DType::Float32) {
    std::vector<float> f(v.begin(), v.end());
    return TensorData::from<float>(std::move(dims), std::span<const float>(f));
  }
  return TensorData::from<double>(std::move(dims), std::span<const double>(v));
}

// The cofactor matrix of each M x M matrix of a ([..., M, M], rank r).
Expr cofactors(RuleContext& c, const Expr& a, int64_t r, int64_t m) {
  GraphBuilder& b = c.builder();
  const Shape& s = *a.shape();
  if (m == 1) return ones_like(a);  // the 0 x 0 minor has determinant 1
  // others[i] = every index but i, as a [M, M-1] index table.
  std::vector<int64_t> others;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t k = 0; k < m; ++k)
      if (k != i) others.push_back(k);
  Expr idx = constant(b, int64_matrix(m, m - 1, others));
  // Rows: [..., M, M] -> [..., i, M-1, M]; then columns: -> [..., i, M-1, j, M-1].
  Shape rows_shape(s.begin(), s.end() - 2), minors_shape = rows_shape;
  rows_shape.insert(rows_shape.end(), {Dim::of(m), Dim::of(m - 1), Dim::of(m)});
  Expr rows = apply(b, "Gather", {a, idx}, TypeInfo{a.dtype(), rows_shape}, {{"axis", int64_t{r - 2}}});
  Shape both = rows_shape;
  both.push_back(Dim::of(m - 1));
  Expr minors = apply(b, "Gather", {rows, idx}, TypeInfo{a.dtype(), both}, {{"axis", int64_t{r}}});
  // -> [..., i, j, M-1, M-1]
  std::vector<int64_t> perm(r - 2);
  std::iota(perm.begin(), perm.end(), 0);
  perm.insert(perm.end(), {r - 2, r, r - 1, r + 1});
  minors = transpose(minors, perm);
  Shape out(s.begin(), s.end());
  Expr dets = apply(b, "Det", {minors}, TypeInfo{a.dtype(), out});
  std::vector<double> sign(m * m);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < m; ++j) sign[i * m + j] = (i + j) % 2 ? -1.0 : 1.0;
  return dets * constant(b, like(a.dtype(), {m, m}, sign));
}

void det(RuleContext& c) {
  Expr a = c.X(0);
  if (!a.shape()) c.fail("needs the rank of X");
  const auto r = static_cast<int64_t>(a.shape()->size());
  if (r < 2) c.fail("needs X of shape [..., M, M]");
  const Dim& m = (*a.shape())[r - 1];
  if (!m.known()) c.fail("needs the matrix size M (the last dim of X) to be known statically");
  // dY has the batch shape [...]: one value per matrix, broadcast over its M x M cofactors.
  c.set_dX(0, rules::unsqueeze(c.dY(0), {r - 2, r - 1}, c.opset()) * cofactors(c, a, r, m.value));
}

}  // namespace

void register_linalg_rules(GradientRegistry& r) { r.add("Det", det); }

}  // namespace onnxtrain
