#pragma once
// W3's logits are [batch, seq, classes], classes last, while onnxtrain's cross_entropy follows torch's layout
// (classes on axis 1) and LossSpec has no class-axis option. Like the torch peer (logits.reshape(-1, V)), the
// output is flattened to [batch*seq, classes] and the targets are fed as [batch*seq]: the mean over all tokens is
// the same loss. (A Transpose to [batch, classes, seq] would also work, but the loss moves the classes last again
// internally: two transposes for nothing.) Shared by bench_train and the steady-state allocation test.
#include <span>
#include <string>
#include <vector>

#include "graph/builder.h"
#include "graph/error.h"
#include "graph/ir.h"

namespace onnxtrain::bench {

inline void flatten_token_logits(Model& m, const std::string& where) {
  Graph& g = m.graph;
  const ValueInfo out = g.outputs.at(0);
  if (!out.type.shape || out.type.shape->size() != 3 || !out.type.shape->back().known())
    fail(where, "output '" + out.name + "' should be [batch, seq, classes] with a known class count");
  const int64_t classes = out.type.shape->back().value;
  GraphBuilder b(g, "bench/");
  const std::vector<int64_t> dims = {-1, classes};
  const std::string shape = b.constant(TensorData::from<int64_t>({2}, std::span<const int64_t>(dims)), "flat_shape");
  const std::string flat = b.add("Reshape", {out.name, shape});
  g.outputs = {ValueInfo{flat, TypeInfo{out.type.dtype, Shape{Dim{}, Dim::of(classes)}}}};
}

}  // namespace onnxtrain::bench
