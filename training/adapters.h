#pragma once
// LoRA adapters (docs/lora.md): a graph rewrite that puts a low-rank trainable update beside each targeted
// frozen weight, so fine-tuning trains rank * (in + out) numbers per weight instead of in * out.
//
// For a weight W used as y = x W (MatMul, Gemm, either directly or through the Transpose that torch's
// nn.Linear export puts in front of it), the rewrite keeps the original node (its output renamed) and adds
//   y = y_base + ((x A) B) * (alpha / rank),   A: [in, rank], B: [rank, out]
// For a Conv weight W [out, in, k...] (group 1), A is a Conv with W's kernel, strides, pads and dilations from
// in to rank channels and B a 1x1 Conv from rank to out channels (peft's Conv LoRA).
// A is Kaiming-uniform as peft initialises it (nn.init.kaiming_uniform_(A, a=sqrt(5)): U(-1/sqrt(fan_in),
// 1/sqrt(fan_in))), drawn from a generator seeded with the spec's seed; B is zero, so the rewritten model
// computes the base model's outputs exactly until B is trained.
#include <cstdint>
#include <string>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain {

struct AdapterSpec {
  std::string kind = "none";  // none | lora
  int64_t rank = 8;
  double alpha = 16;           // the update is scaled by alpha / rank
  // Dropout on the adapter branch's input while training (peft's lora_dropout): the training graph computes
  // ((dropout(x) A) B) * alpha / rank, inference computes ((x A) B) * alpha / rank. In [0, 1).
  double dropout = 0;
  // Initializer names or glob patterns ('*', '?') of the weights to adapt; "all-linear" = every MatMul/Gemm
  // weight. Empty = "all-linear".
  std::vector<std::string> target;
  int64_t seed = 0;  // seeds A's Kaiming-uniform draw and the dropout masks
  bool active() const { return kind != "none"; }
};

// Errors name the key ("adapter.rank") and what was expected.
void validate_adapter(const AdapterSpec& spec);

// One adapted weight. A's and B's names are "<weight>.lora_A" and "<weight>.lora_B".
struct LoraAdapter {
  std::string weight, a, b;
  std::vector<std::string> nodes;  // the nodes that read the weight and now have an adapter branch
};

// Rewrites m.graph in place; returns the adapters added, sorted by weight name. Errors name the target glob
// that matched no usable weight, or the weight and the node it cannot adapt (a Conv with groups, a Gemm with
// transA, a weight that is not an operand of MatMul/Gemm/Conv).
std::vector<LoraAdapter> apply_lora(Model& m, const AdapterSpec& spec);
// The adapters a graph already carries (from apply_lora), sorted by weight name.
std::vector<LoraAdapter> find_lora(const Graph& g);
// The name of the int64 scalar that counts the training steps' dropout draws (state of the training graph).
inline constexpr const char* kLoraDropoutCounter = "lora/dropout/step";
// The seed of the dropout masks of the k-th reader (node order) of an adapted weight: the FNV-1a 64-bit hash of
// "<spec.seed>/<weight>/<k>", as int64. Each branch draws its own masks, as each peft module has its own Dropout.
int64_t lora_dropout_seed(int64_t spec_seed, const std::string& weight, size_t k);
// Adapter dropout for a training graph (the session's; the model and inference graphs never get it): each branch
// of an adapted graph reads dropout(x) instead of x, computed as
//   mask = onnxtrain.DropoutMask(x, counter){ratio, seed},  x' = x * Where(mask, 1 / (1 - ratio), 0)
// with counter the int64 scalar initializer kLoraDropoutCounter (added at 0; the caller advances it after every
// training step). The mask is bool, so gradients flow to x through the Mul only, and nothing reaches the frozen
// weights. Returns the counter's name, or "" when spec.dropout is 0 or the graph has no adapters.
std::string add_lora_dropout(Graph& g, const AdapterSpec& spec);
// Undoes add_lora_dropout (a checkpoint's model holds the training forward): every branch reads x again, the
// DropoutMask, Where and Mul nodes, their constants and the counter go. Returns the counter's value (the
// training steps drawn so far), 0 when the graph had none.
int64_t remove_lora_dropout(Graph& g);
// Folds every adapter into its weight (W += the product of A and B times alpha / rank, in W's layout) and
// removes the adapter nodes and initializers: the result is the plain base architecture with new weights.
// Returns the number of weights changed.
int merge_lora(Model& m);
// The adapters alone, as a small ONNX model: A and B of every adapted weight as initializers (each passed
// through an Identity so the file is a valid model any ONNX tool loads), and the spec in metadata_props.
// `also` names other weights trained in full beside the adapters (a fresh head), stored whole (peft's
// modules_to_save), so that the file alone turns the base into the fine-tuned model.
Model extract_lora(const Model& adapted, const AdapterSpec& spec, const std::vector<std::string>& also = {});
// Applies an adapters file to a base model: the same rewrite as when training, then A and B from the file, and
// the file's whole weights in place of the base's. The result still has the adapters as separate nodes;
// merge_lora folds them. Errors name `source`.
Model apply_lora_file(const Model& base, const Model& adapters, const std::string& source);

}  // namespace onnxtrain
