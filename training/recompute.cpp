#include "training/recompute.h"

#include <algorithm>

#include "graph/error.h"
#include "optimizers/optimizer.h"  // glob_match, shared with parameter groups and LoRA targets

namespace onnxtrain {

RecomputePolicy recompute_policy(const MemorySpec& spec, const Graph& g) {
  RecomputePolicy p;
  const std::vector<std::string>& r = spec.recompute;
  const bool keyword = std::any_of(r.begin(), r.end(), [](const std::string& s) { return s == "none" || s == "auto"; });
  if (r.empty() || (r.size() == 1 && r[0] == "none")) return p;
  if (keyword && r.size() > 1)
    fail("memory.recompute", "'none' and 'auto' stand alone; a list names forward nodes (or globs) to recompute");
  if (r.size() == 1 && r[0] == "auto") {
    p.mode = RecomputePolicy::Mode::Auto;
    return p;
  }
  p.mode = RecomputePolicy::Mode::Nodes;
  for (const std::string& pat : r) {
    if (pat.empty()) fail("memory.recompute", "has an empty node name; expected node names or globs ('*', '?')");
    std::vector<std::string> refused;
    bool any = false;
    for (const Node& n : g.nodes) {
      if (!glob_match(pat, n.name)) continue;
      any = true;
      if (recomputable(n)) p.nodes.insert(n.name);
      else refused.push_back(n.describe());
    }
    if (!any) {
      std::string some;
      for (size_t i = 0; i < g.nodes.size() && i < 8; ++i) some += (some.empty() ? "" : ", ") + g.nodes[i].name;
      fail("memory.recompute", "'" + pat + "' matches no node of the model (node names such as: " + some + ")");
    }
    if (std::none_of(g.nodes.begin(), g.nodes.end(), [&](const Node& n) { return glob_match(pat, n.name) && recomputable(n); })) {
      std::string list;
      for (const std::string& d : refused) list += (list.empty() ? "" : ", ") + d;
      fail("memory.recompute", "'" + pat + "' matches only nodes that are never recomputed (random ops, Dropout, control "
                               "flow keep their outputs): " + list);
    }
  }
  return p;
}

}  // namespace onnxtrain
