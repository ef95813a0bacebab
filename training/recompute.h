#pragma once
// The `memory` configuration (docs/memory.md): which forward activations the backward pass recomputes
// instead of keeping them alive from the forward pass. The graph rewrite itself is gradients/recompute.h.
#include <string>
#include <vector>

#include "gradients/recompute.h"
#include "graph/ir.h"

namespace onnxtrain {

struct MemorySpec {
  // memory.recompute: empty or ["none"] keeps every activation (the default); ["auto"] keeps segment
  // boundaries only (gradients/recompute.h); otherwise names or globs ('*', '?') of the forward nodes to recompute.
  std::vector<std::string> recompute;
};

// The policy for a graph (the model plus its loss): globs resolved to node names. Errors name the key
// memory.recompute: "none"/"auto" mixed with other entries, an empty pattern, a pattern that matches no node,
// or one that matches only nodes that are never recomputed (random ops, Dropout, control flow).
RecomputePolicy recompute_policy(const MemorySpec& spec, const Graph& g);

}  // namespace onnxtrain
