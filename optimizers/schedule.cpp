// Learning-rate schedules; the formulas and their references are in docs/schedules.md.
#include "optimizers/schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <sstream>

#include "graph/error.h"

namespace onnxtrain {
namespace {

std::string num(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

void check_step(int64_t step) {
  if (step < 0) fail("schedule", "step " + std::to_string(step) + " is negative; steps count from 0");
}

void expect_positive(const char* key, double v) {
  if (!(v > 0) || !std::isfinite(v)) fail(std::string("schedule.") + key, "expected a positive finite number, got " + num(v));
}

void expect_at_least(const char* key, int64_t v, int64_t lo, const std::string& why) {
  if (v < lo) fail(std::string("schedule.") + key, "expected >= " + std::to_string(lo) + why + ", got " + std::to_string(v));
}

// Linear ramp 0 -> 1 over the first `warmup` steps, as transformers' schedules do: step 0 has rate 0, so
// the first update of a warm-up schedule changes nothing.
double warmup_factor(int64_t k, int64_t warmup) { return static_cast<double>(k) / static_cast<double>(warmup); }

class Constant final : public LrSchedule {
 public:
  explicit Constant(double base) : base_(base) {}
  double lr(int64_t k) const override {
    check_step(k);
    return base_;
  }

 private:
  double base_;
};

class Step final : public LrSchedule {
 public:
  Step(double base, int64_t size, double gamma) : base_(base), size_(size), gamma_(gamma) {}
  double lr(int64_t k) const override {
    check_step(k);
    return base_ * std::pow(gamma_, static_cast<double>(k / size_));
  }

 private:
  double base_;
  int64_t size_;
  double gamma_;
};

class Exponential final : public LrSchedule {
 public:
  Exponential(double base, double gamma) : base_(base), gamma_(gamma) {}
  double lr(int64_t k) const override {
    check_step(k);
    return base_ * std::pow(gamma_, static_cast<double>(k));
  }

 private:
  double base_, gamma_;
};

class Cosine final : public LrSchedule {
 public:
  Cosine(double base, const ScheduleSpec& s)
      : base_(base), min_(s.min_lr), total_(s.total_steps), warmup_(s.warmup_steps) {}
  double lr(int64_t k) const override {
    check_step(k);
    if (k < warmup_) return base_ * warmup_factor(k, warmup_);
    // Held at the floor after total_steps (torch's CosineAnnealingLR would climb back up: it is periodic).
    if (k >= total_) return min_;
    const double progress = static_cast<double>(k - warmup_) / static_cast<double>(total_ - warmup_);
    return min_ + (base_ - min_) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }

 private:
  double base_, min_;
  int64_t total_, warmup_;
};

class Linear final : public LrSchedule {
 public:
  Linear(double base, const ScheduleSpec& s) : base_(base), total_(s.total_steps), warmup_(s.warmup_steps) {}
  double lr(int64_t k) const override {
    check_step(k);
    if (k < warmup_) return base_ * warmup_factor(k, warmup_);
    const int64_t decay = std::max<int64_t>(1, total_ - warmup_);
    return base_ * std::max(0.0, static_cast<double>(total_ - k) / static_cast<double>(decay));
  }

 private:
  double base_;
  int64_t total_, warmup_;
};

// scikit-learn's invscaling with t = k + 1: SGDClassifier/SGDRegressor's eta0 / t^power_t with one sample
// per update (t starts at 1), and MLP's SGDOptimizer.iteration_ends(time_step = k).
class InvScaling final : public LrSchedule {
 public:
  InvScaling(double base, double power) : base_(base), power_(power) {}
  double lr(int64_t k) const override {
    check_step(k);
    return base_ / std::pow(static_cast<double>(k) + 1.0, power_);
  }

 private:
  double base_, power_;
};

// scikit-learn's MLP adaptive rule (MLPClassifier._update_no_improvement_count + SGDOptimizer.trigger_stopping).
class Adaptive final : public LrSchedule {
 public:
  Adaptive(double base, double tol, int64_t patience) : lr_(base), tol_(tol), patience_(patience) {}
  double lr(int64_t k) const override {
    check_step(k);
    return lr_;
  }
  void end_epoch(double loss) override {
    if (loss > best_ - tol_)
      ++bad_epochs_;
    else
      bad_epochs_ = 0;
    if (loss < best_) best_ = loss;
    if (bad_epochs_ > patience_) {
      if (lr_ <= 1e-6) {
        stop_ = true;  // sklearn stops here instead of dividing further
      } else {
        lr_ /= 5.0;
        bad_epochs_ = 0;
      }
    }
  }
  bool stop_requested() const override { return stop_; }
  std::vector<double> state() const override {
    return {lr_, best_, static_cast<double>(bad_epochs_), stop_ ? 1.0 : 0.0};
  }
  void set_state(const std::vector<double>& s) override {
    if (s.size() != 4) fail("schedule state", "adaptive expects 4 values, got " + std::to_string(s.size()));
    lr_ = s[0];
    best_ = s[1];
    bad_epochs_ = static_cast<int64_t>(s[2]);
    stop_ = s[3] != 0;
  }

 private:
  double lr_, tol_;
  int64_t patience_;
  double best_ = std::numeric_limits<double>::infinity();
  int64_t bad_epochs_ = 0;
  bool stop_ = false;
};

}  // namespace

const std::vector<std::string>& schedule_kinds() {
  static const std::vector<std::string> k = {"constant", "step",       "exponential", "cosine",
                                             "linear",   "invscaling", "adaptive"};
  return k;
}

std::unique_ptr<LrSchedule> make_schedule(const ScheduleSpec& s, double base_lr) {
  if (!(base_lr > 0) || !std::isfinite(base_lr))
    fail("learning_rate", "expected a positive finite number, got " + num(base_lr));
  const std::string& k = s.kind;
  if (k == "constant") return std::make_unique<Constant>(base_lr);
  if (k == "step") {
    expect_at_least("step_size", s.step_size, 1, " for kind 'step'");
    expect_positive("gamma", s.gamma);
    return std::make_unique<Step>(base_lr, s.step_size, s.gamma);
  }
  if (k == "exponential") {
    expect_positive("gamma", s.gamma);
    return std::make_unique<Exponential>(base_lr, s.gamma);
  }
  if (k == "cosine" || k == "linear") {
    const std::string for_kind = " for kind '" + k + "'";
    expect_at_least("total_steps", s.total_steps, 1, for_kind);
    expect_at_least("warmup_steps", s.warmup_steps, 0, for_kind);
    if (s.warmup_steps > s.total_steps)
      fail("schedule.warmup_steps", "expected <= total_steps (" + std::to_string(s.total_steps) + "), got " +
                                        std::to_string(s.warmup_steps));
    if (k == "linear") return std::make_unique<Linear>(base_lr, s);
    if (!(s.min_lr >= 0) || !(s.min_lr <= base_lr))
      fail("schedule.min_lr", "expected a number in [0, learning_rate = " + num(base_lr) + "], got " + num(s.min_lr));
    return std::make_unique<Cosine>(base_lr, s);
  }
  if (k == "invscaling") {
    if (!(s.power_t >= 0) || !std::isfinite(s.power_t))
      fail("schedule.power_t", "expected a finite number >= 0, got " + num(s.power_t));
    return std::make_unique<InvScaling>(base_lr, s.power_t);
  }
  if (k == "adaptive") {
    if (!(s.tol >= 0) || !std::isfinite(s.tol)) fail("schedule.tol", "expected a finite number >= 0, got " + num(s.tol));
    expect_at_least("n_iter_no_change", s.n_iter_no_change, 1, " for kind 'adaptive'");
    return std::make_unique<Adaptive>(base_lr, s.tol, s.n_iter_no_change);
  }
  std::string valid;
  for (const std::string& v : schedule_kinds()) valid += (valid.empty() ? "" : ", ") + v;
  fail("schedule.kind", "unknown kind '" + k + "'; valid kinds: " + valid);
}

}  // namespace onnxtrain
