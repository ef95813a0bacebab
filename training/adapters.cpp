#include "training/adapters.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "graph/builder.h"
#include "graph/error.h"
#include "graph/shape_inference.h"
#include "optimizers/optimizer.h"  // glob_match, shared with parameter groups and the CLI's trainable globs
#include "training/checkpoint.h"

namespace onnxtrain {

namespace {

constexpr const char* kAllLinear = "all-linear";

bool is_lora_tensor(const std::string& name) {
  auto ends = [&](const std::string& s) { return name.size() > s.size() && name.ends_with(s); };
  return ends(".lora_A") || ends(".lora_B");
}

std::string scale_name(const std::string& w) { return "lora/" + w + "/scale"; }

// How a node reads a weight W.
struct Use {
  size_t node = 0;
  bool conv = false;
  bool transposed = false;  // linear: W is [out, in] (nn.Linear's layout, reached through Transpose or transB)
  double gemm_alpha = 1;    // a Gemm scales x W by alpha, so a merged update is divided by it
};

// Every use of W as the right operand of MatMul/Gemm (directly or through a 2D Transpose) or as a Conv kernel.
// `error` is set when W also feeds something the rewrite cannot adapt (the message names the node); `weight_like`
// says whether W feeds MatMul/Gemm/Conv/Transpose at all (a bias matched by a glob does not).
struct Uses {
  std::vector<Use> uses;
  std::string error;
  bool weight_like = false;
};

bool is_2d_transpose(const Node& n, const TensorData& w) {
  if (n.op_type != "Transpose" || !n.domain.empty() || w.dims.size() != 2) return false;
  std::vector<int64_t> perm = n.attr_ints("perm", {1, 0});
  return perm == std::vector<int64_t>{1, 0};
}

Uses find_uses(const Graph& g, const std::string& w) {
  Uses r;
  const TensorData& t = g.initializers.at(w);
  auto bad = [&](const Node& n, const std::string& why) {
    if (r.error.empty()) r.error = "weight '" + w + "' " + why + " (" + n.describe() + ")";
  };
  auto linear = [&](size_t i, size_t slot, bool through_transpose) {
    const Node& n = g.nodes[i];
    if (slot != 1) return bad(n, "is the left operand; only x W is adapted");
    if (t.dims.size() != 2) return bad(n, "is not a matrix (rank " + std::to_string(t.dims.size()) + ")");
    bool transposed = through_transpose;
    double alpha = 1;
    if (n.op_type == "Gemm") {
      if (n.attr_int("transA", 0) != 0) return bad(n, "is read by a Gemm with transA=1, which is not supported");
      if (n.attr_int("transB", 0) != 0) transposed = !transposed;
      alpha = n.attr_float("alpha", 1.0f);
      if (alpha == 0 || !std::isfinite(alpha)) return bad(n, "is read by a Gemm with alpha " + std::to_string(alpha));
    }
    r.uses.push_back({i, false, transposed, alpha});
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    for (size_t slot = 0; slot < n.inputs.size(); ++slot) {
      if (n.inputs[slot] != w) continue;
      // A Gemm's C or a Conv's bias: not a weight the rewrite is about (a glob like "fc1.*" matches it too).
      if (n.domain.empty() && slot == 2 && (n.op_type == "Gemm" || n.op_type == "Conv")) continue;
      const bool mm = n.domain.empty() && (n.op_type == "MatMul" || n.op_type == "Gemm");
      if (mm) {
        r.weight_like = true;
        linear(i, slot, false);
      } else if (n.domain.empty() && n.op_type == "Conv") {
        r.weight_like = true;
        if (slot != 1) bad(n, "is not the Conv's kernel");
        else if (n.attr_int("group", 1) != 1) bad(n, "is the kernel of a grouped Conv, which is not supported");
        else if (t.dims.size() < 3) bad(n, "is not a Conv kernel of rank >= 3");
        else r.uses.push_back({i, true, false});
      } else if (is_2d_transpose(n, t)) {
        r.weight_like = true;
        // nn.Linear as torch exports it: MatMul(x, Transpose(W)). Every reader of the transpose must be one.
        for (size_t j = i + 1; j < g.nodes.size(); ++j)
          for (size_t s = 0; s < g.nodes[j].inputs.size(); ++s)
            if (g.nodes[j].inputs[s] == n.outputs[0]) {
              const Node& m = g.nodes[j];
              if (m.domain.empty() && (m.op_type == "MatMul" || m.op_type == "Gemm")) linear(j, s, true);
              else bad(m, "is read through " + n.describe() + " by an op that is not MatMul or Gemm");
            }
        for (const ValueInfo& o : g.outputs)
          if (o.name == n.outputs[0]) bad(n, "is transposed into a graph output");
      } else {
        bad(n, "is also read by " + n.op_type + ", which an adapter would not follow (tied weights?)");
      }
    }
  }
  for (const ValueInfo& o : g.outputs)
    if (o.name == w && r.error.empty()) r.error = "weight '" + w + "' is a graph output";
  // Readers through a Transpose were found from the Transpose: in node order, the first use is where the shared
  // scale constant goes, before every branch that reads it.
  std::sort(r.uses.begin(), r.uses.end(), [](const Use& a, const Use& b) { return a.node < b.node; });
  if (r.error.empty() && !r.uses.empty()) {
    for (const Use& u : r.uses)
      if (u.conv != r.uses[0].conv || u.transposed != r.uses[0].transposed || u.gemm_alpha != r.uses[0].gemm_alpha)
        r.error = "weight '" + w + "' is read in two layouts or Gemm alphas (" +
                  g.nodes[r.uses[0].node].describe() + " and " +
                  g.nodes[u.node].describe() + "); one adapter cannot serve both";
  }
  return r;
}

template <class T> void fill_uniform(TensorData& t, double bound, std::mt19937_64& gen) {
  std::uniform_real_distribution<double> u(-bound, bound);
  for (T& v : t.as_mut<T>()) v = static_cast<T>(u(gen));
}

TensorData zeros(DType dt, std::vector<int64_t> dims) {
  TensorData t;
  t.dtype = dt;
  t.dims = std::move(dims);
  t.bytes.assign(static_cast<size_t>(t.numel()) * dtype_size(dt), std::byte{0});
  return t;
}

std::string dims_text(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

std::string list(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The weights the spec's targets select, sorted; errors name the glob.
std::vector<std::string> select_targets(const Graph& g, const AdapterSpec& spec) {
  std::vector<std::string> targets = spec.target.empty() ? std::vector<std::string>{kAllLinear} : spec.target;
  std::vector<std::string> floats;
  for (const auto& [name, t] : g.initializers)
    if (is_floating(t.dtype) && !is_lora_tensor(name)) floats.push_back(name);
  std::set<std::string> chosen;
  for (const std::string& pat : targets) {
    size_t found = 0;
    if (pat == kAllLinear) {
      for (const std::string& w : floats) {
        Uses u = find_uses(g, w);
        // Tied or otherwise shared weights are left alone here; naming one explicitly reports why.
        if (!u.uses.empty() && !u.uses[0].conv && u.error.empty()) chosen.insert(w), ++found;
      }
      if (!found) fail("adapter.target 'all-linear'", "the model has no MatMul/Gemm weight to adapt");
      continue;
    }
    std::vector<std::string> matched;
    for (const std::string& w : floats) {
      if (!glob_match(pat, w)) continue;
      matched.push_back(w);
      Uses u = find_uses(g, w);
      if (!u.weight_like) continue;  // a bias or norm scale matched by a broad glob
      if (!u.error.empty()) fail("adapter.target '" + pat + "'", u.error);
      if (u.uses.empty()) continue;
      chosen.insert(w);
      ++found;
    }
    if (!found) {
      // torch.onnx.export's constant folding turns Transpose(W) into a new initializer named onnx::MatMul_N.
      const bool folded = std::any_of(floats.begin(), floats.end(),
                                      [](const std::string& n) { return n.rfind("onnx::MatMul_", 0) == 0; });
      const std::string hint = folded ? " (initializers named onnx::MatMul_N are nn.Linear weights that "
                                        "torch.onnx.export transposed and renamed: export with "
                                        "do_constant_folding=False to keep their names)"
                                      : "";
      fail("adapter.target '" + pat + "'",
           matched.empty() ? "matches no floating-point initializer; they are: " + list(floats) + hint
                           : "matches no MatMul/Gemm/Conv weight (it matches " + list(matched) + ")");
    }
  }
  return {chosen.begin(), chosen.end()};
}

}  // namespace

void validate_adapter(const AdapterSpec& s) {
  if (s.kind != "none" && s.kind != "lora") fail("adapter.kind", "expected 'none' or 'lora', got '" + s.kind + "'");
  if (!s.active()) return;
  if (s.rank < 1) fail("adapter.rank", "expected an integer >= 1, got " + std::to_string(s.rank));
  if (!std::isfinite(s.alpha) || s.alpha <= 0)
    fail("adapter.alpha", "expected a finite number > 0, got " + std::to_string(s.alpha));
  if (!(s.dropout >= 0 && s.dropout < 1))
    fail("adapter.dropout", "expected a number in [0, 1), got " + std::to_string(s.dropout));
  if (s.seed < 0) fail("adapter.seed", "expected an integer >= 0, got " + std::to_string(s.seed));
}

std::vector<LoraAdapter> apply_lora(Model& m, const AdapterSpec& spec) {
  validate_adapter(spec);
  if (!spec.active()) return {};
  Graph& g = m.graph;
  const std::vector<std::string> weights = select_targets(g, spec);
  std::mt19937_64 gen(static_cast<uint64_t>(spec.seed));
  const double scale = spec.alpha / static_cast<double>(spec.rank);
  std::map<size_t, std::vector<Node>> after;  // node index -> the adapter branch that follows it
  std::vector<LoraAdapter> out;
  for (const std::string& w : weights) {
    const Uses uses = find_uses(g, w);
    if (!uses.error.empty()) fail("adapter", uses.error);
    const TensorData wt = g.initializers.at(w);
    if (wt.dtype != DType::Float32 && wt.dtype != DType::Float64)
      fail("adapter", "weight '" + w + "' is " + dtype_name(wt.dtype) + "; LoRA adapts float32 and float64 weights");
    const Use& first = uses.uses.front();
    const int64_t r = spec.rank;
    LoraAdapter ad{w, w + ".lora_A", w + ".lora_B", {}};
    for (const std::string& n : {ad.a, ad.b})
      if (g.initializers.count(n)) fail("adapter", "weight '" + w + "' already has an initializer '" + n + "'");
    TensorData a, b;
    int64_t fan_in = 0;
    if (first.conv) {
      const int64_t out_ch = wt.dims[0], in_ch = wt.dims[1];
      std::vector<int64_t> ad_dims = wt.dims, bd_dims(wt.dims.size(), 1);
      ad_dims[0] = r;
      bd_dims[0] = out_ch;
      bd_dims[1] = r;
      fan_in = in_ch;
      for (size_t k = 2; k < wt.dims.size(); ++k) fan_in *= wt.dims[k];
      a = zeros(wt.dtype, ad_dims);
      b = zeros(wt.dtype, bd_dims);
    } else {
      const int64_t in = first.transposed ? wt.dims[1] : wt.dims[0];
      const int64_t outd = first.transposed ? wt.dims[0] : wt.dims[1];
      fan_in = in;
      a = zeros(wt.dtype, {in, r});
      b = zeros(wt.dtype, {r, outd});
    }
    // kaiming_uniform_(a=sqrt(5)): gain sqrt(2 / (1 + 5)), bound = gain * sqrt(3 / fan_in) = 1 / sqrt(fan_in).
    const double bound = 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(fan_in, 1)));
    if (wt.dtype == DType::Float32) fill_uniform<float>(a, bound, gen);
    else fill_uniform<double>(a, bound, gen);
    g.initializers[ad.a] = std::move(a);
    g.initializers[ad.b] = std::move(b);

    GraphBuilder bld(g, "lora/" + w + "/");
    const size_t before = g.nodes.size();
    const std::string s = bld.constant(TensorData::scalar_as(wt.dtype, scale), "scale");
    if (s != scale_name(w)) fail("adapter", "the name '" + scale_name(w) + "' is already used in the model");
    std::vector<Node> prelude(g.nodes.begin() + static_cast<std::ptrdiff_t>(before), g.nodes.end());
    g.nodes.resize(before);
    for (const Use& u : uses.uses) {
      Node& base = g.nodes[u.node];  // not used after the builder appends (g.nodes may reallocate)
      ad.nodes.push_back(base.name.empty() ? base.op_type : base.name);
      const std::string x = base.inputs[0], y = base.outputs[0];
      const std::string y_base = bld.unique_name("base");
      base.outputs[0] = y_base;
      if (auto it = g.value_info.find(y); it != g.value_info.end()) g.value_info[y_base] = it->second;
      std::map<std::string, Attribute> attrs;
      for (const char* k : {"auto_pad", "dilations", "kernel_shape", "pads", "strides"})
        if (auto it = base.attributes.find(k); it != base.attributes.end()) attrs[k] = it->second;
      std::string xb;
      if (u.conv) {
        xb = bld.add("Conv", {bld.add("Conv", {x, ad.a}, attrs), ad.b});
      } else {
        xb = bld.add("MatMul", {bld.add("MatMul", {x, ad.a}), ad.b});
      }
      bld.add_node("Add", {y_base, bld.add("Mul", {xb, s})}, 1, {}, {}, {y});
      std::vector<Node>& branch = after[u.node];
      if (&u == &uses.uses.front()) branch.insert(branch.end(), prelude.begin(), prelude.end());
      branch.insert(branch.end(), g.nodes.begin() + static_cast<std::ptrdiff_t>(before), g.nodes.end());
      g.nodes.resize(before);
    }
    out.push_back(std::move(ad));
  }
  // Each branch goes right after the node it adds to, which keeps the node list topologically ordered.
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    nodes.push_back(std::move(g.nodes[i]));
    if (auto it = after.find(i); it != after.end())
      for (Node& n : it->second) nodes.push_back(std::move(n));
  }
  g.nodes = std::move(nodes);
  // The gradient builder follows floating-point values only, so the branch's values need their types.
  infer_shapes(m);
  return out;
}

int64_t lora_dropout_seed(int64_t spec_seed, const std::string& weight, size_t k) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a 64
  for (char c : std::to_string(spec_seed) + "/" + weight + "/" + std::to_string(k))
    h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return static_cast<int64_t>(h);
}

std::string add_lora_dropout(Graph& g, const AdapterSpec& spec) {
  if (!spec.active() || spec.dropout == 0) return "";
  const std::vector<LoraAdapter> adapters = find_lora(g);
  if (adapters.empty()) return "";
  const std::string counter = kLoraDropoutCounter;
  if (g.initializers.count(counter) || g.value_info.count(counter))
    fail("adapter.dropout", "the name '" + counter + "' is already used in the model");
  g.initializers[counter] = TensorData::scalar<int64_t>(0);
  std::map<size_t, std::vector<Node>> before;  // node index -> the dropout nodes that go right before it
  std::map<DType, std::pair<std::string, std::string>> constants;  // dtype -> (1 / (1 - ratio), 0)
  std::vector<Node> prelude;
  for (const LoraAdapter& ad : adapters) {
    const DType dt = g.initializers.at(ad.a).dtype;
    GraphBuilder bld(g, "lora/" + ad.weight + "/dropout/");
    size_t k = 0;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      if (!n.domain.empty() || (n.op_type != "MatMul" && n.op_type != "Conv") || n.inputs.size() < 2 ||
          n.inputs[1] != ad.a)
        continue;
      const size_t start = g.nodes.size();
      if (!constants.count(dt)) {
        GraphBuilder cb(g, "lora/dropout/");
        constants[dt] = {cb.constant(TensorData::scalar_as(dt, 1.0 / (1.0 - spec.dropout)), "scale"),
                         cb.constant(TensorData::scalar_as(dt, 0.0), "zero")};
        prelude.insert(prelude.end(), g.nodes.begin() + static_cast<std::ptrdiff_t>(start), g.nodes.end());
        g.nodes.resize(start);
      }
      const std::string x = g.nodes[i].inputs[0];
      const TypeInfo* xt = g.type_of(x);
      const std::optional<Shape> shape = xt ? xt->shape : std::nullopt;
      std::map<std::string, Attribute> attrs;
      attrs["ratio"] = static_cast<float>(spec.dropout);
      attrs["seed"] = lora_dropout_seed(spec.seed, ad.weight, k++);
      const std::string mask = bld.add("DropoutMask", {x, counter}, attrs, "onnxtrain");
      const std::string keep = bld.add("Where", {mask, constants[dt].first, constants[dt].second});
      const std::string xd = bld.add("Mul", {x, keep});
      bld.set_type(mask, TypeInfo{DType::Bool, shape});
      bld.set_type(keep, TypeInfo{dt, shape});
      bld.set_type(xd, TypeInfo{dt, shape});
      std::vector<Node>& nodes = before[i];
      nodes.insert(nodes.end(), g.nodes.begin() + static_cast<std::ptrdiff_t>(start), g.nodes.end());
      g.nodes.resize(start);
      g.nodes[i].inputs[0] = xd;
    }
  }
  std::vector<Node> nodes = std::move(prelude);
  nodes.reserve(nodes.size() + g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (auto it = before.find(i); it != before.end())
      for (Node& n : it->second) nodes.push_back(std::move(n));
    nodes.push_back(std::move(g.nodes[i]));
  }
  g.nodes = std::move(nodes);
  return counter;
}

int64_t remove_lora_dropout(Graph& g) {
  int64_t steps = 0;
  if (auto it = g.initializers.find(kLoraDropoutCounter); it != g.initializers.end()) {
    if (it->second.dtype != DType::Int64 || it->second.numel() != 1 || it->second.bytes.size() != sizeof(int64_t))
      fail("adapter.dropout", std::string("'") + kLoraDropoutCounter + "' is not an int64 scalar");
    std::memcpy(&steps, it->second.bytes.data(), sizeof steps);
    g.initializers.erase(it);
  }
  std::map<std::string, std::string> back;  // x' -> x
  std::set<size_t> drop;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& m = g.nodes[i];
    if (m.domain != "onnxtrain" || m.op_type != "DropoutMask" || m.inputs.empty() || m.outputs.empty()) continue;
    const std::string& x = m.inputs[0];
    for (size_t j = i + 1; j < g.nodes.size(); ++j) {
      const Node& w = g.nodes[j];
      if (w.op_type != "Where" || w.inputs.empty() || w.inputs[0] != m.outputs[0]) continue;
      for (size_t k = j + 1; k < g.nodes.size(); ++k) {
        const Node& mul = g.nodes[k];
        if (mul.op_type == "Mul" && mul.inputs == std::vector<std::string>{x, w.outputs[0]}) {
          back[mul.outputs[0]] = x;
          drop.insert({i, j, k});
          for (const std::string& v : {m.outputs[0], w.outputs[0], mul.outputs[0]}) g.value_info.erase(v);
        }
      }
    }
  }
  if (drop.empty() && steps == 0) return 0;
  std::vector<Node> nodes;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (drop.count(i)) continue;
    Node n = std::move(g.nodes[i]);
    for (std::string& in : n.inputs)
      if (auto it = back.find(in); it != back.end()) in = it->second;
    nodes.push_back(std::move(n));
  }
  // The shared constants (1 / (1 - ratio) and 0), now unread.
  std::set<std::string> read;
  for (const Node& n : nodes) read.insert(n.inputs.begin(), n.inputs.end());
  std::erase_if(nodes, [&](const Node& n) {
    return n.op_type == "Constant" && n.outputs.size() == 1 && n.outputs[0].rfind("lora/dropout/", 0) == 0 &&
           !read.count(n.outputs[0]);
  });
  g.nodes = std::move(nodes);
  return steps;
}

std::vector<LoraAdapter> find_lora(const Graph& g) {
  std::vector<LoraAdapter> out;
  for (const auto& [name, t] : g.initializers) {
    if (!name.ends_with(".lora_A") || name.size() == 7) continue;
    const std::string w = name.substr(0, name.size() - 7);
    if (!g.initializers.count(w) || !g.initializers.count(w + ".lora_B")) continue;
    LoraAdapter ad{w, name, w + ".lora_B", {}};
    for (const Use& u : find_uses(g, w).uses) ad.nodes.push_back(g.nodes[u.node].name);
    out.push_back(std::move(ad));
  }
  return out;
}

namespace {

// W += scale * delta, with delta the adapter's product laid out like W. Computed in double.
template <class T> void fold(TensorData& w, const TensorData& a, const TensorData& b, double scale, const Use& u) {
  auto W = w.as_mut<T>();
  auto A = a.as<T>();
  auto B = b.as<T>();
  const int64_t r = a.dims[u.conv ? 0 : 1];
  if (u.conv) {  // W[o, i...] += sum_k B[o, k] A[k, i...]
    const int64_t out = w.dims[0], inner = w.numel() / out;
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        double d = 0;
        for (int64_t k = 0; k < r; ++k) d += double(B[o * r + k]) * double(A[k * inner + i]);
        W[o * inner + i] = static_cast<T>(double(W[o * inner + i]) + scale * d);
      }
    return;
  }
  const int64_t in = a.dims[0], out = b.dims[1];
  for (int64_t i = 0; i < in; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double d = 0;
      for (int64_t k = 0; k < r; ++k) d += double(A[i * r + k]) * double(B[k * out + o]);
      T& dst = u.transposed ? W[o * in + i] : W[i * out + o];
      dst = static_cast<T>(double(dst) + scale * d);
    }
}

}  // namespace

int merge_lora(Model& m) {
  Graph& g = m.graph;
  const std::vector<LoraAdapter> adapters = find_lora(g);
  std::set<size_t> drop;
  std::map<std::string, std::string> rename;  // base output -> the output the adapter's Add wrote
  for (const LoraAdapter& ad : adapters) {
    const std::string s = scale_name(ad.weight);
    const TensorData* sv = nullptr;
    std::set<std::string> branch = {ad.a, ad.b, s};
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      if (n.op_type == "Constant" && n.outputs.size() == 1 && n.outputs[0] == s) {
        sv = n.attr_tensor("value");
        drop.insert(i);
        continue;
      }
      auto in_branch = [&](const std::string& v) { return branch.count(v) != 0; };
      if (std::none_of(n.inputs.begin(), n.inputs.end(), in_branch)) continue;
      drop.insert(i);
      if (n.op_type == "Add" && n.inputs.size() == 2 && !branch.count(n.inputs[0])) {
        rename[n.inputs[0]] = n.outputs[0];  // the branch ends here
      } else {
        for (const std::string& o : n.outputs) branch.insert(o);
      }
    }
    if (!sv || sv->numel() != 1)
      fail("merge", "adapter of '" + ad.weight + "' has no scalar scale constant '" + s + "'");
    const double scale = sv->dtype == DType::Float64 ? sv->as<double>()[0] : double(sv->as<float>()[0]);
    const Uses uses = find_uses(g, ad.weight);
    if (!uses.error.empty()) fail("merge", uses.error);
    if (uses.uses.empty()) fail("merge", "weight '" + ad.weight + "' has adapters but no MatMul/Gemm/Conv reads it");
    TensorData& w = g.initializers.at(ad.weight);
    const TensorData& a = g.initializers.at(ad.a);
    const TensorData& b = g.initializers.at(ad.b);
    if (a.dtype != w.dtype || b.dtype != w.dtype)
      fail("merge", "adapter of '" + ad.weight + "' is " + dtype_name(a.dtype) + ", the weight " + dtype_name(w.dtype));
    const double s_w = scale / uses.uses[0].gemm_alpha;  // W's share of alpha_gemm * x W + x A B scale
    if (w.dtype == DType::Float32) fold<float>(w, a, b, s_w, uses.uses[0]);
    else fold<double>(w, a, b, s_w, uses.uses[0]);
    g.initializers.erase(ad.a);
    g.initializers.erase(ad.b);
  }
  std::vector<Node> nodes;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (drop.count(i)) continue;
    Node n = std::move(g.nodes[i]);
    for (std::string& o : n.outputs)
      if (auto it = rename.find(o); it != rename.end()) {
        g.value_info.erase(o);
        o = it->second;
      }
    nodes.push_back(std::move(n));
  }
  g.nodes = std::move(nodes);
  for (auto it = g.value_info.begin(); it != g.value_info.end();)
    it = it->first.rfind("lora/", 0) == 0 ? g.value_info.erase(it) : std::next(it);
  return static_cast<int>(adapters.size());
}

Model extract_lora(const Model& adapted, const AdapterSpec& spec, const std::vector<std::string>& also) {
  Model out;
  out.ir_version = adapted.ir_version;
  out.opset_imports[""] = std::max<int64_t>(adapted.opset(""), 13);
  out.producer_name = "onnxtrain";
  out.doc = "LoRA adapters (docs/lora.md); apply with `onnxtrain merge BASE ADAPTERS -o OUT`";
  out.graph.name = "lora_adapters";
  TrainingConfig c;
  c.adapter = spec;
  for (auto& kv : config_to_metadata(c))
    if (kv.first.rfind(std::string(kCheckpointKeyPrefix) + "adapter.", 0) == 0) out.metadata.push_back(kv);
  const std::vector<LoraAdapter> adapters = find_lora(adapted.graph);
  if (adapters.empty()) fail("export", "the model has no LoRA adapters");
  std::vector<std::string> names;
  for (const LoraAdapter& ad : adapters) names.insert(names.end(), {ad.a, ad.b});
  for (const std::string& n : also)
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  for (const std::string& n : names) {
      auto it = adapted.graph.initializers.find(n);
      if (it == adapted.graph.initializers.end()) fail("export", "'" + n + "' is not an initializer of the model");
      const TensorData& t = it->second;
      out.graph.initializers[n] = t;
      Shape s;
      for (int64_t d : t.dims) s.push_back(Dim::of(d));
      const std::string o = n + ".out";
      out.graph.nodes.push_back(Node{"identity/" + n, "Identity", "", {n}, {o}, {}, {}});
      out.graph.outputs.push_back({o, TypeInfo{t.dtype, s}});
    }
  return out;
}

Model apply_lora_file(const Model& base, const Model& adapters, const std::string& source) {
  TrainingConfig c = config_from_metadata(adapters.metadata, source);
  if (!c.adapter.active())
    fail(source, "is not a LoRA adapters file (no '" + std::string(kCheckpointKeyPrefix) + "adapter.kind' metadata)");
  Model m = base;
  if (!find_lora(m.graph).empty()) fail(source, "the base model already has LoRA adapters");
  std::vector<LoraAdapter> added;
  try {
    added = apply_lora(m, c.adapter);
  } catch (const Error& e) {
    fail(source, std::string("applying the adapters to the base model failed: ") + e.what());
  }
  for (const LoraAdapter& ad : added)
    for (const std::string& n : {ad.a, ad.b}) {
      auto it = adapters.graph.initializers.find(n);
      if (it == adapters.graph.initializers.end())
        fail(source, "has no tensor '" + n + "' for the base model's weight '" + ad.weight + "'");
      const TensorData& dst = m.graph.initializers.at(n);
      if (it->second.dtype != dst.dtype || it->second.dims != dst.dims)
        fail(source, "tensor '" + n + "' does not fit the base model's weight '" + ad.weight + "' (expected " +
                         dtype_name(dst.dtype) + " " + dims_text(dst.dims) + ")");
      m.graph.initializers[n] = it->second;
    }
  std::set<std::string> adapter_tensors;
  for (const LoraAdapter& ad : added) adapter_tensors.insert({ad.a, ad.b});
  for (const auto& [n, t] : adapters.graph.initializers) {
    if (adapter_tensors.count(n)) continue;
    // A weight trained in full beside the adapters replaces the base's.
    auto it = m.graph.initializers.find(n);
    if (it == m.graph.initializers.end())
      fail(source, "tensor '" + n + "' is neither an adapter nor a weight of the base model (was it trained on "
                   "another base?)");
    if (it->second.dtype != t.dtype || it->second.dims != t.dims)
      fail(source, "tensor '" + n + "' is " + dtype_name(t.dtype) + " " + dims_text(t.dims) + "; the base model's is " +
                       dtype_name(it->second.dtype) + " " + dims_text(it->second.dims));
    it->second = t;
  }
  return m;
}

}  // namespace onnxtrain
