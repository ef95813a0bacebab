#include "training/session.h"
#include "training/weights.h"

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>

#include "executor/device.h"
#include "executor/finite.h"
#include "executor/transfer.h"
#include "gradients/builder.h"
#include "gradients/fused.h"
#include "graph/error.h"
#include "graph/expr.h"
#include "graph/model_io.h"
#include "graph/validate.h"
#include "training/checkpoint.h"
#include "training/fold_shapes.h"
#include "training/labels.h"

namespace onnxtrain {

namespace {

// The loss a step returns, read across the edge (it is a view on the session's device).
float scalar_of(const Tensor& t, std::string_view what) { return static_cast<float>(read_number(t, what)); }

}  // namespace

TrainingSession TrainingSession::from_file(const std::filesystem::path& model, TrainingConfig config) {
  return TrainingSession(load_model(model), std::move(config));
}

// The constructor's steps hand these along: the graphs being built and what each step leaves for the next.
struct TrainingSession::Build {
  int64_t dropout_steps = 0;                 // adapter dropout masks a checkpoint had drawn
  std::vector<std::string> adapter_weights;  // the LoRA factors, when adapter is active
  std::optional<Graph> compute;              // the model with mixed precision's casts, when asked for
  std::optional<Graph> dropped;              // the training forward with adapter dropout, when asked for
  std::string prediction;                    // the output the loss reads
  Graph gradients, step;                     // model + loss + backward; the same + optimizer
  std::optional<Graph> accumulate;           // the accumulate-only step, with gradient accumulation
  std::vector<std::string> step_checked, micro_checked;  // what each step checks for NaN/Inf
  std::vector<std::pair<std::string, std::string>> step_updates, accumulate_updates;  // (new value, state)
};

TrainingSession::TrainingSession(Model model, TrainingConfig config)
    : model_(std::move(model)),
      config_(std::move(config)),
      device_(parse_device(config_.device)),
      store_(std::make_shared<TensorStore>()) {
  Build b;
  adapt_model(b);            // adapters, static shapes; the model's large weights move to the store
  build_forward_graphs(b);   // mixed precision's casts; adapter dropout for training
  choose_trainable(b);       // which initializers train, and the checks on the configuration
  build_gradient_graph(b);   // + loss (+ penalty) + backward
  build_step_graphs(b);      // + collectives + optimizer; the accumulate-only step
  compile(b);                // one executor per graph, sharing the store
  if (config_.parallel.active()) synchronize_initial_state();  // rank 0's weights and state on every rank
}

const Graph& TrainingSession::forward_of(const Build& b) const { return b.compute ? *b.compute : model_.graph; }

void TrainingSession::adapt_model(Build& b) {
  // A checkpoint's model is the training forward, adapter dropout included: the session keeps the model without
  // it and adds it to its training graphs (build_forward_graphs), continuing from the steps drawn so far.
  const size_t nodes_before = model_.graph.nodes.size();
  b.dropout_steps = remove_lora_dropout(model_.graph);
  if (model_.graph.nodes.size() != nodes_before &&
      std::none_of(model_.graph.nodes.begin(), model_.graph.nodes.end(), [](const Node& n) { return n.domain == "onnxtrain"; }))
    model_.opset_imports.erase("onnxtrain");  // imported for DropoutMask alone: the exports do not need it
  fold_static_shapes(model_);  // exported slice bounds and pads become the constants gradient rules need
  validate_adapter(config_.adapter);
  if (config_.adapter.active()) {
    std::vector<LoraAdapter> adapters = find_lora(model_.graph);
    if (adapters.empty()) adapters = apply_lora(model_, config_.adapter);
    for (const LoraAdapter& a : adapters) b.adapter_weights.insert(b.adapter_weights.end(), {a.a, a.b});
  }
  keep_in_store(model_.graph);  // before the graphs below copy it
}

void TrainingSession::build_forward_graphs(Build& b) {
  validate_mixed_precision(config_.mixed_precision);
  const bool mixed = config_.mixed_precision.active();
  if (mixed) {
    if (config_.optimizer.gradient_accumulation > 1)
      fail("mixed_precision", "does not support optimizer.gradient_accumulation > 1 yet");
    if (config_.parallel.active()) fail("mixed_precision", "does not support data-parallel training yet");
    b.compute = model_.graph;
    apply_mixed_precision(*b.compute, half_dtype(config_.mixed_precision));
  }
  if (forward_of(b).outputs.empty()) fail("model", "has no outputs to train");
  // Adapter dropout exists in the training graphs only: inference, export and checkpoints' models compute the
  // adapters without it (as peft's eval mode does).
  if (config_.adapter.active() && config_.adapter.dropout != 0) {
    b.dropped = model_.graph;
    dropout_counter_ = add_lora_dropout(*b.dropped, config_.adapter);
    if (!dropout_counter_.empty()) b.dropped->initializers.at(dropout_counter_) = TensorData::scalar(b.dropout_steps);
    if (mixed) apply_mixed_precision(*b.dropped, half_dtype(config_.mixed_precision));
  }
}

void TrainingSession::choose_trainable(Build& b) {
  const Graph& g = forward_of(b);
  trainable_ = config_.trainable;
  if (!b.adapter_weights.empty()) {
    // The adapters, then the extra weights asked for (a new head); everything else is the frozen base.
    std::vector<std::string> chosen = b.adapter_weights;
    for (const std::string& w : trainable_)
      if (std::find(chosen.begin(), chosen.end(), w) == chosen.end()) chosen.push_back(w);
    trainable_ = std::move(chosen);
  } else if (trainable_.empty()) {
    for (const auto& [name, t] : g.initializers)
      if (is_floating(t.dtype)) trainable_.push_back(name);
    if (trainable_.empty()) fail("model", "has no floating-point initializers to train");
  }
  for (const std::string& w : trainable_) {
    auto it = g.initializers.find(w);
    if (it == g.initializers.end()) fail("trainable '" + w + "'", "is not an initializer of the model");
    if (!is_floating(it->second.dtype))
      fail("trainable '" + w + "'", "is " + dtype_name(it->second.dtype) + "; only floating-point weights train");
  }
  if (config_.on_non_finite != "raise" && config_.on_non_finite != "skip")
    fail("on_non_finite", "expected 'raise' or 'skip', got '" + config_.on_non_finite + "'");
  // check_every_value stops a rank at its own first NaN, before the allreduce the other ranks then wait in;
  // skipping there would leave the ranks one collective apart, mixing the next step's values.
  if (config_.check_every_value && config_.on_non_finite == "skip" && config_.parallel.active())
    fail("check_every_value", "cannot be combined with on_non_finite 'skip' in data-parallel training (a rank would "
                              "skip before a collective the others wait in); debug with on_non_finite 'raise'");
  validate_optimizer(config_.optimizer, trainable_);  // before anything else reads the learning rate
  b.prediction = config_.prediction.empty() ? g.outputs.front().name : config_.prediction;
  if (std::none_of(g.outputs.begin(), g.outputs.end(), [&](const ValueInfo& v) { return v.name == b.prediction; }))
    fail("prediction '" + b.prediction + "'", "is not an output of the model");
}

void TrainingSession::build_gradient_graph(Build& b) {
  const bool mixed = config_.mixed_precision.active();
  Graph& gg = b.gradients;
  gg = b.dropped ? *b.dropped : forward_of(b);
  LossGraph lg = append_loss(gg, b.prediction, config_.loss, model_.opset(""));
  target_ = lg.target;
  loss_ = lg.loss;
  if (auto r = label_range(config_.loss, forward_of(b).type_of(b.prediction), target_))
    labels_ = std::make_shared<LabelRange>(*r);
  if (config_.penalty.l1 != 0 || config_.penalty.l2 != 0) loss_ = append_penalty(gg, loss_, trainable_, config_.penalty);
  // Validated even when constant, so a bad key is reported rather than ignored.
  std::unique_ptr<LrSchedule> schedule = make_schedule(config_.schedule, config_.optimizer.learning_rate);
  if (config_.schedule.kind != "constant") schedule_ = std::move(schedule);
  GraphBuilder gb(gg, "seed/");
  Expr loss = value(gb, loss_);
  Expr seed = scalar(gb, loss.dtype(), 1.0);
  if (mixed) {
    if (loss.dtype() != DType::Float32)
      fail("mixed_precision", "needs a float32 loss; this model's loss is " + dtype_name(loss.dtype()));
    add_loss_scale_state(gg, config_.mixed_precision);
    seed = value(gb, kLossScale);  // the backward computes loss_scale * d(loss); unscaled below
  }
  GradientRequest req;
  req.wrt = trainable_;
  req.outputs = {loss_};
  req.output_grads = {seed.name};
  req.functions = model_.functions;
  req.recompute = recompute_policy(config_.memory, gg);
  GradientResult gr = build_gradients(gg, model_.opset_imports, req);
  grad_names_ = gr.grads;
  if (mixed) unscale_gradients(gg, grad_names_);
  gg.outputs.clear();
  gg.outputs.push_back({loss_, loss.type});
  for (const std::string& w : trainable_) gg.outputs.push_back({grad_names_.at(w), *gg.type_of(grad_names_.at(w))});
}

void TrainingSession::build_step_graphs(Build& b) {
  const bool mixed = config_.mixed_precision.active();
  Graph& tg = b.step;
  tg = b.gradients;
  tg.outputs.resize(1);
  std::map<std::string, std::string> step_grads = grad_names_;
  // Checked after the reduction: a NaN on one rank reaches every rank's reduced values, and all must skip it.
  // With accumulation and parallel.reduce_every_micro_batch false, the micro-batches stay local and the ranks
  // reduce the accumulated sums inside the update (one reduction per update); else each step's own gradients.
  const bool reduce_sums = config_.parallel.active() && config_.optimizer.gradient_accumulation > 1 &&
                           !config_.parallel.reduce_every_micro_batch;
  AccumulatedHook reduce_accumulated;
  std::map<std::string, std::string> reduced_sums;
  if (reduce_sums) {
    reduce_accumulated = [&](Graph& g, std::map<std::string, std::string>& sums) {
      reduce_gradients(g, sums);
      reduced_sums = sums;
      b.step_checked = describe_guarded(g.outputs.front().name, sums);
    };
  } else {
    reduce_gradients(tg, step_grads);
    b.step_checked = describe_guarded(tg.outputs.front().name, step_grads);
  }
  OptimizerGraph og = append_optimizer(tg, step_grads, config_.optimizer, OptimizerPhase::Update, reduce_accumulated);
  lr_name_ = og.learning_rate;
  group_lr_names_ = og.group_learning_rates;
  step_name_ = og.step;
  state_names_ = og.state;
  if (mixed) {
    std::vector<std::string> guarded;
    for (const std::string& w : trainable_) guarded.push_back((reduce_sums ? reduced_sums : step_grads).at(w));
    guard_updates_with_loss_scale(tg, tg.outputs.front().name, guarded, og.updates, config_.mixed_precision);
    for (const std::string& n : loss_scale_state_names()) state_names_.push_back(n);
  }
  // The dropout masks' counter: one more after every training step (an update or a micro-batch). Checkpoints
  // store it in their model (export_shell), so that a resumed run draws the masks the straight run would have.
  std::vector<std::pair<std::string, std::string>> counter_update;
  auto advance_counter = [&](Graph& step_graph) {
    if (dropout_counter_.empty()) return;
    GraphBuilder cb(step_graph, "lora/dropout/");
    const std::string next = cb.add("Add", {dropout_counter_, cb.constant(TensorData::scalar<int64_t>(1), "one")});
    cb.set_type(next, TypeInfo{DType::Int64, Shape{}});
    counter_update = {{next, dropout_counter_}};
  };
  advance_counter(tg);
  b.step_updates = og.updates;
  b.step_updates.insert(b.step_updates.end(), counter_update.begin(), counter_update.end());
  updates_ = b.step_updates;  // the checkpoint's update binding
  if (config_.optimizer.gradient_accumulation > 1) {
    Graph& ag = b.accumulate.emplace(b.gradients);
    ag.outputs.resize(1);
    // Reduced every micro-batch (the sum of the ranks' means is the mean of their sums), or kept local until the
    // update reduces their sum (reduce_sums).
    std::map<std::string, std::string> micro_grads = grad_names_;
    if (!reduce_sums) reduce_gradients(ag, micro_grads);
    b.micro_checked = describe_guarded(ag.outputs.front().name, micro_grads);
    OptimizerGraph accumulate_og = append_optimizer(ag, micro_grads, config_.optimizer, OptimizerPhase::AccumulateOnly);
    advance_counter(ag);  // the same value's name in both graphs
    b.accumulate_updates = accumulate_og.updates;
    b.accumulate_updates.insert(b.accumulate_updates.end(), counter_update.begin(), counter_update.end());
  }
  // With overlap: each reduction starts where its gradients are complete and is waited for where the optimizer
  // first reads it, now that the graphs are complete.
  place_collectives(tg);
  if (b.accumulate) place_collectives(*b.accumulate);
}

void TrainingSession::compile(Build& b) {
  // The optimizer state's initial values, for checkpoints; then every graph hands its tensors to the store.
  initialization_ = initialization_graph(b.step, state_names_);
  if (b.compute) keep_in_store(*b.compute);
  keep_in_store(b.gradients);
  keep_in_store(b.step);
  if (b.accumulate) keep_in_store(*b.accumulate);

  auto opsets = model_.opset_imports;
  opsets.emplace("onnxtrain", 1);  // fused gradient ops (ReluGrad, ...)
  ExecutorOptions eo;
  eo.device = device_;
  if (config_.parallel.active()) {
    registry_ = std::make_unique<KernelRegistry>(default_kernels());
    register_allreduce_kernel(*registry_, config_.parallel.communicator);
    eo.registry = registry_.get();
  }
  eo.variables.insert(trainable_.begin(), trainable_.end());
  eo.variables.insert(state_names_.begin(), state_names_.end());
  if (!dropout_counter_.empty()) eo.variables.insert(dropout_counter_);
  eo.check_every_value = config_.check_every_value;
  infer_ = std::make_unique<Executor>(forward_of(b), opsets, store_, eo);
  grad_ = std::make_unique<Executor>(std::move(b.gradients), opsets, store_, eo);
  // The steps that write state check the loss and every gradient before anything is written (with mixed
  // precision the graph itself keeps the state on such a step, and counts it).
  if (!config_.mixed_precision.active()) eo.must_be_finite = b.step_checked;
  eo.updates = b.step_updates;
  eo.profile = config_.profile;  // only the training step: the other executors serve other calls
  train_ = std::make_unique<Executor>(std::move(b.step), opsets, store_, eo);
  if (b.accumulate) {
    eo.must_be_finite = b.micro_checked;
    eo.updates = b.accumulate_updates;
    accumulate_ = std::make_unique<Executor>(std::move(*b.accumulate), opsets, store_, eo);
  }
}

std::vector<std::string> TrainingSession::describe_guarded(const std::string& loss,
                                                          const std::map<std::string, std::string>& grads) {
  const bool reduced = config_.parallel.active();
  const std::string suffix = reduced ? " (reduced over the data-parallel ranks)" : "";
  std::vector<std::string> checked = {loss};
  guarded_[loss] = "the loss" + suffix;
  for (const std::string& w : trainable_) {
    checked.push_back(grads.at(w));
    guarded_.emplace(grads.at(w), "the gradient of '" + w + "'" + suffix);
  }
  return checked;
}

void TrainingSession::reduce_gradients(Graph& step_graph, std::map<std::string, std::string>& grads) const {
  const DataParallelSpec& dp = config_.parallel;
  if (!dp.active()) return;
  // The AllReduce kernel hands the communicator the buffers its device's kernels see (the guarded test device's
  // kernels see host memory).
  if (dp.communicator->device() != kernel_device(device_))
    fail("parallel.communicator", "uses " + device_name(dp.communicator->device()) + " buffers but the session runs on " +
                                      device_name(device_));
  // A summed loss sums its gradients over the ranks' samples, as one process would over the whole batch.
  const ReduceOp op = config_.loss.reduction == "sum" ? ReduceOp::Sum : ReduceOp::Mean;
  if (op == ReduceOp::Sum && (config_.penalty.l1 != 0 || config_.penalty.l2 != 0))
    fail("penalty", "with loss.reduction 'sum' every rank would add the penalty once, counting it " +
                        std::to_string(dp.communicator->size()) +
                        " times in the summed gradient; use reduction 'mean' for data-parallel training with a penalty");
  std::vector<ReducedValue> values;
  std::set<std::string> seen;
  for (const std::string& w : trainable_) {
    const std::string& g = grads.at(w);
    const TensorData& t = step_graph.initializers.at(w);
    if (seen.insert(g).second) values.push_back({g, t.dtype, static_cast<size_t>(t.numel()) * dtype_size(t.dtype)});
  }
  const std::string loss = step_graph.outputs.front().name;
  // Exact: the reported loss is never compressed.
  values.push_back({loss, step_graph.type_of(loss)->dtype, dtype_size(step_graph.type_of(loss)->dtype), true});
  BucketOptions bo;
  bo.bucket_bytes = dp.bucket_bytes;
  bo.overlap = dp.overlap;
  bo.compression = dp.compression;
  const std::map<std::string, std::string> reduced = insert_allreduce(step_graph, values, op, bo);
  for (auto& [w, g] : grads) g = reduced.at(g);
  step_graph.outputs.front().name = reduced.at(loss);
}

// Every rank built the same graphs from the same configuration (checked, since a mismatch would otherwise
// show up as a hang or as silently different models); then rank 0's values win.
void TrainingSession::synchronize_initial_state() {
  Communicator& comm = *config_.parallel.communicator;
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  auto mix = [&](const std::string& s) {
    for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
    h = (h ^ 0xff) * 0x100000001b3ULL;
  };
  for (const auto& [k, v] : config_to_metadata(config_)) mix(k + "=" + v);
  for (const std::string& name : trainable_) mix(name + ":" + store_->at(name).describe());
  for (const std::string& name : state_names_) mix(name + ":" + store_->at(name).describe());
  for (const Node& n : train_->graph().nodes) mix(n.op_type);
  mix("compression=" + config_.parallel.compression);  // an attribute, not an op: the ranks must agree on it too
  check_same_on_all_ranks(comm, h, "the model, trainable weights or training configuration");
  // Outside kernels, so through the edge where the store's memory is not the communicator's kind.
  auto broadcast = [&](const std::string& name) {
    Tensor& t = store_->at(name);
    if (t.device == comm.device()) return comm.broadcast(t, 0);
    Tensor staged = t.to(comm.device());
    comm.broadcast(staged, 0);
    copy_into(t, staged, "'" + name + "' broadcast from rank 0");
  };
  for (const std::string& name : trainable_) broadcast(name);
  for (const std::string& name : state_names_) broadcast(name);
}

// By-name lookup into a reused pointer buffer, then the plan's own views: a steady-state step allocates nothing.
std::span<const Tensor* const> TrainingSession::order_feeds(Executor& ex, const Feeds& feeds) {
  const auto& names = ex.feed_names();
  feed_ptrs_.resize(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = feeds.find(names[i]);
    if (it == feeds.end()) {
      std::string all;
      for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
      fail("input '" + names[i] + "'", "missing; a training step needs: " + all);
    }
    feed_ptrs_[i] = &it->second;
  }
  if (feeds.size() != names.size())
    for (const auto& [name, t] : feeds)
      if (std::find(names.begin(), names.end(), name) == names.end())
        fail("input '" + name + "'", "is not an input of the model nor the loss target '" + target_ + "'");
  return feed_ptrs_;
}

float TrainingSession::train_step(const Feeds& feeds) {
  // N-1 micro-batches only add into the buffers; the N-th applies the update from their mean.
  Executor& ex = (accumulate_ && micro_ + 1 < config_.optimizer.gradient_accumulation) ? *accumulate_ : *train_;
  if (schedule_ && &ex == train_.get()) set_learning_rate(schedule_->lr(step()));
  ++step_calls_;
  if (labels_)
    if (auto it = feeds.find(target_); it != feeds.end()) check_labels(*labels_, it->second);
  float loss;
  try {
    loss = scalar_of(*ex.run(order_feeds(ex, feeds))[0], "loss");
  } catch (const NonFiniteError& e) {
    skip_or_raise(e);
    return std::numeric_limits<float>::quiet_NaN();
  }
  micro_ = (&ex == train_.get()) ? 0 : micro_ + 1;
  return loss;
}

void TrainingSession::skip_or_raise(const NonFiniteError& e) {
  auto it = guarded_.find(e.value());
  const std::string what = it != guarded_.end() ? it->second : "value '" + e.value() + "'";
  std::string msg = "training step " + std::to_string(step_calls_) + " (optimizer step " + std::to_string(step() + 1) +
                    "): " + what + " went non-finite, so the step's update was not applied [" + e.what() + "]";
  if (config_.on_non_finite == "raise") throw NonFiniteError(msg, e.value());
  ++skipped_steps_;
  last_skip_reason_ = std::move(msg);
}

std::vector<Tensor> TrainingSession::infer(const Feeds& inputs) { return infer_->run(inputs); }

TrainingSession::Gradients TrainingSession::gradients(const Feeds& feeds) {
  if (labels_)
    if (auto it = feeds.find(target_); it != feeds.end()) check_labels(*labels_, it->second);
  std::vector<Tensor> out = grad_->run(feeds);
  Gradients r;
  r.loss = scalar_of(out.at(0), "loss");
  for (size_t i = 0; i < trainable_.size(); ++i) r.grads[trainable_[i]] = std::move(out[i + 1]);
  return r;
}

Tensor TrainingSession::get_weight(const std::string& name) const { return get_trainable(*store_, trainable_, name); }

const Tensor& TrainingSession::weight_value(const std::string& name) const {
  if (std::find(trainable_.begin(), trainable_.end(), name) == trainable_.end())
    fail("weight '" + name + "'", "is not a trainable weight of this session");
  return store_->at(name);
}

std::map<std::string, Tensor> TrainingSession::weights() const { return copy_trainable(*store_, trainable_); }

void TrainingSession::set_weight(const std::string& name, const Tensor& value) {
  set_trainable(*store_, trainable_, name, value);
}

double TrainingSession::learning_rate() const { return read_scalar<double>(store_->at(lr_name_), "learning rate"); }

void TrainingSession::set_learning_rate(double lr) {
  if (!(lr >= 0) || !std::isfinite(lr)) fail("learning_rate", "expected a finite number >= 0, got " + std::to_string(lr));
  const OptimizerSpec& o = config_.optimizer;
  write_scalar<double>(store_->at(lr_name_), lr, "learning rate");
  for (size_t k = 0; k < group_lr_names_.size(); ++k) {
    const double base = o.groups[k].learning_rate.value_or(o.learning_rate);
    // Exactly the configured rate when lr is the configured default: no rounding from the ratio.
    write_scalar<double>(store_->at(group_lr_names_[k]), lr == o.learning_rate ? base : base * (lr / o.learning_rate),
                         group_lr_names_[k]);
  }
}

void TrainingSession::end_epoch(double mean_loss) {
  if (schedule_) schedule_->end_epoch(mean_loss);
}

bool TrainingSession::stop_requested() const { return schedule_ && schedule_->stop_requested(); }

int64_t TrainingSession::step() const { return read_scalar<int64_t>(store_->at(step_name_), "optimizer step"); }

float TrainingSession::loss_scale() const {
  return config_.mixed_precision.active() ? read_scalar<float>(store_->at(kLossScale), kLossScale) : 0.0f;
}

int64_t TrainingSession::overflow_steps() const {
  return config_.mixed_precision.active() ? read_scalar<int64_t>(store_->at(kOverflowSteps), kOverflowSteps) : 0;
}

Tensor TrainingSession::state(const std::string& name) const {
  if (std::find(state_names_.begin(), state_names_.end(), name) == state_names_.end()) {
    std::string all;
    for (const std::string& n : state_names_) all += (all.empty() ? "" : ", ") + n;
    fail("optimizer state '" + name + "'", "does not exist; this session has: " + all);
  }
  return store_->at(name).to(Device::CPU);
}

void TrainingSession::keep_in_store(Graph& g) {
  // Small ones stay: gradient rules read the values of constants such as Resize scales or GELU's coefficients.
  constexpr size_t kMinBytes = 1024;
  for (auto& [name, t] : g.initializers) {
    if (!is_floating(t.dtype) || is_hollow(t) || t.bytes.size() < kMinBytes) continue;
    // Same name, same tensor: each executor would put only the first it sees in the store as well.
    if (!store_->count(name)) {
      Tensor x = Tensor::from_data(t);
      (*store_)[name] = device_ == Device::CPU ? std::move(x) : x.to(device_);
    }
    std::vector<std::byte>().swap(t.bytes);  // freed now, one tensor at a time: no moment holds two copies
  }
}

TensorData TrainingSession::stored_or_hollow(const std::string& name) const {
  const Tensor& t = store_->at(name);
  if (device_ != Device::CPU) return t.to_data();
  return TensorData{t.dtype, t.shape, {}};
}

TensorBytes TrainingSession::stored_bytes() const {
  return [store = store_](const std::string& name) -> std::span<const std::byte> {
    auto it = store->find(name);
    if (it == store->end() || !host_accessible(it->second.device)) return {};
    return {static_cast<const std::byte*>(it->second.data), it->second.nbytes()};
  };
}

Model TrainingSession::export_shell() const {
  Model m = inference_shell();
  if (dropout_counter_.empty()) return m;
  // A checkpoint's model is the training step's forward: with adapter dropout, the training graph's dropout
  // nodes and the counter at its current value (from_checkpoint removes them again).
  add_lora_dropout(m.graph, config_.adapter);
  m.graph.initializers[dropout_counter_] = stored_or_hollow(dropout_counter_);
  m.opset_imports.emplace("onnxtrain", 1);  // DropoutMask's domain
  return m;
}

Model TrainingSession::inference_shell() const {
  Model m = model_;  // large floating-point initializers are hollow: the store holds them
  for (auto& [name, t] : m.graph.initializers)
    if (is_hollow(t)) t = stored_or_hollow(name);
  for (const std::string& w : trainable_) m.graph.initializers[w] = stored_or_hollow(w);  // the current values
  m.training_info.clear();  // a session built from a checkpoint file still exports a clean inference model
  return m;
}

Model TrainingSession::export_inference() const {
  Model m = inference_shell();
  for (auto& [name, t] : m.graph.initializers)
    if (is_hollow(t)) t = store_->at(name).to_data();
  return m;
}

void TrainingSession::export_inference(const std::filesystem::path& path) const {
  if (!writes_files()) return;
  save_model_large(inference_shell(), path, {}, stored_bytes());
}

Model TrainingSession::export_gradient_model() const {
  Model m = export_inference();
  Graph g = grad_->graph();
  g.initializers = m.graph.initializers;
  g.name = m.graph.name + "_gradients";
  m.graph = std::move(g);
  // Fused ops used by the graph travel as functions. Their bodies import the model's ai.onnx opset, since
  // runtimes expect a function and its caller to agree on it.
  const int64_t onnx_opset = std::max<int64_t>(m.opset(""), 13);
  m.opset_imports[""] = onnx_opset;
  // Control-flow gradients (If, Loop, Scan) hold their fused ops inside subgraphs: look there too.
  std::function<bool(const Graph&, const Function&)> uses = [&](const Graph& gr, const Function& f) {
    return std::any_of(gr.nodes.begin(), gr.nodes.end(), [&](const Node& n) {
      if (n.op_type == f.name && n.domain == f.domain) return true;
      return std::any_of(n.attributes.begin(), n.attributes.end(), [&](const auto& a) {
        const auto* sub = std::get_if<std::shared_ptr<Graph>>(&a.second);
        return sub && *sub && uses(**sub, f);
      });
    });
  };
  // A fused op whose body would not compute what our kernel computes is refused, naming the node (the body's
  // limits: fused_body_refusal in gradients/fused.h).
  std::function<void(const Graph&)> refuse = [&](const Graph& gr) {
    for (const Node& n : gr.nodes) {
      const std::string why = fused_body_refusal(n);
      if (!why.empty()) fail(n.describe(), "cannot be exported with a standard-ONNX function body: " + why);
      for (const auto& a : n.attributes)
        if (const auto* sub = std::get_if<std::shared_ptr<Graph>>(&a.second); sub && *sub) refuse(**sub);
    }
  };
  refuse(m.graph);
  for (Function f : fused_grad_functions()) {
    if (!uses(m.graph, f)) continue;
    // A function must import its model's opset, and most bodies need a later one than 13 (CastLike is 15):
    // refuse, naming the opset that would do, rather than write a model the ONNX checker rejects.
    if (const std::string why = function_error_at_opset(f, onnx_opset); !why.empty()) {
      int64_t needs = onnx_opset + 1;
      while (needs <= f.opset_imports.at("") && !function_error_at_opset(f, needs).empty()) ++needs;
      fail("export_gradient_model", "the model imports ai.onnx opset " + std::to_string(onnx_opset) + ", and " +
                                        f.domain + "." + f.name + "'s standard-ONNX body needs opset " +
                                        std::to_string(needs) + " or later (" + why +
                                        "); export the model at opset " + std::to_string(needs) +
                                        " or later to get a portable gradient graph");
    }
    f.opset_imports[""] = onnx_opset;
    m.opset_imports[f.domain] = 1;
    m.functions.push_back(std::move(f));
  }
  return m;
}

// The Yield graphs share the weight store, so they always run on the weights train_step updates. Built lazily:
// most sessions never take this path, and building it costs a second gradient construction.
ForwardBackwardSession& TrainingSession::forward_backward() {
  if (!forward_backward_)
    forward_backward_ = std::make_unique<ForwardBackwardSession>(model_, trainable_, config_.inputs_requiring_grad,
                                                                 device_, store_, recompute_policy(config_.memory, model_.graph));
  return *forward_backward_;
}

std::vector<Tensor> TrainingSession::run_forward(const Feeds& inputs) { return forward_backward().run_forward(inputs); }

std::map<std::string, Tensor> TrainingSession::run_backward(const std::vector<std::optional<Tensor>>& output_grads) {
  return forward_backward().run_backward(output_grads);
}

}  // namespace onnxtrain
