// The configuration structs as Python classes: every field readable and writable, keyword (or positional, in
// field order) construction that rejects unknown options, repr, equality, copy and pickle (scikit-learn's
// clone deep-copies estimator parameters, so loss/optimizer objects must copy).
#include <memory>
#include <stdexcept>

#include <pybind11/stl.h>

#include "convert.h"
#include "executor/device.h"
#include "graph/model_io.h"
#include "losses/loss.h"
#include "losses/penalty.h"
#include "optimizers/optimizer.h"
#include "optimizers/schedule.h"
#include "training/config_schema.h"
#include "training/session.h"

namespace onnxtrain::py_binding {

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The help text of the schema option at this Python path (training/config_schema.h); a field the schema
// does not know fails at import, so a spec class cannot drift from the schema unnoticed.
const char* schema_help(const std::string& python_path) {
  for (const ConfigOption& o : config_options())
    if (o.applies_to(kWayPython) && o.python_path() == python_path) return o.help.c_str();
  throw std::logic_error("no Python option '" + python_path + "' in training/config_schema.cpp");
}

template <class T>
class SpecClass {
 public:
  // section: the Python path of this spec on TrainingConfig ("loss"), which prefixes its fields' schema paths.
  SpecClass(py::module_& m, const char* name, const char* doc, std::string section = "")
      : cls_(m, name, doc), name_(name), section_(std::move(section)),
        fields_(std::make_shared<std::vector<std::string>>()) {}

  template <class V>
  SpecClass& field(const char* name, V T::*member, const char* doc) {
    cls_.def_readwrite(name, member, doc);
    fields_->push_back(name);
    return *this;
  }
  // A field that is a schema option: its help comes from the schema.
  template <class V>
  SpecClass& option(const char* name, V T::*member) {
    return field(name, member, schema_help(section_.empty() ? name : section_ + "." + name));
  }

  py::class_<T>& finish() {
    auto fields = fields_;
    std::string cls_name = name_;
    auto build = [fields, cls_name](const py::args& args, const py::kwargs& kwargs) {
      if (args.size() > fields->size())
        raise_type_error(cls_name + ": takes at most " + std::to_string(fields->size()) + " positional arguments, got " +
                         std::to_string(args.size()));
      py::object obj = py::cast(T{});
      auto set = [&](const std::string& key, const py::handle& value) {
        try {
          obj.attr(key.c_str()) = value;
        } catch (py::error_already_set& e) {
          raise_type_error(cls_name + "." + key + ": cannot take " + std::string(py::repr(value)) + " (" + e.what() + ")");
        }
      };
      for (size_t i = 0; i < args.size(); ++i) set((*fields)[i], args[i]);
      for (auto [k, v] : kwargs) {
        std::string key = std::string(py::str(k));
        if (std::find(fields->begin(), fields->end(), key) == fields->end())
          raise_type_error(cls_name + ": unknown option '" + key + "'; expected one of: " + join(*fields));
        set(key, v);
      }
      return obj.cast<T>();
    };
    cls_.def(py::init(build));
    cls_.def("__repr__", [fields, cls_name](const py::object& self) {
      std::string s = cls_name + "(";
      for (size_t i = 0; i < fields->size(); ++i)
        s += (i ? ", " : "") + (*fields)[i] + "=" + std::string(py::repr(self.attr((*fields)[i].c_str())));
      return s + ")";
    });
    cls_.def("__eq__", [fields](const py::object& self, const py::object& other) {
      if (!py::isinstance<T>(other)) return false;
      for (const std::string& f : *fields)
        if (!self.attr(f.c_str()).equal(other.attr(f.c_str()))) return false;
      return true;
    });
    cls_.attr("__hash__") = py::none();
    cls_.def("to_dict", [fields](const py::object& self) {
      py::dict d;
      for (const std::string& f : *fields) d[py::str(f)] = self.attr(f.c_str());
      return d;
    }, "The fields as a dict (nested specs stay objects).");
    cls_.def("__copy__", [](const T& self) { return T(self); });
    cls_.def("__deepcopy__", [](const T& self, const py::dict&) { return T(self); }, py::arg("memo"));
    cls_.def(py::pickle(
        [fields](const py::object& self) {
          py::dict d;
          for (const std::string& f : *fields) d[py::str(f)] = self.attr(f.c_str());
          return d;
        },
        [build](const py::dict& d) { return build(py::args(py::tuple()), py::kwargs(d)); }));
    return cls_;
  }

 private:
  py::class_<T> cls_;
  std::string name_, section_;
  std::shared_ptr<std::vector<std::string>> fields_;
};

}  // namespace

void bind_specs(py::module_& m) {
  py::enum_<Device>(m, "Device", "Where a session runs.")
      .value("CPU", Device::CPU)
      .value("CUDA", Device::CUDA)
      .value("GUARDED", Device::Guarded);

  SpecClass<LossSpec>(m, "LossSpec", "A loss appended to the model's prediction (docs/losses.md).", "loss")
      .option("kind", &LossSpec::kind)
      .option("reduction", &LossSpec::reduction)
      .option("half", &LossSpec::half)
      .option("sample_weight", &LossSpec::sample_weight)
      .option("l1", &LossSpec::l1)
      .option("l2", &LossSpec::l2)
      .option("delta", &LossSpec::delta)
      .option("input", &LossSpec::input)
      .option("eps", &LossSpec::eps)
      .option("target_format", &LossSpec::target_format)
      .option("class_weights", &LossSpec::class_weights)
      .option("ignore_index", &LossSpec::ignore_index)
      .option("label_smoothing", &LossSpec::label_smoothing)
      .option("pos_weight", &LossSpec::pos_weight)
      .finish();

  SpecClass<PenaltySpec>(m, "PenaltySpec", "l1 * sum|w| + l2 * sum(w^2) over the trainable weights, added to the loss "
                                           "(no 1/2 on the l2 term; docs/losses.md).", "penalty")
      .option("l1", &PenaltySpec::l1)
      .option("l2", &PenaltySpec::l2)
      .finish();

  SpecClass<ParamGroup>(m, "ParamGroup", "Optimizer overrides for the weights whose names match (globs).")
      .field("match", &ParamGroup::match, "weight names or glob patterns ('*', '?')")
      .field("learning_rate", &ParamGroup::learning_rate, "None = the optimizer's")
      .field("weight_decay", &ParamGroup::weight_decay, "None = the optimizer's")
      .finish();

  SpecClass<OptimizerSpec>(m, "OptimizerSpec", "An optimizer appended to the training graph (docs/optimizers.md).",
                           "optimizer")
      .option("kind", &OptimizerSpec::kind)
      .option("learning_rate", &OptimizerSpec::learning_rate)
      .option("weight_decay", &OptimizerSpec::weight_decay)
      .option("momentum", &OptimizerSpec::momentum)
      .option("dampening", &OptimizerSpec::dampening)
      .option("nesterov", &OptimizerSpec::nesterov)
      .option("convention", &OptimizerSpec::convention)
      .option("beta", &OptimizerSpec::beta)
      .option("beta1", &OptimizerSpec::beta1)
      .option("beta2", &OptimizerSpec::beta2)
      .option("amsgrad", &OptimizerSpec::amsgrad)
      .option("eps", &OptimizerSpec::eps)
      .option("lr_decay", &OptimizerSpec::lr_decay)
      .option("initial_accumulator_value", &OptimizerSpec::initial_accumulator_value)
      .option("max_grad_norm", &OptimizerSpec::max_grad_norm)
      .option("gradient_accumulation", &OptimizerSpec::gradient_accumulation)
      .option("groups", &OptimizerSpec::groups)
      .finish();

  SpecClass<ScheduleSpec>(m, "ScheduleSpec", "A learning-rate schedule (docs/schedules.md).", "schedule")
      .option("kind", &ScheduleSpec::kind)
      .option("step_size", &ScheduleSpec::step_size)
      .option("gamma", &ScheduleSpec::gamma)
      .option("total_steps", &ScheduleSpec::total_steps)
      .option("warmup_steps", &ScheduleSpec::warmup_steps)
      .option("min_lr", &ScheduleSpec::min_lr)
      .option("power_t", &ScheduleSpec::power_t)
      .option("tol", &ScheduleSpec::tol)
      .option("n_iter_no_change", &ScheduleSpec::n_iter_no_change)
      .finish();

  SpecClass<MixedPrecisionSpec>(m, "MixedPrecisionSpec",
                                "Mixed precision with dynamic loss scaling (torch.amp.GradScaler's rule; docs/trainer.md).",
                                "mixed_precision")
      .option("dtype", &MixedPrecisionSpec::dtype)
      .option("init_scale", &MixedPrecisionSpec::init_scale)
      .option("growth_factor", &MixedPrecisionSpec::growth_factor)
      .option("backoff_factor", &MixedPrecisionSpec::backoff_factor)
      .option("growth_interval", &MixedPrecisionSpec::growth_interval)
      .finish();

  SpecClass<AdapterSpec>(m, "AdapterSpec", "Parameter-efficient fine-tuning: LoRA adapters beside frozen weights (docs/lora.md).",
                         "adapter")
      .option("kind", &AdapterSpec::kind)
      .option("rank", &AdapterSpec::rank)
      .option("alpha", &AdapterSpec::alpha)
      .option("dropout", &AdapterSpec::dropout)
      .option("target", &AdapterSpec::target)
      .option("seed", &AdapterSpec::seed)
      .finish();

  SpecClass<MemorySpec>(m, "MemorySpec", "Activation recomputation (docs/memory.md).", "memory")
      .option("recompute", &MemorySpec::recompute)
      .finish();

  SpecClass<DataParallelSpec>(m, "DataParallelSpec",
                              "How a data-parallel session (parallel=...) reduces gradients (docs/distributed.md); "
                              "the communicator is TrainingSession's parallel argument.",
                              "distributed")
      .option("overlap", &DataParallelSpec::overlap)
      .option("bucket_bytes", &DataParallelSpec::bucket_bytes)
      .option("compression", &DataParallelSpec::compression)
      .option("reduce_every_micro_batch", &DataParallelSpec::reduce_every_micro_batch)
      .finish();

  SpecClass<TrainingConfig>(m, "TrainingConfig", "Everything a TrainingSession is built from.")
      .option("trainable", &TrainingConfig::trainable)
      .option("inputs_requiring_grad", &TrainingConfig::inputs_requiring_grad)
      .option("prediction", &TrainingConfig::prediction)
      .field("loss", &TrainingConfig::loss, "LossSpec")
      .field("penalty", &TrainingConfig::penalty, "PenaltySpec")
      .field("optimizer", &TrainingConfig::optimizer, "OptimizerSpec")
      .field("schedule", &TrainingConfig::schedule, "ScheduleSpec")
      .field("mixed_precision", &TrainingConfig::mixed_precision, "MixedPrecisionSpec")
      .field("adapter", &TrainingConfig::adapter, "AdapterSpec")
      .field("memory", &TrainingConfig::memory, "MemorySpec")
      .field("device", &TrainingConfig::device, "'cpu', 'cuda' or 'cuda:N'")
      .option("on_non_finite", &TrainingConfig::on_non_finite)
      .option("check_every_value", &TrainingConfig::check_every_value)
      .option("profile", &TrainingConfig::profile)
      .field("distributed", &TrainingConfig::parallel, "DataParallelSpec")
      .finish();

  m.def("config_schema", [] {
    py::list out;
    for (const ConfigOption& o : config_options()) {
      py::dict d;
      d["key"] = o.key;
      d["kind"] = option_kind_name(o.kind);
      d["default"] = o.default_text;
      d["help"] = o.help;
      d["choices"] = o.choices;
      const bool ranged = o.kind == OptionKind::Integer || o.kind == OptionKind::Number ||
                          o.kind == OptionKind::OptionalNumber || o.kind == OptionKind::OptionalInteger;
      d["min"] = ranged ? py::object(py::float_(o.min)) : py::object(py::none());
      d["max"] = ranged ? py::object(py::float_(o.max)) : py::object(py::none());
      d["open_min"] = o.open_min;
      py::list ways;
      if (o.applies_to(kWayCli)) ways.append("cli");
      if (o.applies_to(kWayPython)) ways.append("python");
      if (o.applies_to(kWayCheckpoint)) ways.append("checkpoint");
      d["ways"] = ways;
      d["python"] = o.applies_to(kWayPython) ? py::object(py::str(o.python_path())) : py::object(py::none());
      d["checkpoint"] = o.applies_to(kWayCheckpoint) ? py::object(py::str(o.checkpoint_key())) : py::object(py::none());
      out.append(d);
    }
    return out;
  }, "Every TrainingConfig option (training/config_schema.h), in `onnxtrain config`'s order: a dict each with key "
     "(the CLI key), kind, default (as YAML), help, choices, min/max/open_min (numeric range), ways (cli, python, "
     "checkpoint), python (the attribute path on TrainingConfig) and checkpoint (the metadata key after 'onnxtrain.').");
  m.def("cuda_available", &cuda_available, "Built with CUDA and at least one CUDA device is visible.");
  m.def("cuda_unavailable_reason", &cuda_unavailable_reason,
        "Why device='cuda' cannot be used here ('' when it can): CUDA not compiled in, or no device visible.");
  m.def("loss_kinds", &loss_kinds, "Every loss kind (aliases included).");
  m.def("optimizer_kinds", &optimizer_kinds, "Every optimizer kind.");
  m.def("schedule_kinds", &schedule_kinds, "Every schedule kind.");
  m.def("merge_lora", [](const py::handle& model) {
    std::string source;
    Model mm = load_model_from(model, source);
    merge_lora(mm);
    return py::bytes(serialize_model(mm));
  }, py::arg("model"), "A model with LoRA adapters (path, bytes or ModelProto) with every adapter folded into its weight, "
                       "serialized: the base architecture with new weights (docs/lora.md).");
}

}  // namespace onnxtrain::py_binding
