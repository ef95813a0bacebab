// TrainingSession and ForwardBackwardSession. Each call converts its arguments with the GIL held, then runs the
// native code with the GIL released and the session's mutex held (a session is not reentrant; the mutex makes
// concurrent calls from Python threads queue instead of racing), then converts the results with the GIL again.
#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>

#include <pybind11/stl.h>

#include "convert.h"
#include "executor/device.h"
#include "graph/error.h"
#include "graph/model_io.h"
#include "training/epoch.h"
#include "training/forward_backward.h"
#include "training/replicas.h"
#include "training/session.h"

namespace onnxtrain::py_binding {

namespace {

// Every device name goes through parse_device (executor/device.h), which also reports a missing CUDA.
Device device_from(const py::handle& d) {
  if (d.is_none()) return parse_device(default_device_name());
  if (py::isinstance<Device>(d)) return parse_device(device_name(d.cast<Device>()));
  if (py::isinstance<py::str>(d)) return parse_device(d.cast<std::string>());
  raise_type_error("device: expected 'cpu', 'cuda', 'cuda:N' or onnxtrain.Device, got " + std::string(py::str(d.get_type())));
}

// State shared by both session wrappers: the model's interface and a lock.
struct Interface {
  std::string source;
  std::vector<std::string> input_names, output_names;
  std::map<std::string, DType> feed_types, weight_types;
  std::vector<DType> output_types;

  void describe(const Graph& g) {
    input_names = model_input_names(g);
    feed_types = input_dtypes(g);
    output_names.clear();
    output_types.clear();
    for (const ValueInfo& v : g.outputs) {
      output_names.push_back(v.name);
      output_types.push_back(v.type.dtype);
    }
    for (const auto& [name, t] : g.initializers) weight_types[name] = t.dtype;
  }
  DType weight_type(const std::string& name) const {
    auto it = weight_types.find(name);
    return it == weight_types.end() ? DType::Undefined : it->second;
  }
};

template <class Session>
struct Locked {
  std::shared_ptr<Session> s;
  std::mutex mu;
  Interface io;

  // Runs f(session) without the GIL and with the lock.
  template <class F>
  auto run(F&& f) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lock(mu);
    return f(*s);
  }
  py::array get_weight(const std::string& name) {
    return to_numpy(run([&](Session& s) { return s.get_weight(name); }));
  }
  py::dict weights() {
    return to_numpy(run([](Session& s) { return s.weights(); }));
  }
  void set_weight(const std::string& name, const py::handle& value) {
    std::vector<py::object> keep;
    Tensor t = to_tensor(value, io.weight_type(name), "weight '" + name + "'", keep);
    run([&](Session& s) { s.set_weight(name, t); });
  }
};

// Python's TrainingSession: any Session (training/session_interface.h). With replicas it is a ReplicatedSession,
// which reaches every replica with the calls that change weights or state; nothing here tells the kinds apart
// after construction.
struct PyTraining : Locked<Session> {
  // The training feeds: the model's inputs plus the loss target (and sample weights), with their dtypes.
  void describe_feeds() {
    for (const ValueInfo& v : s->training_graph().inputs)
      if (v.type.dtype != DType::Undefined && !s->training_graph().is_initializer(v.name)) io.feed_types[v.name] = v.type.dtype;
  }
};

// The forward-backward session runs on a store the binding owns, so a weight can be bound to memory outside it
// (a torch Parameter): the executors then read the caller's buffer in place, and an optimizer's in-place update
// is seen by the next run_forward with no copy at all.
struct PyForwardBackward : Locked<ForwardBackwardSession> {
  std::shared_ptr<TensorStore> store = std::make_shared<TensorStore>();
  std::map<std::string, std::vector<py::object>> bound;  // keeps each bound buffer alive

  void bind_weight(const std::string& name, const py::handle& value) {
    const std::vector<std::string>& trainable = s->trainable();
    if (std::find(trainable.begin(), trainable.end(), name) == trainable.end())
      fail("weight '" + name + "'", "is not a trainable weight of this session (only those can be bound)");
    std::vector<py::object> keep;
    Tensor view = to_tensor(value, io.weight_type(name), "weight '" + name + "'", keep);
    // Bound memory must be the caller's own: a layout that had to be copied would silently stop tracking it.
    const bool in_place = !keep.empty() && (py::isinstance<py::capsule>(keep.back()) || keep.back().is(value));
    if (!in_place)
      throw py::type_error("weight '" + name + "': binding needs a C-contiguous, aligned CPU array or DLPack tensor "
                           "of dtype " + dtype_name(io.weight_type(name)) + " (this value would have to be copied)");
    run([&](ForwardBackwardSession&) {
      Tensor& slot = store->at(name);
      if (view.shape != slot.shape)
        fail("weight '" + name + "'", "expected " + slot.describe() + ", got " + view.describe());
      if (view.device != slot.device)
        fail("weight '" + name + "'", "the session runs on " + device_name(slot.device) + "; bound memory must be there too, got " +
                                          device_name(view.device) + " memory");
      // Plans hold the slot's address and read its data pointer at run time, so updating the slot in place
      // rebinds every compiled plan.
      slot = view;
    });
    bound[name] = std::move(keep);
  }
};

std::unique_ptr<PyTraining> make_training(const py::handle& model, TrainingConfig config, int replicas) {
  auto p = std::make_unique<PyTraining>();
  Model m = load_model_from(model, p->io.source);
  p->io.describe(m.graph);
  py::gil_scoped_release nogil;
  if (replicas != 1) p->s = std::make_shared<ReplicatedSession>(m, config, replicas);
  else p->s = std::make_shared<TrainingSession>(std::move(m), std::move(config));
  p->describe_feeds();
  return p;
}

// `distributed`: how the resumed session reduces gradients. It is not read from the checkpoint (the schema does
// not store distributed.*: it belongs to the run, not to the model), so the caller says it again, as the CLI does
// from its config.
std::unique_ptr<PyTraining> from_checkpoint(const py::handle& checkpoint, std::shared_ptr<Communicator> parallel,
                                            int replicas, DataParallelSpec dp) {
  auto p = std::make_unique<PyTraining>();
  dp.communicator = std::move(parallel);
  if (replicas != 1 && dp.communicator)
    fail("replicas", "replicas bring their own communicator; give either parallel or replicas, not both");
  Model m;
  const bool is_path = py::isinstance<py::str>(checkpoint) || py::hasattr(checkpoint, "__fspath__");
  if (is_path) p->io.source = fspath(checkpoint, "checkpoint");
  else m = load_model_from(checkpoint, p->io.source);
  py::gil_scoped_release nogil;
  auto resume = [&](const DataParallelSpec& replica) {
    DataParallelSpec spec = dp;  // the options; a replica brings its own communicator
    if (replicas != 1) spec.communicator = replica.communicator;
    return is_path ? TrainingSession::from_checkpoint(p->io.source, spec)
                   : TrainingSession::from_checkpoint(m, p->io.source, spec);
  };
  if (replicas != 1) p->s = std::make_shared<ReplicatedSession>(replicas, resume);
  else p->s = std::make_shared<TrainingSession>(resume(dp));
  Model inference = p->s->export_inference();
  p->io.describe(inference.graph);
  p->describe_feeds();
  return p;
}

// Thrown from inside the native epoch when Python has a pending signal (Ctrl-C): the Python error is already set.
struct PythonSignal {};

template <class T>
py::array_t<T> array_of(const std::vector<T>& v) {
  py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

py::dict py_train_epoch(PyTraining& self, const py::handle& data, int64_t batch_size, const py::handle& order,
                        const py::handle& sample_weight, const std::string& sample_weight_feed,
                        bool weights_sum_to_one, std::vector<std::string> squares_of, int64_t interrupt_at_step) {
  // Every array is converted once per epoch; each batch is then a view or a gathered copy made natively.
  Feeds f = to_feeds(data, self.io.feed_types, "train_epoch");
  EpochSpec spec;
  spec.batch_size = batch_size;
  spec.sample_weight_feed = sample_weight_feed;
  spec.weights_sum_to_one = weights_sum_to_one;
  spec.squares_of = std::move(squares_of);
  if (!order.is_none()) {
    py::array o = py::module_::import("numpy").attr("asarray")(order);
    const char kind = o.dtype().kind();
    if ((kind != 'i' && kind != 'u') || o.ndim() != 1)
      raise_type_error("order: expected a 1-D array of integer row indices, got dtype " + std::string(py::str(o.dtype())) +
                       " with " + std::to_string(o.ndim()) + " dimensions");
    auto idx = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(o);
    spec.order.assign(idx.data(), idx.data() + idx.size());
  }
  std::optional<Tensor> weights;
  if (!sample_weight.is_none()) weights = to_tensor(sample_weight, DType::Undefined, "sample_weight", f.keep);
  // Ctrl-C: the signal handler only flags it; look at most every 50 ms (taking the GIL each step would make the
  // loop wait for any other Python thread). The steps before it stay applied, as when a Python loop is stopped.
  // interrupt_at_step: a Ctrl-C delivered at a known step (PyErr_SetInterrupt is what the SIGINT handler does),
  // then checked at once; from there on it is the real path.
  auto last = std::chrono::steady_clock::now();
  int64_t step = 0;
  spec.before_step = [&last, &step, interrupt_at_step] {
    const bool interrupt = step++ == interrupt_at_step;
    if (interrupt) PyErr_SetInterrupt();
    const auto now = std::chrono::steady_clock::now();
    if (!interrupt && now - last < std::chrono::milliseconds(50)) return;
    last = now;
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw PythonSignal{};
  };
  EpochResult r;
  try {
    const Tensor* w = weights ? &*weights : nullptr;
    r = self.run([&](Session& s) { return onnxtrain::train_epoch(s, f.tensors, w, spec); });
  } catch (const PythonSignal&) {
    throw py::error_already_set();
  }
  py::dict out;
  out["loss"] = array_of(r.losses);
  out["rows"] = array_of(r.rows);
  out["weight_sum"] = array_of(r.weight_sums);
  out["squares"] = array_of(r.squares);
  return out;
}

py::bytes serialized(PyTraining& self, Model (Session::*what)() const) {
  std::string bytes = self.run([&](Session& s) { return serialize_model((s.*what)()); });
  return py::bytes(bytes);
}

template <class Save>
void saved_to(PyTraining& self, const py::handle& path, Save save) {
  std::string p = fspath(path, "path");
  self.run([&](Session& s) { save(s, p); });
}

// One gradient per model output (None = zeros), converted with the output's dtype; `keep` holds any copies.
template <class Io>
std::vector<std::optional<Tensor>> output_grads_from(const Io& io, const py::sequence& output_grads,
                                                     std::vector<py::object>& keep) {
  std::vector<std::optional<Tensor>> grads;
  for (size_t i = 0; i < output_grads.size(); ++i) {
    py::object g = output_grads[i];
    const DType want = i < io.output_types.size() ? io.output_types[i] : DType::Undefined;
    std::string what = "gradient of output " +
                       (i < io.output_names.size() ? "'" + io.output_names[i] + "'" : std::to_string(i));
    grads.push_back(g.is_none() ? std::nullopt : std::optional<Tensor>(to_tensor(g, want, what, keep)));
  }
  return grads;
}

template <class Cls, class P>
void bind_common(Cls& cls) {
  cls.def_property_readonly("input_names", [](P& self) { return self.io.input_names; },
                            "The model's inputs (graph inputs that are not initializers), in order.")
      .def_property_readonly("output_names", [](P& self) { return self.io.output_names; }, "The model's outputs.")
      .def_property_readonly("trainable", [](P& self) { return self.s->trainable(); }, "The trained initializers.")
      .def("get_weight", &P::get_weight, py::arg("name"), "A copy of one trainable weight.")
      .def("weights", &P::weights, "Copies of every trainable weight, by name.")
      .def("set_weight", &P::set_weight, py::arg("name"), py::arg("value"),
           "Overwrites a trainable weight (same dtype and shape).")
      .def("set_weights", [](P& self, const py::dict& values) {
             for (auto [k, v] : values) self.set_weight(std::string(py::str(k)), v);
           }, py::arg("values"), "set_weight for every entry of a dict.");
}

}  // namespace

void bind_sessions(py::module_& m) {
  py::class_<PyTraining> ts(m, "TrainingSession", R"(Trains an ONNX model: loss, backward and optimizer run natively.

TrainingSession(model, config): model is a path, bytes or onnx.ModelProto; config a TrainingConfig.
The feeds of train_step/gradients are the model's inputs plus the loss target (target_name).)");
  ts.def(py::init([](const py::handle& model, TrainingConfig config, std::shared_ptr<Communicator> parallel,
                     int replicas) {
           // Data-parallel when the communicator has more than one rank (docs/distributed.md); replicas: in
           // this process, over threads (training/replicas.h).
           config.parallel.communicator = std::move(parallel);
           return make_training(model, std::move(config), replicas);
         }),
         py::arg("model"), py::arg("config") = TrainingConfig{}, py::arg("parallel") = nullptr, py::arg("replicas") = 1)
      .def_static("from_checkpoint", &from_checkpoint, py::arg("checkpoint"), py::arg("parallel") = nullptr,
                  py::arg("replicas") = 1, py::arg("distributed") = DataParallelSpec{},
                  "Rebuilds the session a checkpoint (path, bytes or ModelProto) was saved from; parallel: a "
                  "Communicator to resume data-parallel; replicas: to resume on that many one-thread replicas; "
                  "distributed: how gradients are reduced (a DataParallelSpec; not stored in checkpoints).")
      .def_property_readonly("replicas", [](PyTraining& self) { return self.s->replicas(); },
                             "One-thread replicas that split each batch (1: one session on OpenMP's threads).")
      .def_property_readonly("communicator", [](PyTraining& self) { return self.s->communicator(); },
                             "The Communicator of a data-parallel session, else None.")
      .def("train_step", [](PyTraining& self, const py::handle& feeds) {
             Feeds f = to_feeds(feeds, self.io.feed_types, "train_step");
             return self.run([&](Session& s) { return s.train_step(f.tensors); });
           }, py::arg("feeds"), "One optimizer step on a batch; returns the loss before the update.")
      .def("train_epoch", &py_train_epoch, py::arg("data"), py::arg("batch_size"), py::arg("order") = py::none(),
           py::arg("sample_weight") = py::none(), py::arg("sample_weight_feed") = "",
           py::arg("weights_sum_to_one") = false, py::arg("squares_of") = std::vector<std::string>{},
           py::arg("interrupt_at_step") = -1,
           "One epoch of train_step over whole-data-set arrays, looped natively without the GIL; returns per-batch\n"
           "arrays: loss, rows, weight_sum, squares (docs/python.md, 'Epochs in one call').")
      .def("infer", [](PyTraining& self, const py::handle& feeds) {
             Feeds f = to_feeds(feeds, self.io.feed_types, "infer");
             return to_numpy(self.run([&](Session& s) { return s.infer(f.tensors); }));
           }, py::arg("feeds"), "The model's outputs, in order, for these inputs.")
      .def("gradients", [](PyTraining& self, const py::handle& feeds) {
             Feeds f = to_feeds(feeds, self.io.feed_types, "gradients");
             Session::Gradients g = self.run([&](Session& s) { return s.gradients(f.tensors); });
             return py::make_tuple(g.loss, to_numpy(std::move(g.grads)));
           }, py::arg("feeds"), "(loss, {weight: gradient}) without updating anything.")
      .def("run_forward", [](PyTraining& self, const py::handle& feeds) {
             Feeds f = to_feeds(feeds, self.io.feed_types, "run_forward");
             return to_numpy(self.run([&](Session& s) { return s.run_forward(f.tensors); }));
           }, py::arg("feeds"),
           "The model's outputs for these inputs (no target); keeps what run_backward needs. Runs on the session's\n"
           "own weights, so train_step and set_weight are seen by the next call.")
      .def("run_backward", [](PyTraining& self, const py::sequence& output_grads) {
             std::vector<py::object> keep;
             auto grads = output_grads_from(self.io, output_grads, keep);
             return to_numpy(self.run([&](Session& s) { return s.run_backward(grads); }));
           }, py::arg("output_grads"),
           "One gradient per model output (None = zeros) for the last run_forward; returns {weight or input: gradient}\n"
           "for the trainable weights and the config's inputs_requiring_grad.")
      .def_property_readonly("target_name", [](PyTraining& self) { return self.s->target_name(); },
                             "The feed name of the loss target.")
      .def_property_readonly("feed_names", [](PyTraining& self) {
             std::vector<std::string> names;
             for (const ValueInfo& v : self.s->training_graph().inputs)
               if (!self.s->training_graph().is_initializer(v.name)) names.push_back(v.name);
             return names;
           }, "Every feed train_step needs: the model's inputs, the target, and 'sample_weight' if requested.")
      .def_property("learning_rate", [](PyTraining& self) { return self.run([](Session& s) { return s.learning_rate(); }); },
                    [](PyTraining& self, double lr) {
                      self.run([&](Session& s) { s.set_learning_rate(lr); });
                    },
                    "The default group's current learning rate.")
      .def_property_readonly("step", [](PyTraining& self) { return self.run([](Session& s) { return s.step(); }); },
                             "Optimizer updates applied so far.")
      .def("end_epoch", [](PyTraining& self, double loss) {
             self.run([&](Session& s) { s.end_epoch(loss); });
           },
           py::arg("mean_loss"), "Reports an epoch's mean training loss (the adaptive schedule reads it).")
      .def_property_readonly("loss_scale", [](PyTraining& self) { return self.run([](Session& s) { return s.loss_scale(); }); },
                             "Mixed precision: the current loss scale (0 without mixed precision).")
      .def_property_readonly("overflow_steps", [](PyTraining& self) {
             return self.run([](Session& s) { return s.overflow_steps(); });
           }, "Mixed precision: steps skipped because the loss or a gradient was not finite.")
      .def_property_readonly("skipped_steps", [](PyTraining& self) {
             return self.run([](Session& s) { return s.skipped_steps(); });
           }, "on_non_finite='skip': train_step calls whose loss or a gradient was NaN/Inf, so nothing was applied.")
      .def_property_readonly("last_skip_reason", [](PyTraining& self) {
             return self.run([](Session& s) { return s.last_skip_reason(); });
           }, "The report of the latest skipped step (step and tensor); '' before the first.")
      .def_property_readonly("train_step_calls", [](PyTraining& self) {
             return self.run([](Session& s) { return s.train_step_calls(); });
           }, "train_step calls so far (skipped ones and micro-batches included): the 'training step N' of a report.")
      .def("profile", [](PyTraining& self) {
             py::list rows;
             for (const StepTime& t : self.run([](Session& s) { return s.profile(); })) {
               py::dict r;
               r["step"] = t.step;
               r["op"] = t.op;
               r["calls"] = t.calls;
               r["seconds"] = t.seconds;
               rows.append(std::move(r));
             }
             return rows;
           }, "With profile=True: train_step's time per step of its plan, most expensive first (dicts with step, op, "
              "calls, seconds); [] without.")
      .def_property_readonly("arena_bytes", [](PyTraining& self) {
             return self.run([](Session& s) { return s.arena_bytes(); });
           }, "Bytes of the arena of train_step's latest plan (every intermediate value, placed by lifetime); 0 "
              "before the first step. memory='auto' reduces it (docs/memory.md).")
      .def_property_readonly("arena_update_bytes", [](PyTraining& self) {
             return self.run([](Session& s) { return s.arena_update_bytes(); });
           }, "Of arena_bytes, the optimizer's new weights and state (handed over to the store; batch-independent). "
              "arena_bytes - arena_update_bytes is the activations, gradients and temporaries at their peak.")
      .def("profile_report", [](PyTraining& self, size_t top) {
             return format_profile(self.run([](Session& s) { return s.profile(); }), top);
           }, py::arg("top") = 15, "The profile as text: the total per op, then the `top` most expensive steps.")
      .def_property_readonly("stop_requested", [](PyTraining& self) { return self.s->stop_requested(); },
                             "True when the schedule (adaptive) asks training to stop.")
      .def("state", [](PyTraining& self, const std::string& name) {
             return to_numpy(self.run([&](Session& s) { return s.state(name); }));
           }, py::arg("name"), "A copy of an optimizer state tensor ('optim.step', '<w>.exp_avg', ...).")
      .def_property_readonly("state_names", [](PyTraining& self) { return self.s->state_names(); })
      .def("export_inference", [](PyTraining& self) { return serialized(self, &Session::export_inference); },
           "The inference model with the current weights, serialized.")
      .def("export_inference", [](PyTraining& self, const py::handle& path) {
             saved_to(self, path, [](const Session& s, const std::string& p) { s.export_inference(p); });
           }, py::arg("path"), "Saves the inference model with the current weights (atomically).")
      .def("checkpoint", [](PyTraining& self) { return serialized(self, &Session::checkpoint); },
           "The trainable checkpoint (docs/checkpoint.md), serialized.")
      .def("save_checkpoint", [](PyTraining& self, const py::handle& path) {
             saved_to(self, path, [](const Session& s, const std::string& p) { s.save_checkpoint(p); });
           }, py::arg("path"), "Saves a trainable checkpoint (atomically).")
      .def("export_gradient_model", [](PyTraining& self) { return serialized(self, &Session::export_gradient_model); },
           "A standard ONNX model computing the loss and every weight's gradient, serialized.")
      .def("__repr__", [](PyTraining& self) {
             return "<onnxtrain.TrainingSession " + self.io.source + ", " + std::to_string(self.s->trainable().size()) +
                    " trainable weights>";
           });
  bind_common<decltype(ts), PyTraining>(ts);

  py::class_<PyForwardBackward> fb(m, "ForwardBackwardSession", R"(The model's forward and backward as two calls.

For an outside autograd (PyTorch): run_forward keeps the activations, run_backward takes one gradient per
model output (None = zeros) and returns the gradient of every trainable weight and input requiring grad.)");
  fb.def(py::init([](const py::handle& model, std::vector<std::string> trainable,
                     std::vector<std::string> inputs_requiring_grad, const py::handle& device) {
           auto p = std::make_unique<PyForwardBackward>();
           Device d = device_from(device);
           Model m = load_model_from(model, p->io.source);
           p->io.describe(m.graph);
           py::gil_scoped_release nogil;
           p->s = std::make_unique<ForwardBackwardSession>(std::move(m), std::move(trainable),
                                                           std::move(inputs_requiring_grad), d, p->store);
           return p;
         }),
         py::arg("model"), py::arg("trainable") = std::vector<std::string>{},
         py::arg("inputs_requiring_grad") = std::vector<std::string>{}, py::arg("device") = py::none())
      .def("run_forward", [](PyForwardBackward& self, const py::handle& feeds) {
             Feeds f = to_feeds(feeds, self.io.feed_types, "run_forward");
             return to_numpy(self.run([&](ForwardBackwardSession& s) { return s.run_forward(f.tensors); }));
           }, py::arg("feeds"), "The model's outputs; keeps what the backward pass needs.")
      .def("run_backward", [](PyForwardBackward& self, const py::sequence& output_grads) {
             std::vector<py::object> keep;
             auto grads = output_grads_from(self.io, output_grads, keep);
             return to_numpy(self.run([&](ForwardBackwardSession& s) { return s.run_backward(grads); }));
           }, py::arg("output_grads"),
           "One gradient per model output (None = zeros); returns {weight or input: gradient}.")
      .def("bind_weight", &PyForwardBackward::bind_weight, py::arg("name"), py::arg("value"),
           "Makes a trainable weight a view of `value` (a C-contiguous CPU array or DLPack tensor of its dtype and\n"
           "shape), read in place by every later run; the session keeps `value` alive. The caller must not change\n"
           "it between a run_forward and its run_backward. set_weight then writes into `value`.")
      .def_property_readonly("inputs_requiring_grad", [](PyForwardBackward& self) { return self.s->inputs_requiring_grad(); })
      .def("__repr__", [](PyForwardBackward& self) {
             return "<onnxtrain.ForwardBackwardSession " + self.io.source + ", " +
                    std::to_string(self.s->trainable().size()) + " trainable weights>";
           });
  bind_common<decltype(fb), PyForwardBackward>(fb);
}

}  // namespace onnxtrain::py_binding
