#include "executor/executor.h"

#include <algorithm>
#include <cstring>

#include "executor/device.h"
#include "executor/finite.h"
#include "graph/error.h"
#include "graph/inline.h"

namespace onnxtrain {

namespace {

// In the same compact form as shape_string, so the two shapes of a message line up.
std::string expected_shape(const TypeInfo& t) {
  if (!t.shape) return "any shape";
  std::string s = to_string(*t.shape);
  s.erase(std::remove(s.begin(), s.end(), ' '), s.end());
  return s;
}

}  // namespace

Executor::Executor(Graph g, std::map<std::string, int64_t> opsets, std::shared_ptr<TensorStore> store,
                   ExecutorOptions opts)
    : graph_(std::move(g)), opsets_(std::move(opsets)), store_(std::move(store)), opts_(std::move(opts)) {
  if (!opts_.registry) opts_.registry = &default_kernels();
  stream_ = make_stream(opts_.device);  // throws a clear error when CUDA is missing
  if (!opts_.functions.empty()) {
    const KernelRegistry& reg = *opts_.registry;
    const Device dev = kernel_device(opts_.device);
    const bool always = opts_.prefer_function_bodies;
    inline_functions(graph_, opts_.functions, [&](const Node& n) {
      if (always) return true;
      for (const KernelDef& d : reg.all())
        if (d.device == dev && d.op_type == n.op_type && d.domain == n.domain) return false;
      return true;
    });
    for (const Function& f : opts_.functions)
      for (const auto& [dom, v] : f.opset_imports) opsets_.emplace(dom, v);
  }
  for (const auto& [name, data] : graph_.initializers)
    if (!store_->count(name)) {
      Tensor t = Tensor::from_data(data);
      (*store_)[name] = opts_.device == Device::CPU ? std::move(t) : t.to(opts_.device);
    }
  for (const ValueInfo& in : graph_.inputs) {
    if (graph_.is_initializer(in.name) || store_->count(in.name)) continue;
    feed_names_.push_back(in.name);
    feed_types_.push_back(in.type);
  }
  for (const ValueInfo& out : graph_.outputs) output_names_.push_back(out.name);
  for (const auto& [fresh, state] : opts_.updates) {
    if (!store_->count(state)) fail("executor", "update target '" + state + "' is not a stored tensor");
    opts_.variables.insert(state);
  }
}

ExecutionPlan& Executor::plan_for(std::span<const Tensor* const> feeds) {
  auto matches = [&](const CachedPlan& c) {
    for (size_t i = 0; i < feeds.size(); ++i)
      if (c.shapes[i] != feeds[i]->shape) return false;
    return true;
  };
  if (last_ && matches(plans_[last_index_])) return *last_;
  for (size_t i = 0; i < plans_.size(); ++i)
    if (matches(plans_[i])) {
      last_index_ = i;
      last_ = plans_[i].plan.get();
      return *last_;
    }

  PlanSpec spec;
  spec.graph = &graph_;
  spec.opsets = &opsets_;
  spec.device = opts_.device;
  spec.registry = opts_.registry;
  spec.feed_names = feed_names_;
  for (const Tensor* f : feeds) spec.feed_specs.push_back({f->dtype, f->shape});
  for (auto& [name, t] : *store_) {
    spec.state[name] = &t;
    if (!opts_.variables.count(name)) spec.constants.insert(name);
  }
  spec.outputs = output_names_;
  for (const auto& [fresh, state] : opts_.updates) {
    spec.handed_over.push_back(spec.outputs.size());
    spec.outputs.push_back(fresh);
  }
  for (const std::string& v : opts_.must_be_finite) spec.outputs.push_back(v);
  spec.check_every_value = opts_.check_every_value;
  spec.fuse_elementwise = opts_.fuse_elementwise;
  spec.profile = opts_.profile;
  CachedPlan c;
  for (const Tensor* f : feeds) c.shapes.push_back(f->shape);
  c.plan = ExecutionPlan::compile(spec);
  plans_.push_back(std::move(c));
  last_index_ = plans_.size() - 1;
  last_ = plans_.back().plan.get();
  return *last_;
}

std::vector<KernelOutput> Executor::plan_outputs(const std::vector<KernelOutput>& feeds) {
  if (feeds.size() != feed_names_.size())
    fail("executor", "expected " + std::to_string(feed_names_.size()) + " inputs, got " + std::to_string(feeds.size()));
  // plan_for reads only the feeds' dtypes and shapes, never their data.
  std::vector<Tensor> specs(feeds.size());
  std::vector<const Tensor*> ptrs;
  for (size_t i = 0; i < feeds.size(); ++i) {
    specs[i].dtype = feeds[i].dtype;
    specs[i].shape = feeds[i].shape;
    specs[i].device = opts_.device;
    ptrs.push_back(&specs[i]);
  }
  const ExecutionPlan& plan = plan_for(ptrs);
  std::vector<KernelOutput> r;
  for (size_t i = 0; i < output_names_.size(); ++i) r.push_back({plan.outputs()[i]->dtype, plan.outputs()[i]->shape});
  return r;
}

std::span<const Tensor* const> Executor::run(std::span<const Tensor* const> feeds) {
  if (feeds.size() != feed_names_.size())
    fail("executor", "expected " + std::to_string(feed_names_.size()) + " inputs, got " + std::to_string(feeds.size()));
  for (size_t i = 0; i < feeds.size(); ++i) {
    const Tensor& f = *feeds[i];
    const TypeInfo& want = feed_types_[i];
    if (want.dtype != DType::Undefined && f.dtype != want.dtype)
      fail("input '" + feed_names_[i] + "'", "expected dtype " + dtype_name(want.dtype) + ", got " + dtype_name(f.dtype));
    if (want.shape) {
      bool ok = want.shape->size() == f.shape.size();
      for (size_t d = 0; ok && d < f.shape.size(); ++d)
        ok = !(*want.shape)[d].known() || (*want.shape)[d].value == f.shape[d];
      if (!ok)
        fail("input '" + feed_names_[i] + "'", "expected shape " + expected_shape(want) + ", got " + shape_string(f.shape));
    }
  }
  StreamScope on_stream(stream_.get());
  feeds = stage(feeds);
  ExecutionPlan& plan = plan_for(feeds);
  std::span<const Tensor* const> outs = plan.run(feeds);
  const size_t n_user = output_names_.size();
  const size_t n_guarded = n_user + opts_.updates.size();
  for (size_t i = 0; i < opts_.must_be_finite.size(); ++i) {
    const Tensor& t = *outs[n_guarded + i];
    if (NonFiniteCount c = count_non_finite(host_copy_of(t)); c.count)
      throw NonFiniteError("value '" + opts_.must_be_finite[i] + "' " + t.describe() + " is not finite: " +
                               describe_non_finite(t, c) + "; no update of this run was applied",
                           opts_.must_be_finite[i]);
  }
  for (size_t i = 0; i < opts_.updates.size(); ++i) {
    const Tensor& fresh = *outs[n_user + i];
    Tensor& target = store_->at(opts_.updates[i].second);
    if (fresh.dtype != target.dtype || fresh.shape != target.shape)
      fail("update of '" + opts_.updates[i].second + "'", "new value '" + opts_.updates[i].first + "' is " +
                                                             fresh.describe() + " but the state is " + target.describe());
    // The plan's buffer of the new value becomes the state's (no copy) where it can; else the bytes are copied.
    if (fresh.data != target.data && !plan.hand_over(n_user + i, target))
      copy_bytes(target.data, target.device, fresh.data, fresh.device, target.nbytes());
  }
  // Each run ends with its work finished, so callers may read results and the next run (of any executor
  // sharing the store) sees the updated state without cross-stream ordering.
  synchronize(stream_.get());
  return outs.first(n_user);
}

const Tensor& Executor::host_copy_of(const Tensor& t) {
  if (host_accessible(t.device)) return t;
  if (guard_scratch_.nbytes() < t.nbytes())
    guard_scratch_ = Tensor::empty(DType::UInt8, {static_cast<int64_t>(t.nbytes())});
  guard_view_.dtype = t.dtype;
  guard_view_.shape.assign(t.shape.begin(), t.shape.end());
  guard_view_.data = guard_scratch_.data;
  copy_bytes(guard_view_.data, Device::CPU, t.data, t.device, t.nbytes());
  return guard_view_;
}

std::span<const Tensor* const> Executor::stage(std::span<const Tensor* const> feeds) {
  const Device dev = opts_.device;
  if (std::all_of(feeds.begin(), feeds.end(), [&](const Tensor* f) { return f->device == dev; })) return feeds;
  staging_buffers_.resize(feeds.size());
  staging_.resize(feeds.size());
  staged_.assign(feeds.begin(), feeds.end());
  for (size_t i = 0; i < feeds.size(); ++i) {
    const Tensor& f = *feeds[i];
    if (f.device == dev) continue;
    Tensor& buf = staging_buffers_[i];
    if (buf.nbytes() < f.nbytes()) buf = Tensor::empty(DType::UInt8, {static_cast<int64_t>(f.nbytes())}, dev);
    Tensor& v = staging_[i];  // fields assigned, not a fresh view: the shape keeps its capacity between runs
    v.dtype = f.dtype;
    v.device = dev;
    v.shape.assign(f.shape.begin(), f.shape.end());
    v.data = buf.data;
    copy_bytes(buf.data, dev, f.data, f.device, f.nbytes());
    staged_[i] = &staging_[i];
  }
  return staged_;
}

std::vector<Tensor> Executor::run(const std::map<std::string, Tensor>& feeds) {
  std::vector<const Tensor*> ordered;
  for (const std::string& name : feed_names_) {
    auto it = feeds.find(name);
    if (it == feeds.end()) {
      std::string all;
      for (const std::string& n : feed_names_) all += (all.empty() ? "" : ", ") + n;
      fail("input '" + name + "'", "missing; the graph expects: " + all);
    }
    ordered.push_back(&it->second);
  }
  for (const auto& [name, t] : feeds)
    if (std::find(feed_names_.begin(), feed_names_.end(), name) == feed_names_.end())
      fail("input '" + name + "'", "is not an input of the graph");
  std::vector<Tensor> result;
  for (const Tensor* t : run(std::span<const Tensor* const>(ordered))) result.push_back(t->to(Device::CPU));
  return result;
}

std::vector<StepTime> Executor::profile() const {
  std::vector<StepTime> all;
  std::map<std::string, size_t> at;
  for (const CachedPlan& c : plans_)
    for (const StepTime& t : c.plan->profile()) {
      auto [it, fresh] = at.emplace(t.step, all.size());
      if (fresh) {
        all.push_back(t);
      } else {
        all[it->second].calls += t.calls;
        all[it->second].seconds += t.seconds;
      }
    }
  std::stable_sort(all.begin(), all.end(), [](const StepTime& a, const StepTime& b) { return a.seconds > b.seconds; });
  return all;
}

}  // namespace onnxtrain
