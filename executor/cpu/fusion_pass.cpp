// The CPU backend's plan passes (executor/plan_pass.h), registered with its kernels: the Transpose folding of
// executor/plan_fusion.h as its node rewrite, and the fusion of compiled steps: runs of elementwise steps of one
// shape become one fused kernel each (executor/cpu/fused_elementwise.h). (Optimizer updates are one node per weight
// with a kernel of their own, executor/cpu/fused_update.h, so nothing here recognises them.) The plan compiler (executor/plan.cpp) calls them for
// CPU plans only; it swaps the fused kernels in and recomputes lifetimes itself.
#include <algorithm>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "executor/cpu/fused_elementwise.h"
#include "executor/kernel.h"
#include "executor/plan_fusion.h"
#include "executor/plan_pass.h"

namespace onnxtrain {

namespace {

// How operand `in` of a step with output shape `shape` (numel n) broadcasts: elementwise, one value, or a block
// of the output's dims [a, b) with 1s elsewhere (a bias row: b = rank; per-row statistics: a = 0), which reads
// element (i / inner) % period; nullopt for any other pattern.
std::optional<EwInput> classify_operand(const Tensor& in, const std::vector<int64_t>& shape, int64_t n) {
  if (in.numel() == n) return EwInput{EwInput::Kind::Full, 0, 1};  // no dim expanded: same layout
  if (in.numel() == 1) return EwInput{EwInput::Kind::Scalar, 0, 1};
  const size_t r = shape.size();
  if (in.shape.size() > r) return std::nullopt;
  std::vector<int64_t> d(r - in.shape.size(), 1);  // right-aligned, as broadcasting does
  d.insert(d.end(), in.shape.begin(), in.shape.end());
  size_t a = 0, b = r;
  while (a < r && d[a] == 1) ++a;
  while (b > a && d[b - 1] == 1) --b;
  int64_t inner = 1;
  for (size_t k = b; k < r; ++k) inner *= shape[k];
  for (size_t k = a; k < b; ++k)
    if (d[k] != shape[k]) return std::nullopt;
  return EwInput{EwInput::Kind::Broadcast, in.numel(), inner};
}

bool fusable(const FusionStep& s) {
  if (!s.op || s.out.size() != 1 || !s.out[0] || s.in.size() != static_cast<size_t>(ew_arity(*s.op))) return false;
  const Tensor& o = *s.out[0];
  if ((o.dtype != DType::Float32 && o.dtype != DType::Float64) || o.numel() == 0) return false;
  for (const Tensor* t : s.in)
    if (!t || t->dtype != o.dtype || !classify_operand(*t, o.shape, o.numel())) return false;
  return true;
}

struct OpenGroup {
  std::vector<size_t> members;
  std::vector<const Tensor*> produced;
  size_t pos = 0;       // the last member: where the fused kernel will run
  size_t operands = 0;  // operands read by the members (a bound on the kernel's inputs)
  size_t slots = 0;     // members plus scalar/row operands (a bound on its tile buffers)
  bool alive = true;
};

size_t slot_cost(const FusionStep& s) {
  size_t c = 1;
  for (const Tensor* t : s.in) c += t->numel() != s.out[0]->numel();
  return c;
}

}  // namespace

std::vector<ElementwiseGroup> group_elementwise_steps(const std::vector<FusionStep>& steps,
                                                      const std::unordered_set<const Tensor*>& needed) {
  std::unordered_map<const Tensor*, std::vector<size_t>> readers;  // increasing step indices
  for (size_t i = 0; i < steps.size(); ++i)
    for (const Tensor* t : steps[i].in)
      if (t) readers[t].push_back(i);
  std::vector<OpenGroup> groups;
  std::unordered_map<const Tensor*, size_t> group_of;  // a member's result -> its group

  // No step outside g reads g's results between g's last member and step s.
  auto can_move_to = [&](const OpenGroup& g, size_t s) {
    for (const Tensor* t : g.produced) {
      const std::vector<size_t>& r = readers[t];
      auto it = std::upper_bound(r.begin(), r.end(), g.pos);
      if (it != r.end() && *it < s) return false;
    }
    return true;
  };

  for (size_t s = 0; s < steps.size(); ++s) {
    const FusionStep& st = steps[s];
    if (!fusable(st)) continue;
    const Tensor& out = *st.out[0];
    std::vector<size_t> join;
    size_t members = 1, operands = st.in.size(), slots = slot_cost(st);
    for (const Tensor* t : st.in) {
      auto it = group_of.find(t);
      if (it == group_of.end()) continue;
      const size_t gi = it->second;
      const OpenGroup& g = groups[gi];
      const Tensor& head = *steps[g.members.front()].out[0];
      if (!g.alive || head.dtype != out.dtype || head.shape != out.shape ||
          std::find(join.begin(), join.end(), gi) != join.end() || !can_move_to(g, s))
        continue;
      // Within the kernel's limits: at most 64 inputs, 128 values, kMaxEwSlots tile buffers.
      if (operands + g.operands > 64 || members + g.members.size() + operands + g.operands > 128 ||
          slots + g.slots > kMaxEwSlots)
        continue;
      join.push_back(gi);
      members += g.members.size();
      operands += g.operands;
      slots += g.slots;
    }
    size_t gi;
    if (join.empty()) {
      gi = groups.size();
      groups.emplace_back();
    } else {
      gi = join.front();
      for (size_t k = 1; k < join.size(); ++k) {
        OpenGroup& other = groups[join[k]];
        for (const Tensor* t : other.produced) group_of[t] = gi;
        groups[gi].members.insert(groups[gi].members.end(), other.members.begin(), other.members.end());
        groups[gi].produced.insert(groups[gi].produced.end(), other.produced.begin(), other.produced.end());
        other.alive = false;
      }
    }
    OpenGroup& g = groups[gi];
    g.members.push_back(s);
    std::sort(g.members.begin(), g.members.end());
    g.produced.push_back(&out);
    group_of[&out] = gi;
    g.pos = s;
    g.operands = operands;
    g.slots = slots;
  }

  std::vector<ElementwiseGroup> result;
  for (const OpenGroup& g : groups) {
    if (!g.alive || g.members.size() < 2) continue;
    const Tensor& head = *steps[g.members.back()].out[0];
    ElementwiseGroup r;
    r.steps = g.members;
    r.program.dtype = head.dtype;
    r.program.numel = head.numel();
    std::unordered_map<const Tensor*, int32_t> id;
    std::unordered_set<const Tensor*> produced(g.produced.begin(), g.produced.end());
    for (size_t m : g.members)
      for (const Tensor* t : steps[m].in)
        if (!produced.count(t) && !id.count(t)) {
          id[t] = static_cast<int32_t>(r.inputs.size());
          r.inputs.push_back(t);
          r.program.inputs.push_back(*classify_operand(*t, head.shape, head.numel()));
        }
    std::unordered_set<size_t> member_set(g.members.begin(), g.members.end());
    for (size_t m : g.members) {
      const FusionStep& st = steps[m];
      EwInstr c{*st.op};
      c.a = id.at(st.in[0]);
      if (st.in.size() > 1) c.b = id.at(st.in[1]);
      const Tensor* o = st.out[0];
      id[o] = static_cast<int32_t>(r.inputs.size() + r.program.code.size());
      r.program.code.push_back(c);
      bool read_outside = needed.count(o) != 0;
      if (auto it = readers.find(o); it != readers.end())
        for (size_t k : it->second) read_outside = read_outside || !member_set.count(k);
      if (read_outside) {
        r.program.outputs.push_back(id[o]);
        r.outputs.push_back(o);
      }
    }
    if (!r.outputs.empty()) result.push_back(std::move(r));
  }
  std::sort(result.begin(), result.end(),
            [](const ElementwiseGroup& a, const ElementwiseGroup& b) { return a.steps.back() < b.steps.back(); });
  return result;
}


namespace {

// The CPU's step fusion. A view step of unchanged shape (Identity, a SumToShape that sums nothing, ...) right
// after a fusable step joins the chain as a copy; a chain that then writes its output gives it a buffer of its
// own (FusedSteps::unviewed). Only a view that is its buffer's sole view (PlannedStep::out0_sole_view).
std::vector<FusedSteps> fuse_elementwise_steps(std::span<const PlannedStep> steps,
                                               const std::unordered_set<const Tensor*>& needed) {
  std::vector<FusionStep> desc;
  desc.reserve(steps.size());
  std::unordered_set<const Tensor*> fusable_out, copies;
  for (const PlannedStep& st : steps) {
    std::optional<EwOp> op = elementwise_op_of(*st.node);
    std::vector<const Tensor*> in(st.in.begin(), st.in.end());
    if (!op && st.kernel->output_is_view_of_input0() && st.out.size() == 1 && !in.empty() && in[0] &&
        fusable_out.count(in[0]) && st.out[0]->shape == in[0]->shape && st.out[0]->dtype == in[0]->dtype &&
        st.out0_sole_view) {
      op = EwOp::Broadcast;
      copies.insert(st.out[0]);
    }
    if (op == EwOp::Broadcast) in.resize(1);  // only data is an operand: not Expand's shape, nor a view's
    if (op)
      for (const Tensor* t : st.out) fusable_out.insert(t);
    desc.push_back({op, std::move(in), std::vector<const Tensor*>(st.out.begin(), st.out.end())});
  }
  std::vector<FusedSteps> fused;
  for (ElementwiseGroup& g : group_elementwise_steps(desc, needed)) {
    FusedSteps f;
    std::string ops;
    for (size_t k : g.steps) ops += (ops.empty() ? "" : " ") + steps[k].node->op_type;
    // The profiler's names, which docs/performance.md and the profile tests read.
    f.step = "fused " + std::to_string(g.steps.size()) + " ops (" + ops + ") through " +
             steps[g.steps.back()].node->describe();
    f.op = "fused elementwise";
    for (size_t i : g.steps)
      if (copies.count(steps[i].out[0])) f.unviewed.push_back(steps[i].out[0]);
    for (const Tensor* t : g.outputs) f.out.push_back(const_cast<Tensor*>(t));  // slots the plan owns
    f.in = std::move(g.inputs);
    f.kernel = make_fused_elementwise(std::move(g.program));
    f.steps = std::move(g.steps);
    fused.push_back(std::move(f));
  }
  return fused;
}

}  // namespace

void register_cpu_plan_passes(KernelRegistry& r) {
  PlanPasses p;
  p.rewrite_nodes = [](std::vector<Node>& nodes, const std::vector<std::string>& keep, const Graph* types) {
    fold_transposes_into_matmuls(nodes, keep, types);
  };
  p.fuse_steps = fuse_elementwise_steps;
  r.set_plan_passes(Device::CPU, std::move(p));
}

}  // namespace onnxtrain
