#include "executor/plan_fusion.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <unordered_map>

namespace onnxtrain {
namespace {

bool default_domain(const Node& n) { return n.domain.empty() || n.domain == "ai.onnx"; }

bool is_permutation(const std::vector<int64_t>& p) {
  std::vector<bool> seen(p.size(), false);
  for (int64_t v : p) {
    if (v < 0 || v >= static_cast<int64_t>(p.size()) || seen[static_cast<size_t>(v)]) return false;
    seen[static_cast<size_t>(v)] = true;
  }
  return true;
}

// A GEMM reads a matrix whose rows or columns are contiguous: the operand's last dim must come from the
// source's last dim (rows of stride ld) or its second-last dim must (a transposed matrix).
bool gemm_readable(const std::vector<int64_t>& p) {
  const size_t r = p.size();
  const auto last = static_cast<int64_t>(r) - 1;
  return r >= 2 && (p[r - 1] == last || p[r - 2] == last);
}

bool is_identity(const std::vector<int64_t>& p) {
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != static_cast<int64_t>(i)) return false;
  return true;
}

// Transpose(Transpose(x, inner), outer) as one permutation of x: r[k] = inner[outer[k]]. Same sizes only.
std::vector<int64_t> compose(const std::vector<int64_t>& outer, const std::vector<int64_t>& inner) {
  std::vector<int64_t> r(outer.size());
  for (size_t k = 0; k < outer.size(); ++k) r[k] = inner[static_cast<size_t>(outer[k])];
  return r;
}

std::vector<int64_t> identity(size_t r) {
  std::vector<int64_t> p(r);
  std::iota(p.begin(), p.end(), 0);
  return p;
}

struct Source {
  std::string value;
  std::vector<int64_t> perm;  // operand = Transpose(value, perm)
};

bool is_node(const Node& n, const char* domain, const char* op, size_t inputs) {
  const bool dom = domain[0] ? n.domain == domain : default_domain(n);
  return dom && n.op_type == op && n.inputs.size() == inputs && n.outputs.size() == 1 && !n.outputs[0].empty() &&
         std::none_of(n.inputs.begin(), n.inputs.end(), [](const std::string& i) { return i.empty(); });
}

// The permutation of a Transpose node with one input and one output and an explicit, valid perm.
const std::vector<int64_t>* perm_of(const Node& n) {
  if (!is_node(n, "", "Transpose", 1)) return nullptr;
  auto it = n.attributes.find("perm");
  if (it == n.attributes.end()) return nullptr;
  const auto* p = std::get_if<std::vector<int64_t>>(&it->second);
  return p && is_permutation(*p) ? p : nullptr;
}

// A whole-shape Shape node (no start/end), perhaps already permuted.
bool is_plain_shape(const Node& n) {
  return is_node(n, "", "Shape", 1) && !n.has_attr("start") && !n.has_attr("end");
}

// Which node makes each value, and how many nodes read it; `keep` values count as read forever.
struct Uses {
  std::unordered_map<std::string, size_t> producer;
  std::unordered_map<std::string, int64_t> readers;
};
Uses index_uses(const std::vector<Node>& nodes, const std::vector<std::string>& keep) {
  Uses u;
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (const std::string& o : nodes[i].outputs)
      if (!o.empty()) u.producer[o] = i;
    for (const std::string& in : nodes[i].inputs)
      if (!in.empty()) ++u.readers[in];
  }
  for (const std::string& k : keep) u.readers[k] += 1 << 20;
  return u;
}

// Transpose(SumToShape(g, Shape(x)), p) -> SumToShape(Transpose(g, p), Shape(x) permuted by p), in place of the
// SumToShape; the Transpose keeps its name and the SumToShape's, and the new values get fresh names. Returns
// the number of Transposes moved.
size_t hoist_transposes_over_sum_to_shape(std::vector<Node>& nodes, const std::vector<std::string>& keep,
                                          const Graph* types) {
  if (!types) return 0;
  // Named members, not a structured binding: clang 14 (the sanitizer build) cannot capture bindings in lambdas.
  Uses uses = index_uses(nodes, keep);
  std::unordered_map<std::string, size_t>& producer = uses.producer;
  std::unordered_map<std::string, int64_t>& readers = uses.readers;
  auto made_by = [&](const std::string& v) -> const Node* {
    auto it = producer.find(v);
    return it == producer.end() ? nullptr : &nodes[it->second];
  };
  std::unordered_map<size_t, std::vector<Node>> replace;  // SumToShape index -> the nodes taking its place
  std::vector<bool> drop(nodes.size(), false);
  for (size_t ti = 0; ti < nodes.size(); ++ti) {
    const std::vector<int64_t>* p = perm_of(nodes[ti]);
    if (!p) continue;
    auto si = producer.find(nodes[ti].inputs[0]);
    if (si == producer.end() || replace.count(si->second) || readers[nodes[ti].inputs[0]] != 1) continue;
    const Node& sum = nodes[si->second];
    if (!is_node(sum, "onnxtrain", "SumToShape", 2)) continue;
    const Node* shape = made_by(sum.inputs[1]);
    const TypeInfo* g = types->type_of(sum.inputs[0]);
    if (!shape || !is_plain_shape(*shape) || !g || !g->shape || g->shape->size() != p->size()) continue;
    // Shape(x) read through p: compose with a permutation the Shape node already applies.
    std::vector<int64_t> sp = *p;
    if (auto it = shape->attributes.find(kShapePerm); it != shape->attributes.end()) {
      const auto& q = std::get<std::vector<int64_t>>(it->second);
      if (q.size() != p->size()) continue;
      sp = compose(*p, q);
    }
    const std::string base = nodes[ti].outputs[0];
    Node t = nodes[ti];
    t.inputs = {sum.inputs[0]};
    t.outputs = {base + "/onnxtrain.hoisted"};
    Node sh;
    sh.name = shape->name + "/onnxtrain.permuted";
    sh.op_type = "Shape";
    sh.inputs = shape->inputs;
    sh.outputs = {base + "/onnxtrain.shape"};
    sh.attributes[kShapePerm] = std::move(sp);
    Node st = sum;
    st.inputs = {t.outputs[0], sh.outputs[0]};
    st.outputs = {base};
    replace[si->second] = {std::move(t), std::move(sh), std::move(st)};
    drop[ti] = true;
  }
  if (replace.empty()) return 0;
  std::vector<Node> out;
  out.reserve(nodes.size() + 2 * replace.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (auto it = replace.find(i); it != replace.end())
      for (Node& n : it->second) out.push_back(std::move(n));
    else if (!drop[i])
      out.push_back(std::move(nodes[i]));
  }
  nodes = std::move(out);
  return replace.size();
}

// Cast and Transpose commute (each element is converted on its own). Mixed precision puts a Cast between a MatMul
// and the Transpose that torch's nn.Linear export writes: Transpose(W) -> Cast -> MatMul forward, and in the
// backward MatMul -> Cast -> Transpose for the weight's gradient, which keeps those Transposes from folding.
// Swapped, the Transpose sits next to the MatMul:
//   Cast(Transpose(x, p)), the Transpose read only by the Cast, the Cast by MatMuls (and Transposes, such as the
//   backward's W^T, which then read a chain the Folder composes) -> Transpose(Cast(x), p);
//   Transpose(Cast(y), p), y a MatMul's output read only by the Cast, the Cast only by it -> Cast(Transpose(y, p)).
// The swapped pair keeps the positions of the original (so the order stays topological) and the outer names.
size_t commute_casts_with_transposes(std::vector<Node>& nodes, const std::vector<std::string>& keep) {
  auto is_cast = [](const Node& n) { return is_node(n, "", "Cast", 1); };
  auto is_matmul = [](const Node& n) { return is_node(n, "", "MatMul", 2); };
  size_t swapped = 0;
  for (int pattern = 0; pattern < 2; ++pattern) {
    Uses u = index_uses(nodes, keep);
    std::unordered_map<std::string, std::vector<size_t>> read_by;
    for (size_t i = 0; i < nodes.size(); ++i)
      for (const std::string& in : nodes[i].inputs) read_by[in].push_back(i);
    auto made_by = [&](const std::string& v) -> std::optional<size_t> {
      auto it = u.producer.find(v);
      return it == u.producer.end() ? std::nullopt : std::optional<size_t>(it->second);
    };
    std::vector<bool> touched(nodes.size(), false);
    for (size_t second = 0; second < nodes.size(); ++second) {
      Node& outer = nodes[second];
      const bool wanted = pattern == 0 ? is_cast(outer) : perm_of(outer) != nullptr;
      if (!wanted || touched[second]) continue;
      const std::optional<size_t> first = made_by(outer.inputs[0]);
      if (!first || touched[*first] || u.readers[outer.inputs[0]] != 1) continue;
      Node& inner = nodes[*first];
      if (pattern == 0) {  // Cast(Transpose(x)) read by MatMuls only
        if (!perm_of(inner)) continue;
        const std::vector<size_t>& readers = read_by[outer.outputs[0]];
        // Transposes among the readers (the backward's W^T) then read a chain of two, which the Folder composes.
        if (readers.empty() || u.readers[outer.outputs[0]] != static_cast<int64_t>(readers.size()) ||
            !std::all_of(readers.begin(), readers.end(),
                         [&](size_t r) { return is_matmul(nodes[r]) || perm_of(nodes[r]) != nullptr; }) ||
            std::none_of(readers.begin(), readers.end(), [&](size_t r) { return is_matmul(nodes[r]); }))
          continue;
      } else {  // Transpose(Cast(MatMul output read only by the Cast))
        if (!is_cast(inner)) continue;
        const std::optional<size_t> product = made_by(inner.inputs[0]);
        if (!product || !is_matmul(nodes[*product]) || u.readers[inner.inputs[0]] != 1) continue;
      }
      Node moved_in = outer, moved_out = inner;
      moved_in.inputs = inner.inputs;
      moved_in.outputs = {outer.outputs[0] + "/onnxtrain.commuted"};
      moved_out.inputs = moved_in.outputs;
      moved_out.outputs = outer.outputs;
      nodes[*first] = std::move(moved_in);
      nodes[second] = std::move(moved_out);
      touched[*first] = touched[second] = true;
      ++swapped;
    }
  }
  return swapped;
}

class Folder {
 public:
  Folder(std::vector<Node>& nodes, const std::vector<std::string>& keep, const Graph* types)
      : nodes_(nodes), types_(types), dead_(nodes.size(), false) {
    Uses u = index_uses(nodes_, keep);
    producer_ = std::move(u.producer);
    readers_ = std::move(u.readers);
  }

  size_t run() {
    for (Node& n : nodes_)
      if (is_matmul(n) && !n.has_attr(kMatMulPermA) && !n.has_attr(kMatMulPermB)) {
        fold_operand(n, 0, kMatMulPermA);
        fold_operand(n, 1, kMatMulPermB);
      }
    size_t removed = 0;
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (is_matmul(nodes_[i]) && !nodes_[i].has_attr(kMatMulPermY) && absorb_output_transpose(i)) ++removed;
    // After the outputs are absorbed: a Shape reading an absorbed Transpose's output must not become a second
    // reader of the product, which would have kept the Transpose.
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (!dead_[i] && is_plain_shape(nodes_[i])) shape_through_transposes(nodes_[i]);
    // Transposes that no longer have readers, last first so that chains die back to front.
    for (size_t i = nodes_.size(); i-- > 0;) {
      const Node& n = nodes_[i];
      if (dead_[i] || !perm_of(n) || readers_[n.outputs[0]] != 0) continue;
      dead_[i] = true;
      --readers_[n.inputs[0]];
      ++removed;
    }
    if (removed == 0) return 0;
    std::vector<Node> kept;
    kept.reserve(nodes_.size() - removed);
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (!dead_[i]) kept.push_back(std::move(nodes_[i]));
    nodes_ = std::move(kept);
    return removed;
  }

 private:
  static bool is_matmul(const Node& n) {
    return default_domain(n) && n.op_type == "MatMul" && n.inputs.size() == 2 && n.outputs.size() == 1 &&
           !n.inputs[0].empty() && !n.inputs[1].empty();
  }


  const std::vector<int64_t>* produced_by_transpose(const std::string& v, std::string* input) const {
    auto it = producer_.find(v);
    if (it == producer_.end() || dead_[it->second]) return nullptr;
    const Node& t = nodes_[it->second];
    const std::vector<int64_t>* p = perm_of(t);
    if (p) *input = t.inputs[0];
    return p;
  }

  // The deepest value of a chain of Transposes ending in v that a GEMM can read through the chain's composed
  // permutation.
  std::optional<Source> source_of(const std::string& v) const {
    std::string src;
    const std::vector<int64_t>* p = produced_by_transpose(v, &src);
    if (!p) return std::nullopt;
    std::vector<int64_t> c = *p;
    std::optional<Source> best;
    if (gemm_readable(c)) best = Source{src, c};
    std::string next;
    while (const std::vector<int64_t>* q = produced_by_transpose(src, &next)) {
      if (q->size() != c.size()) break;
      c = compose(c, *q);
      src = next;
      if (gemm_readable(c)) best = Source{src, c};
    }
    return best;
  }

  void set_operand(Node& n, size_t i, const char* attr, Source s) {
    --readers_[n.inputs[i]];
    ++readers_[s.value];
    n.inputs[i] = s.value;
    if (is_identity(s.perm)) n.attributes.erase(attr);
    else n.attributes[attr] = std::move(s.perm);
  }

  // Shape(Transpose(x, p)) -> Shape(x) read through p (composed with a permutation it already applies), down a
  // whole chain of Transposes.
  void shape_through_transposes(Node& n) {
    std::string src;
    while (const std::vector<int64_t>* p = produced_by_transpose(n.inputs[0], &src)) {
      std::vector<int64_t> c = *p;
      if (auto it = n.attributes.find(kShapePerm); it != n.attributes.end()) {
        const auto& q = std::get<std::vector<int64_t>>(it->second);
        if (q.size() != c.size()) return;
        c = compose(q, *p);
      }
      --readers_[n.inputs[0]];
      ++readers_[src];
      n.inputs[0] = src;
      if (is_identity(c)) n.attributes.erase(kShapePerm);
      else n.attributes[kShapePerm] = std::move(c);
    }
  }

  void fold_operand(Node& n, size_t i, const char* attr) {
    if (auto s = source_of(n.inputs[i])) set_operand(n, i, attr, std::move(*s));
  }

  // The rank of MatMul operand i when it is known from the graph alone (0 otherwise).
  size_t operand_rank(const Node& n, size_t i, const char* attr) const {
    if (auto it = n.attributes.find(attr); it != n.attributes.end())
      return std::get<std::vector<int64_t>>(it->second).size();
    auto p = producer_.find(n.inputs[i]);
    if (p != producer_.end() && default_domain(nodes_[p->second]) && nodes_[p->second].op_type == "Flatten") return 2;
    if (const TypeInfo* t = types_ ? types_->type_of(n.inputs[i]) : nullptr; t && t->shape) return t->shape->size();
    return 0;
  }

  // MatMul(A, B) read only by a Transpose writes the Transpose's output directly: in permuted order when the
  // perm keeps the last dim last (kMatMulPermY), else, when it moves the second-last dim last, as
  // MatMul(B^T, A^T) (then permuted as needed). Both operands must be matrices (rank >= 2): numpy's 1-D rules do
  // not commute this way.
  bool absorb_output_transpose(size_t mi) {
    Node& m = nodes_[mi];
    const std::string out = m.outputs[0];
    if (readers_[out] != 1) return false;
    const size_t ra = operand_rank(m, 0, kMatMulPermA), rb = operand_rank(m, 1, kMatMulPermB);
    if (ra < 2 || rb < 2) return false;
    size_t ti = 0;
    bool found = false;
    for (size_t j = mi + 1; j < nodes_.size() && !found; ++j)
      if (!dead_[j])
        for (const std::string& in : nodes_[j].inputs)
          if (in == out) {
            ti = j;
            found = true;
          }
    if (!found) return false;
    const std::vector<int64_t>* p = perm_of(nodes_[ti]);
    if (!p || p->size() != std::max(ra, rb)) return false;
    const size_t r = p->size();
    const bool swap = (*p)[r - 1] == static_cast<int64_t>(r) - 2;
    if (!swap && (*p)[r - 1] != static_cast<int64_t>(r) - 1) return false;
    // Y = Transpose(Y^T, s) with s swapping the last two dims, so out = Transpose(Y^T, s∘p).
    std::vector<int64_t> perm_y = *p;
    if (swap)
      for (int64_t& v : perm_y)
        if (v >= static_cast<int64_t>(r) - 2) v = 2 * static_cast<int64_t>(r) - 3 - v;
    if (swap) swap_operands(m, ra, rb);
    if (!is_identity(perm_y)) m.attributes[kMatMulPermY] = std::move(perm_y);
    m.outputs[0] = nodes_[ti].outputs[0];
    producer_[m.outputs[0]] = mi;
    producer_.erase(out);
    readers_[out] = 0;
    dead_[ti] = true;
    return true;
  }

  // MatMul(A, B) -> MatMul(B^T, A^T), which computes Y^T.
  static void swap_operands(Node& m, size_t ra, size_t rb) {
    auto swapped = [&](size_t i, const char* attr, size_t rank) {
      auto it = m.attributes.find(attr);
      std::vector<int64_t> perm = it != m.attributes.end() ? std::get<std::vector<int64_t>>(it->second) : identity(rank);
      std::swap(perm[rank - 1], perm[rank - 2]);
      return Source{m.inputs[i], std::move(perm)};
    };
    Source a = swapped(1, kMatMulPermB, rb), b = swapped(0, kMatMulPermA, ra);
    // The new operands read the same values as before: the reader counts do not change.
    m.inputs = {a.value, b.value};
    m.attributes.erase(kMatMulPermA);
    m.attributes.erase(kMatMulPermB);
    if (!is_identity(a.perm)) m.attributes[kMatMulPermA] = std::move(a.perm);
    if (!is_identity(b.perm)) m.attributes[kMatMulPermB] = std::move(b.perm);
  }

  std::vector<Node>& nodes_;
  const Graph* types_;
  std::unordered_map<std::string, size_t> producer_;
  std::unordered_map<std::string, int64_t> readers_;
  std::vector<bool> dead_;
};

}  // namespace

size_t fold_transposes_into_matmuls(std::vector<Node>& nodes, const std::vector<std::string>& keep,
                                    const Graph* types) {
  for (const Node& n : nodes)
    for (const auto& [name, a] : n.attributes)
      if (std::holds_alternative<std::shared_ptr<Graph>>(a)) return 0;
  hoist_transposes_over_sum_to_shape(nodes, keep, types);
  commute_casts_with_transposes(nodes, keep);
  return Folder(nodes, keep, types).run();
}

}  // namespace onnxtrain
