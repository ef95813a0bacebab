#pragma once
// Expr: a typed handle on a graph value that makes emitted arithmetic read as arithmetic:
//   Expr dx = dy * (1.0 - y * y);
// Each operation appends standard ONNX nodes through a GraphBuilder and propagates element type and shape
// (symbolic dims included), so the gradient engine can reason about broadcasting without shape inference.
#include <optional>
#include <string>
#include <vector>

#include "graph/builder.h"

namespace onnxtrain {

struct Expr {
  GraphBuilder* b = nullptr;
  std::string name;
  TypeInfo type;

  DType dtype() const { return type.dtype; }
  const std::optional<Shape>& shape() const { return type.shape; }
  std::optional<size_t> rank() const {
    return type.shape ? std::optional<size_t>(type.shape->size()) : std::nullopt;
  }
  bool valid() const { return b != nullptr; }
};

// Wraps an existing value whose type is known to the graph.
Expr value(GraphBuilder& b, const std::string& name);
Expr value(GraphBuilder& b, const std::string& name, TypeInfo t);
Expr scalar(GraphBuilder& b, DType t, double v);
Expr constant(GraphBuilder& b, const TensorData& t);
Expr int64s(GraphBuilder& b, const std::vector<int64_t>& v);  // a 1-D int64 constant

Expr operator+(const Expr& a, const Expr& c);
Expr operator-(const Expr& a, const Expr& c);
Expr operator*(const Expr& a, const Expr& c);
Expr operator/(const Expr& a, const Expr& c);
Expr operator-(const Expr& a);
// Scalars take the dtype of the Expr operand.
Expr operator+(const Expr& a, double c);
Expr operator+(double c, const Expr& a);
Expr operator-(const Expr& a, double c);
Expr operator-(double c, const Expr& a);
Expr operator*(const Expr& a, double c);
Expr operator*(double c, const Expr& a);
Expr operator/(const Expr& a, double c);
Expr operator/(double c, const Expr& a);

Expr exp(const Expr& a);
Expr log(const Expr& a);
Expr sqrt(const Expr& a);
Expr abs(const Expr& a);
Expr sign(const Expr& a);
Expr pow(const Expr& a, const Expr& e);
// ONNX Max of two values (a NaN in either is the result), the graph form of formulas/'s maximum.
Expr maximum(const Expr& a, const Expr& c);
Expr matmul(const Expr& a, const Expr& c);
Expr transpose(const Expr& a, const std::vector<int64_t>& perm);
Expr transpose_last2(const Expr& a);  // swaps the two innermost axes; needs a known rank
Expr reduce_sum(const Expr& a, const std::vector<int64_t>& axes, bool keepdims);
Expr reduce_mean(const Expr& a, const std::vector<int64_t>& axes, bool keepdims);
Expr reduce_sum_all(const Expr& a);  // to a scalar
Expr reduce_mean_all(const Expr& a);
Expr reshape(const Expr& a, const Expr& shape, std::optional<Shape> result_shape = std::nullopt);
Expr reshape_like(const Expr& a, const Expr& like);  // reshape a to like's (runtime) shape
Expr shape_of(const Expr& a);
Expr cast(const Expr& a, DType to);
Expr where(const Expr& cond, const Expr& a, const Expr& c);
Expr less(const Expr& a, const Expr& c);
Expr greater(const Expr& a, const Expr& c);
Expr equal(const Expr& a, const Expr& c);
Expr expand(const Expr& a, const Expr& shape, std::optional<Shape> result_shape = std::nullopt);
// A tensor of a's shape and dtype filled with zeros (or ones).
Expr zeros_like(const Expr& a);
Expr ones_like(const Expr& a);
// Sum of any number of values (one Sum node), same-shape or broadcasting.
Expr sum(const std::vector<Expr>& xs);

// Any other op: out_type is the single output's type (shape nullopt when unknown).
Expr apply(GraphBuilder& b, const std::string& op, const std::vector<Expr>& inputs, TypeInfo out_type,
           std::map<std::string, Attribute> attrs = {}, const std::string& domain = {});
std::vector<Expr> apply_n(GraphBuilder& b, const std::string& op, const std::vector<Expr>& inputs,
                          std::vector<TypeInfo> out_types, std::map<std::string, Attribute> attrs = {},
                          const std::string& domain = {});

// Multidirectional (numpy) broadcast of two shapes; nullopt when a rank is unknown or dims may conflict.
std::optional<Shape> broadcast_shapes(const std::optional<Shape>& a, const std::optional<Shape>& b);

}  // namespace onnxtrain
