#pragma once
// Activation recomputation (docs/memory.md): the backward part of a gradient graph reads copies of selected
// forward nodes, placed in the backward part just before their first reader and fed by the forward values
// that stay kept (the boundaries), instead of the forward values themselves. The forward nodes stay as they
// are, so their outputs die as soon as the forward part has read them, and the graph stays standard ONNX.
// The copies run the same kernels on the same inputs, so the gradients are the same bits.
#include <cstddef>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain {

// Which forward nodes the backward part recomputes.
struct RecomputePolicy {
  enum class Mode { None, Auto, Nodes };
  Mode mode = Mode::None;
  std::set<std::string> nodes;  // Mode::Nodes: forward node names (exact; globs are resolved by the caller)
  bool active() const { return mode != Mode::None; }
};

// A node whose value can be computed a second time with the same result: not a random op, not Dropout (its
// mask is drawn anew each run; its outputs stay kept, mask included), and without subgraphs (control flow,
// whose gradients already recompute their own bodies). Such nodes are always kept.
bool recomputable(const Node& n);

struct RecomputeReport {
  std::vector<std::string> recomputed;  // forward nodes copied into the backward part, by name (or first output)
  std::set<std::string> kept;  // what the backward part still reads of the forward part (inputs, weights included)
};

// Rewrites g, whose nodes [0, n_forward) are the forward part and [first_backward, end) the backward part
// (between them at most the Yield node, which keeps reading the forward values). `on_grad_path` holds the
// values that depend on a differentiated tensor: Mode::Auto recomputes only nodes producing such values.
//
// Mode::Auto: a forward value is a candidate boundary when, right after its node, it is the only value on the
// gradient path that later forward nodes still read (the residual stream between transformer blocks, the
// activation between two layers of an MLP). Of the candidates it keeps one whenever the saved bytes since the
// last kept one reach sqrt(T * c), T being the bytes the backward part would read without recomputation and
// c the median candidate's bytes: the sqrt(n) segmentation of Chen et al. (2016), which balances the kept
// boundaries (about T / sqrt(T c) of them, c bytes each) against one segment's recomputed values. Nodes after
// the last kept boundary are not recomputed: their values are alive when the backward pass starts anyway.
// Nor are narrowing products (MatMul, Gemm, Conv whose contraction K exceeds the output width N): their output is
// smaller than the input they would be recomputed from and holds the most arithmetic per byte (2K flops per
// element), so keeping them (a transformer's FFN down-projection and attention-times-V) buys the most time for
// the least memory.
RecomputeReport apply_recompute(Graph& g, size_t n_forward, size_t first_backward,
                                const std::unordered_set<std::string>& on_grad_path, const RecomputePolicy& policy);

}  // namespace onnxtrain
