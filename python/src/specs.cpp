// The configuration structs as Python classes: every field readable and writable, keyword (or positional, in
// field order) construction that rejects unknown options, repr, equality, copy and pickle (scikit-learn's
// clone deep-copies estimator parameters, so loss/optimizer objects must copy).
#include <memory>

#include <pybind11/stl.h>

#include "convert.h"
#include "executor/device.h"
#include "graph/model_io.h"
#include "losses/loss.h"
#include "losses/penalty.h"
#include "optimizers/optimizer.h"
#include "optimizers/schedule.h"
#include "training/session.h"

namespace onnxtrain::py_binding {

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

template <class T>
class SpecClass {
 public:
  SpecClass(py::module_& m, const char* name, const char* doc)
      : cls_(m, name, doc), name_(name), fields_(std::make_shared<std::vector<std::string>>()) {}

  template <class V>
  SpecClass& field(const char* name, V T::*member, const char* doc) {
    cls_.def_readwrite(name, member, doc);
    fields_->push_back(name);
    return *this;
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
  std::string name_;
  std::shared_ptr<std::vector<std::string>> fields_;
};

}  // namespace

void bind_specs(py::module_& m) {
  py::enum_<Device>(m, "Device", "Where a session runs.")
      .value("CPU", Device::CPU)
      .value("CUDA", Device::CUDA)
      .value("GUARDED", Device::Guarded);

  SpecClass<LossSpec>(m, "LossSpec", "A loss appended to the model's prediction (docs/losses.md).")
      .field("kind", &LossSpec::kind, "square (alias mse), absolute, elastic, huber, neg_log, cross_entropy, nll, "
                                      "bce_with_logits")
      .field("reduction", &LossSpec::reduction, "'mean' or 'sum'")
      .field("half", &LossSpec::half, "square: 0.5 * (p - t)^2 (scikit-learn's convention)")
      .field("sample_weight", &LossSpec::sample_weight, "add a 'sample_weight' input of shape [N]")
      .field("l1", &LossSpec::l1, "elastic: coefficient of |d|")
      .field("l2", &LossSpec::l2, "elastic: coefficient of d^2")
      .field("delta", &LossSpec::delta, "huber: quadratic below delta")
      .field("input", &LossSpec::input, "neg_log: 'probability' (default) or 'logits'")
      .field("eps", &LossSpec::eps, "neg_log: probability clipping; None = the dtype's epsilon (probabilities)")
      .field("target_format", &LossSpec::target_format, "cross_entropy/nll: 'indices' or 'probabilities'")
      .field("class_weights", &LossSpec::class_weights, "one weight per class; empty = all 1")
      .field("ignore_index", &LossSpec::ignore_index, "class index that contributes nothing; None = none")
      .field("label_smoothing", &LossSpec::label_smoothing, "cross_entropy, in [0, 1]")
      .field("pos_weight", &LossSpec::pos_weight, "bce_with_logits: weight of the positive term")
      .finish();

  SpecClass<PenaltySpec>(m, "PenaltySpec", "l1 * sum|w| + l2 * sum(w^2) over the trainable weights, added to the loss "
                                           "(no 1/2 on the l2 term; docs/losses.md).")
      .field("l1", &PenaltySpec::l1, "L1 coefficient, >= 0")
      .field("l2", &PenaltySpec::l2, "L2 coefficient, >= 0")
      .finish();

  SpecClass<ParamGroup>(m, "ParamGroup", "Optimizer overrides for the weights whose names match (globs).")
      .field("match", &ParamGroup::match, "weight names or glob patterns ('*', '?')")
      .field("learning_rate", &ParamGroup::learning_rate, "None = the optimizer's")
      .field("weight_decay", &ParamGroup::weight_decay, "None = the optimizer's")
      .finish();

  SpecClass<OptimizerSpec>(m, "OptimizerSpec", "An optimizer appended to the training graph (docs/optimizers.md).")
      .field("kind", &OptimizerSpec::kind, "'sgd', 'adam', 'adamw' or 'adagrad'")
      .field("learning_rate", &OptimizerSpec::learning_rate, "base learning rate")
      .field("weight_decay", &OptimizerSpec::weight_decay, "None = 0 (0.01 for adamw)")
      .field("momentum", &OptimizerSpec::momentum, "sgd")
      .field("dampening", &OptimizerSpec::dampening, "sgd, torch convention")
      .field("nesterov", &OptimizerSpec::nesterov, "sgd")
      .field("convention", &OptimizerSpec::convention, "sgd: 'torch' or 'onnx'")
      .field("beta", &OptimizerSpec::beta, "sgd, onnx convention")
      .field("beta1", &OptimizerSpec::beta1, "adam, adamw")
      .field("beta2", &OptimizerSpec::beta2, "adam, adamw")
      .field("amsgrad", &OptimizerSpec::amsgrad, "adam, adamw")
      .field("eps", &OptimizerSpec::eps, "adam, adamw, adagrad; None = torch's default")
      .field("lr_decay", &OptimizerSpec::lr_decay, "adagrad")
      .field("initial_accumulator_value", &OptimizerSpec::initial_accumulator_value, "adagrad")
      .field("max_grad_norm", &OptimizerSpec::max_grad_norm, "global-norm clipping; 0 = off")
      .field("gradient_accumulation", &OptimizerSpec::gradient_accumulation, "micro-batches per update")
      .field("groups", &OptimizerSpec::groups, "list of ParamGroup (assign a new list to change it)")
      .finish();

  SpecClass<ScheduleSpec>(m, "ScheduleSpec", "A learning-rate schedule (docs/schedules.md).")
      .field("kind", &ScheduleSpec::kind, "constant, step, exponential, cosine, linear, invscaling, adaptive")
      .field("step_size", &ScheduleSpec::step_size, "step")
      .field("gamma", &ScheduleSpec::gamma, "step, exponential")
      .field("total_steps", &ScheduleSpec::total_steps, "cosine, linear")
      .field("warmup_steps", &ScheduleSpec::warmup_steps, "cosine, linear")
      .field("min_lr", &ScheduleSpec::min_lr, "cosine")
      .field("power_t", &ScheduleSpec::power_t, "invscaling")
      .field("tol", &ScheduleSpec::tol, "adaptive")
      .field("n_iter_no_change", &ScheduleSpec::n_iter_no_change, "adaptive")
      .finish();

  SpecClass<MixedPrecisionSpec>(m, "MixedPrecisionSpec",
                                "Mixed precision with dynamic loss scaling (torch.amp.GradScaler's rule; docs/trainer.md).")
      .field("dtype", &MixedPrecisionSpec::dtype, "none, float16 or bfloat16")
      .field("init_scale", &MixedPrecisionSpec::init_scale, "initial loss scale")
      .field("growth_factor", &MixedPrecisionSpec::growth_factor, "scale *= this after growth_interval finite steps")
      .field("backoff_factor", &MixedPrecisionSpec::backoff_factor, "scale *= this on an overflowed (skipped) step")
      .field("growth_interval", &MixedPrecisionSpec::growth_interval, "finite steps in a row before the scale grows")
      .finish();

  SpecClass<AdapterSpec>(m, "AdapterSpec", "Parameter-efficient fine-tuning: LoRA adapters beside frozen weights (docs/lora.md).")
      .field("kind", &AdapterSpec::kind, "'none' or 'lora'")
      .field("rank", &AdapterSpec::rank, "rank of each adapter")
      .field("alpha", &AdapterSpec::alpha, "the adapter's update is scaled by alpha / rank")
      .field("dropout", &AdapterSpec::dropout, "dropout on the adapter branch's input (only 0 is supported yet)")
      .field("target", &AdapterSpec::target, "initializer names or globs of the weights to adapt; ['all-linear'] "
                                             "(or empty) = every MatMul/Gemm weight")
      .field("seed", &AdapterSpec::seed, "seed of A's Kaiming-uniform initialisation")
      .finish();

  SpecClass<MemorySpec>(m, "MemorySpec", "Activation recomputation (docs/memory.md).")
      .field("recompute", &MemorySpec::recompute, "[] or ['none'] (keep every activation), ['auto'] (keep segment "
                                                  "boundaries, recompute the rest), or forward node names/globs")
      .finish();

  SpecClass<TrainingConfig>(m, "TrainingConfig", "Everything a TrainingSession is built from.")
      .field("trainable", &TrainingConfig::trainable, "initializer names; empty = every floating-point initializer")
      .field("inputs_requiring_grad", &TrainingConfig::inputs_requiring_grad,
             "model inputs whose gradients run_backward also returns")
      .field("prediction", &TrainingConfig::prediction, "the output the loss reads; '' = the first output")
      .field("loss", &TrainingConfig::loss, "LossSpec")
      .field("penalty", &TrainingConfig::penalty, "PenaltySpec")
      .field("optimizer", &TrainingConfig::optimizer, "OptimizerSpec")
      .field("schedule", &TrainingConfig::schedule, "ScheduleSpec")
      .field("mixed_precision", &TrainingConfig::mixed_precision, "MixedPrecisionSpec")
      .field("adapter", &TrainingConfig::adapter, "AdapterSpec")
      .field("memory", &TrainingConfig::memory, "MemorySpec")
      .field("device", &TrainingConfig::device, "'cpu', 'cuda' or 'cuda:N'")
      .field("on_non_finite", &TrainingConfig::on_non_finite,
             "a NaN/Inf loss or gradient: 'raise' (OnnxtrainError naming step and tensor) or 'skip' (not applied, counted)")
      .field("check_every_value", &TrainingConfig::check_every_value,
             "debugging: check every intermediate value, so a report names the node that first went NaN/Inf")
      .field("profile", &TrainingConfig::profile, "time every step of train_step's plan (TrainingSession.profile())")
      .finish();

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
