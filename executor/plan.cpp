#include "executor/plan.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>

#include "executor/device.h"
#include "executor/finite.h"
#include "executor/plan_pass.h"
#include "graph/error.h"
#include "graph/validate.h"

namespace onnxtrain {

namespace {

constexpr size_t kAlign = 64;
// Constant device inputs up to this size are copied to the host for factories to read (shapes, axes, pads);
// larger ones (weights) only when a node is folded, so planning does not download a whole model.
constexpr size_t kHostMirrorBytes = 1 << 16;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Ops whose result must not be computed once at plan time even when every input is known.
bool never_fold(const Node& n) { return is_random_op(n) || n.op_type == "Dropout"; }

}  // namespace

// Compiles one plan. Values live in slots: feeds and state are views of memory owned elsewhere, folded
// values are owned by the plan, intermediates are placed in the arena once all lifetimes are known.
class PlanCompiler {
 public:
  explicit PlanCompiler(const PlanSpec& s) : spec_(s), plan_(new ExecutionPlan()) {
    plan_->device_ = s.device;
    // Constant state is known at plan time exactly like a folded value.
    for (const std::string& c : s.constants)
      if (auto it = s.state.find(c); it != s.state.end()) folded_.insert(it->second);
  }

  std::unique_ptr<ExecutionPlan> compile() {
    // The passes of the backend this plan is for (executor/plan_pass.h). Checking every value keeps every node
    // as written, so a non-finite value is reported at the node that made it.
    passes_ = spec_.check_every_value ? nullptr : spec_.registry->plan_passes(spec_.device);
    const Graph& g = rewritten_graph();
    for (size_t i = 0; i < spec_.feed_names.size(); ++i) {
      Tensor* t = new_slot(spec_.feed_names[i]);
      t->dtype = spec_.feed_specs[i].dtype;
      t->shape = spec_.feed_specs[i].shape;
      t->device = spec_.device;
      plan_->feed_slots_.push_back(t);
    }
    for (size_t idx : topological_order(g, spec_.feed_names_and_state())) compile_node(g.nodes[idx], idx);
    for (const std::string& out : spec_.outputs) {
      const Tensor* t = lookup(out);
      if (!t) fail("plan", "requested output '" + out + "' is not produced by the graph");
      plan_->outputs_.push_back(t);
      extend(t, std::numeric_limits<size_t>::max());
    }
    if (passes_ && passes_->fuse_steps && spec_.fuse_elementwise) fuse_steps();
    reserve_handed_over();
    place_in_arena();
    // A handed-over buffer keeps the arena alive wherever it goes.
    for (size_t i = 0; i < plan_->handed_over_.size(); ++i)
      if (plan_->handed_over_[i]) {
        const_cast<Tensor*>(plan_->outputs_[i])->owner = plan_->arena_;
        plan_->handed_over_bytes_ += align_up(plan_->outputs_[i]->nbytes());
      }
    plan_->profile_ = spec_.profile;
    return std::move(plan_);
  }

 private:
  Tensor* new_slot(const std::string& name) {
    plan_->slots_.push_back(std::make_unique<Tensor>());
    Tensor* t = plan_->slots_.back().get();
    values_[name] = t;
    return t;
  }

  // The graph this plan runs: a copy rewritten by the backend's node rewrite when it has one (the CPU's folds
  // Transposes into the MatMuls that read them, executor/plan_fusion.h), else the graph as written.
  const Graph& rewritten_graph() {
    const Graph* src = with_outer_inputs();
    if (!passes_ || !passes_->rewrite_nodes) return *src;
    rewritten_.nodes = src->nodes;
    rewritten_.inputs = src->inputs;
    passes_->rewrite_nodes(rewritten_.nodes, spec_.outputs, spec_.graph);
    return rewritten_;
  }

  // Control flow (If, Loop, Scan): the values a node's subgraphs read from this scope become extra inputs of
  // its step, appended after the node's own in subgraph_outer_references' order (where the kernel finds them),
  // so that the plan orders, feeds and keeps them alive like any input, and the node rewrite above counts
  // them as readers. The spec's graph itself is left as it is; a graph without subgraphs is not copied.
  const Graph* with_outer_inputs() {
    const Graph& g = *spec_.graph;
    auto has_subgraph = [](const Node& n) {
      return std::any_of(n.attributes.begin(), n.attributes.end(),
                         [](const auto& a) { return std::holds_alternative<std::shared_ptr<Graph>>(a.second); });
    };
    if (std::none_of(g.nodes.begin(), g.nodes.end(), has_subgraph)) return &g;
    explicit_.nodes = g.nodes;
    explicit_.inputs = g.inputs;
    for (Node& n : explicit_.nodes)
      if (has_subgraph(n))
        for (const std::string& v : subgraph_outer_references(n)) n.inputs.push_back(v);
    return &explicit_;
  }

  const Tensor* lookup(const std::string& name) const {
    if (auto it = values_.find(name); it != values_.end()) return it->second;
    if (auto it = spec_.state.find(name); it != spec_.state.end()) return it->second;
    return nullptr;
  }

  bool known(const Tensor* t) const { return folded_.count(t) != 0; }

  // A host copy of a value known at plan time (the value itself on the CPU), downloaded once per plan.
  const Tensor* host_view(const Tensor* t) {
    if (t->device == Device::CPU) return t;
    auto it = host_mirror_.find(t);
    if (it == host_mirror_.end()) it = host_mirror_.emplace(t, t->to(Device::CPU)).first;
    return &it->second;
  }

  // The arena value whose buffer t uses (t itself unless t is a view).
  const Tensor* root(const Tensor* t) const {
    auto it = view_of_.find(t);
    return it == view_of_.end() ? t : it->second;
  }
  // t (or the value it views) is read at `step`.
  void extend(const Tensor* t, size_t step) {
    auto it = interval_.find(root(t));
    if (it != interval_.end()) it->second.second = std::max(it->second.second, step);
  }

  void compile_node(const Node& n, size_t index) {
    int64_t opset = 0;
    const std::string dom = n.domain == "ai.onnx" ? std::string() : n.domain;
    if (auto it = spec_.opsets->find(dom); it != spec_.opsets->end()) opset = it->second;
    else if (dom.empty()) if (auto it2 = spec_.opsets->find("ai.onnx"); it2 != spec_.opsets->end()) opset = it2->second;

    // On a device, plan-time work happens on the host: factories read constant inputs through
    // KernelInput::value, and folded values are computed by the CPU kernels, then uploaded once.
    const bool on_device = spec_.device != Device::CPU;
    PrepareContext ctx{n, opset, spec_.device, {}, {}};
    std::vector<const Tensor*> ins;
    bool all_known = true;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (n.inputs[i].empty()) {
        ctx.inputs.push_back({});
        ins.push_back(nullptr);
        continue;
      }
      const Tensor* t = lookup(n.inputs[i]);
      if (!t) fail(n.describe(), "input '" + n.inputs[i] + "' is neither fed, stored, nor produced earlier");
      bool k = known(t);
      all_known = all_known && k;
      ctx.inputs.push_back({t->dtype, t->shape, k && (!on_device || t->nbytes() <= kHostMirrorBytes) ? host_view(t) : nullptr});
      ins.push_back(t);
    }
    DType key = DType::Undefined;
    for (const KernelInput& in : ctx.inputs)
      if (in.present()) { key = in.dtype; break; }
    const KernelDef* def = spec_.registry->find(dom, n.op_type, opset, spec_.device, key);
    const KernelDef* host_def = on_device ? spec_.registry->find(dom, n.op_type, opset, Device::CPU, key) : def;
    const bool fold_on_host = on_device && host_def && (all_known || host_def->shape_only) && !never_fold(n);
    if (fold_on_host) {
      def = host_def;
      ctx.device = Device::CPU;
      for (size_t i = 0; i < ins.size(); ++i)
        if (ins[i] && known(ins[i])) ctx.inputs[i].value = host_view(ins[i]);
    }
    if (!def)
      fail(n.describe(), "no " + device_name(spec_.device) + " kernel for op '" + (dom.empty() ? "" : dom + ".") +
                             n.op_type + "' at opset " + std::to_string(opset) + " with input type " +
                             dtype_name(key));
    ctx.outputs.resize(n.outputs.size());
    std::unique_ptr<Kernel> kernel = def->factory(ctx);
    if (ctx.outputs.size() != n.outputs.size()) fail(n.describe(), "kernel returned the wrong number of outputs");

    std::vector<Tensor*> outs;
    bool fold = (all_known || def->shape_only) && !never_fold(n);
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      if (n.outputs[i].empty()) {
        // An omitted optional output still needs somewhere to write.
        Tensor* t = new_slot("\x01unused" + std::to_string(index) + "_" + std::to_string(i));
        t->dtype = ctx.outputs[i].dtype;
        t->shape = ctx.outputs[i].shape;
        t->device = spec_.device;
        outs.push_back(t);
        if (!fold) interval_[t] = {plan_->steps_.size(), plan_->steps_.size()};
        continue;
      }
      if (values_.count(n.outputs[i]) || spec_.state.count(n.outputs[i]))
        fail(n.describe(), "output '" + n.outputs[i] + "' is defined twice");
      Tensor* t = new_slot(n.outputs[i]);
      t->dtype = ctx.outputs[i].dtype;
      t->shape = ctx.outputs[i].shape;
      t->device = spec_.device;
      outs.push_back(t);
    }
    if (fold_on_host) {
      std::vector<const Tensor*> host_in;
      for (const Tensor* t : ins) host_in.push_back(t && known(t) ? host_view(t) : t);  // unknown: shape only
      std::vector<Tensor> host_out;
      for (const Tensor* t : outs) host_out.push_back(Tensor::empty(t->dtype, t->shape));
      std::vector<Tensor*> host_out_ptrs;
      for (Tensor& h : host_out) host_out_ptrs.push_back(&h);
      kernel->run(host_in, host_out_ptrs);
      for (size_t i = 0; i < outs.size(); ++i) {
        Tensor uploaded = host_out[i].to(spec_.device);
        outs[i]->data = uploaded.data;
        outs[i]->owner = uploaded.owner;
        folded_.insert(outs[i]);
        host_mirror_[outs[i]] = std::move(host_out[i]);
      }
      return;
    }
    if (fold) {
      for (Tensor* t : outs) {
        Tensor owned = Tensor::empty(t->dtype, t->shape, spec_.device);
        t->data = owned.data;
        t->owner = owned.owner;
        folded_.insert(t);
      }
      KernelScope on_device(spec_.device);
      kernel->run(ins, outs);
      return;
    }
    size_t step = plan_->steps_.size();
    for (const Tensor* in : ins) extend(in, step);
    for (Tensor* t : outs) plan_->unplanned_bytes_ += align_up(t->nbytes());
    // A view of an arena value needs no buffer of its own: it shares the input's, whose lifetime then also
    // covers the view's readers. Only arena values qualify: feeds change address every run, and state must
    // not be aliased by a value the caller might hold while updates are written.
    if (kernel->output_is_view_of_input0() && ins[0] && interval_.count(root(ins[0])) && outs[0]->nbytes() == ins[0]->nbytes()) {
      view_of_[outs[0]] = root(ins[0]);
      for (size_t i = 1; i < outs.size(); ++i) interval_.emplace(outs[i], std::make_pair(step, step));
    } else {
      for (Tensor* t : outs) interval_.emplace(t, std::make_pair(step, step));
    }
    plan_->steps_.push_back({std::move(kernel), std::move(ins), std::move(outs)});
    plan_->times_.push_back({n.describe(), n.op_type});
    step_nodes_.push_back(&n);
    if (spec_.check_every_value) plan_->checked_steps_.push_back(n.outputs);
  }

  // The backend's step fusion (on the CPU, runs of elementwise steps, executor/cpu/fusion_pass.cpp) replaces
  // groups of steps by one kernel each, placed at the last step of the group; the values only the group read
  // get no buffer. Lifetimes are then recomputed from the new steps.
  void fuse_steps() {
    // A view records its root buffer, not the view it was made from: the pass may give only a buffer's sole
    // view a buffer of its own, or a second view of the same buffer could lose its memory.
    std::unordered_map<const Tensor*, int> views_of;
    for (const auto& [view, target] : view_of_) ++views_of[target];
    std::vector<PlannedStep> planned;
    planned.reserve(plan_->steps_.size());
    for (size_t i = 0; i < plan_->steps_.size(); ++i) {
      const ExecutionPlan::Step& st = plan_->steps_[i];
      bool sole_view = true;
      if (!st.out.empty())
        if (auto it = view_of_.find(st.out[0]); it != view_of_.end()) sole_view = views_of[it->second] == 1;
      planned.push_back({step_nodes_[i], st.kernel.get(), st.in, st.out, sole_view});
    }
    std::unordered_set<const Tensor*> needed(plan_->outputs_.begin(), plan_->outputs_.end());
    std::vector<FusedSteps> groups = passes_->fuse_steps(planned, needed);
    if (groups.empty()) return;
    std::vector<int64_t> group_at(plan_->steps_.size(), -1);  // -1 kept, -2 absorbed, else the group it ends
    std::unordered_set<const Tensor*> unviewed;  // fused view steps: their outputs are values of their own now
    for (size_t k = 0; k < groups.size(); ++k) {
      for (size_t i : groups[k].steps) group_at[i] = -2;
      for (const Tensor* o : groups[k].unviewed)
        if (view_of_.erase(o)) unviewed.insert(o);
      group_at[groups[k].steps.back()] = static_cast<int64_t>(k);
    }
    std::vector<ExecutionPlan::Step> steps;
    std::vector<StepTime> names;
    for (size_t i = 0; i < plan_->steps_.size(); ++i) {
      if (group_at[i] == -1) {
        steps.push_back(std::move(plan_->steps_[i]));
        names.push_back(std::move(plan_->times_[i]));
      } else if (group_at[i] >= 0) {
        FusedSteps& g = groups[static_cast<size_t>(group_at[i])];
        names.push_back({std::move(g.step), std::move(g.op)});
        steps.push_back({std::move(g.kernel), std::move(g.in), std::move(g.out)});
      }
    }
    plan_->steps_ = std::move(steps);
    plan_->times_ = std::move(names);
    // Lifetimes again, over the new step indices; values no step writes any more are dropped from the arena.
    std::unordered_map<const Tensor*, std::pair<size_t, size_t>> old = std::move(interval_);
    interval_.clear();
    for (size_t i = 0; i < plan_->steps_.size(); ++i)
      for (Tensor* t : plan_->steps_[i].out)
        if ((old.count(t) || unviewed.count(t)) && !view_of_.count(t)) interval_.emplace(t, std::make_pair(i, i));
    for (size_t i = 0; i < plan_->steps_.size(); ++i)
      for (const Tensor* t : plan_->steps_[i].in)
        if (t) extend(t, i);
    for (const Tensor* t : plan_->outputs_) extend(t, std::numeric_limits<size_t>::max());
    for (auto it = view_of_.begin(); it != view_of_.end();)
      it = interval_.count(it->second) ? std::next(it) : view_of_.erase(it);
  }

  // Outputs the executor hands over to state (optimizer updates) get a buffer no other value shares at any
  // step: after the swap that buffer holds the state, which the next run reads from its first step on. Only
  // plain arena values qualify, not views, nor values that another value views or that are also returned as
  // another output.
  void reserve_handed_over() {
    plan_->handed_over_.assign(plan_->outputs_.size(), false);
    if (spec_.device != Device::CPU) return;
    std::unordered_map<const Tensor*, int> returned;
    for (const Tensor* t : plan_->outputs_) ++returned[t];
    std::unordered_set<const Tensor*> viewed;
    for (const auto& [view, target] : view_of_) viewed.insert(target);
    for (size_t i : spec_.handed_over) {
      if (i >= plan_->outputs_.size()) continue;
      const Tensor* t = plan_->outputs_[i];
      auto it = interval_.find(t);
      if (it == interval_.end() || view_of_.count(t) || viewed.count(t) || returned[t] != 1) continue;
      it->second.first = 0;
      plan_->handed_over_[i] = true;
    }
  }

  // Greedy best-fit by decreasing size: each buffer takes the lowest offset free for its whole lifetime.
  void place_in_arena() {
    struct Buf {
      Tensor* t;
      size_t begin, end, size, offset;
    };
    std::vector<Buf> bufs;
    for (auto& [t, iv] : interval_) bufs.push_back({const_cast<Tensor*>(t), iv.first, iv.second, align_up(t->nbytes()), 0});
    std::sort(bufs.begin(), bufs.end(), [](const Buf& a, const Buf& b) {
      return a.size != b.size ? a.size > b.size : a.begin < b.begin;
    });
    std::vector<const Buf*> placed;
    size_t total = 0;
    for (Buf& b : bufs) {
      std::vector<std::pair<size_t, size_t>> busy;
      for (const Buf* p : placed)
        if (p->begin <= b.end && b.begin <= p->end) busy.emplace_back(p->offset, p->offset + p->size);
      std::sort(busy.begin(), busy.end());
      size_t off = 0;
      for (auto [lo, hi] : busy) {
        if (off + b.size <= lo) break;
        off = std::max(off, hi);
      }
      b.offset = off;
      total = std::max(total, off + b.size);
      placed.push_back(&b);
    }
    plan_->arena_bytes_ = total;
    if (total == 0) return;
    if (spec_.device != Device::CPU) {
      Tensor arena = Tensor::empty(DType::UInt8, {static_cast<int64_t>(total)}, spec_.device);
      plan_->arena_ = arena.owner;
    } else {
      plan_->arena_ = allocate_host(total);
      if (!plan_->arena_) fail("plan", "out of memory allocating a " + std::to_string(total) + "-byte arena");
    }
    auto* base = static_cast<std::byte*>(plan_->arena_.get());
    for (const Buf& b : bufs) b.t->data = base + b.offset;
    for (auto& [view, target] : view_of_) const_cast<Tensor*>(view)->data = target->data;
  }

  const PlanSpec& spec_;
  Graph rewritten_;  // nodes only (initializers are state): the graph after the backend's node rewrite
  Graph explicit_;  // nodes only: the graph with control flow's outer references as inputs (with_outer_inputs)
  const PlanPasses* passes_ = nullptr;  // the device's plan passes (built-in kernels, values not checked), or none
  std::vector<const Node*> step_nodes_;  // per step before fusion: the node it computes (in the graph compiled)
  std::unique_ptr<ExecutionPlan> plan_;
  std::unordered_map<std::string, Tensor*> values_;
  std::unordered_set<const Tensor*> folded_;
  std::unordered_map<const Tensor*, std::pair<size_t, size_t>> interval_;  // arena values: [def, last use]
  std::unordered_map<const Tensor*, const Tensor*> view_of_;                // view -> arena value it shares
  std::unordered_map<const Tensor*, Tensor> host_mirror_;  // device values known at plan time, on the host
};

std::vector<std::string> PlanSpec::feed_names_and_state() const {
  std::vector<std::string> r = feed_names;
  for (const auto& [name, t] : state) r.push_back(name);
  return r;
}

std::unique_ptr<ExecutionPlan> ExecutionPlan::compile(const PlanSpec& spec) { return PlanCompiler(spec).compile(); }

ExecutionPlan::~ExecutionPlan() = default;

bool ExecutionPlan::hand_over(size_t output, Tensor& state) {
  if (output >= handed_over_.size() || !handed_over_[output]) return false;
  Tensor* slot = const_cast<Tensor*>(outputs_[output]);
  // A state that views memory it does not own (a bound buffer) must keep receiving its values there.
  if (!state.owner || state.device != slot->device || state.nbytes() != slot->nbytes()) return false;
  std::swap(slot->data, state.data);
  std::swap(slot->owner, state.owner);
  return true;
}

std::span<const Tensor* const> ExecutionPlan::run(std::span<const Tensor* const> feeds) {
  for (size_t i = 0; i < feed_slots_.size(); ++i) feed_slots_[i]->data = feeds[i]->data;
  KernelScope on_device(device_);
  if (!profile_ && checked_steps_.empty()) {
    for (Step& s : steps_) s.kernel->run(s.in, s.out);
  } else {
    using Clock = std::chrono::steady_clock;
    for (size_t i = 0; i < steps_.size(); ++i) {
      const Clock::time_point t0 = profile_ ? Clock::now() : Clock::time_point{};
      steps_[i].kernel->run(steps_[i].in, steps_[i].out);
      if (profile_) {
        times_[i].seconds += std::chrono::duration<double>(Clock::now() - t0).count();
        ++times_[i].calls;
      }
      if (!checked_steps_.empty()) check_step(i);
    }
  }
  return outputs_;
}

std::vector<StepTime> ExecutionPlan::profile() const { return profile_ ? times_ : std::vector<StepTime>{}; }

std::string format_profile(const std::vector<StepTime>& times, size_t top) {
  double total = 0;
  std::map<std::string, std::pair<double, int64_t>> by_op;
  for (const StepTime& t : times) {
    total += t.seconds;
    by_op[t.op].first += t.seconds;
    ++by_op[t.op].second;
  }
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> ops(by_op.begin(), by_op.end());
  std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::vector<StepTime> sorted = times;
  std::stable_sort(sorted.begin(), sorted.end(), [](const StepTime& a, const StepTime& b) { return a.seconds > b.seconds; });
  auto pct = [&](double s) { return total > 0 ? 100.0 * s / total : 0.0; };
  std::string r;
  char line[512];
  std::snprintf(line, sizeof line, "%zu steps, %.3f s in all\n  share  op (steps)\n", times.size(), total);
  r += line;
  for (const auto& [op, v] : ops) {
    std::snprintf(line, sizeof line, "  %5.1f%%  %s (%lld)\n", pct(v.first), op.c_str(), static_cast<long long>(v.second));
    r += line;
  }
  r += "  share  us/call  calls  step\n";
  for (size_t i = 0; i < std::min(top, sorted.size()); ++i) {
    const StepTime& t = sorted[i];
    std::snprintf(line, sizeof line, "  %5.1f%%  %7.1f  %5lld  ", pct(t.seconds),
                  t.calls ? 1e6 * t.seconds / static_cast<double>(t.calls) : 0.0, static_cast<long long>(t.calls));
    r += line;
    r += t.step.size() > 160 ? t.step.substr(0, 157) + "..." : t.step;
    r += '\n';
  }
  return r;
}

void ExecutionPlan::check_step(size_t i) const {
  const std::string& node = times_[i].step;
  const std::vector<std::string>& names = checked_steps_[i];
  for (size_t k = 0; k < steps_[i].out.size(); ++k) {
    const Tensor& t = *steps_[i].out[k];
    NonFiniteCount c = count_non_finite(t);
    if (c.count == 0) continue;
    const std::string& name = k < names.size() ? names[k] : std::string();
    throw NonFiniteError(node + ": output '" + name + "' " + t.describe() + " is the first non-finite value: " +
                             describe_non_finite(t, c),
                         name);
  }
}

}  // namespace onnxtrain
