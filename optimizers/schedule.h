#pragma once
// Learning-rate schedules. A schedule maps the optimizer step to a learning rate on the host; the session
// writes the value into the optimizer graph's learning-rate scalar before each step, so no plan is rebuilt.
//
// Steps count from 0: lr(k) is the rate for the (k+1)-th optimizer update, i.e. the rate torch's
// optimizer holds after k calls of scheduler.step() (stepped once after each optimizer.step()).
// docs/schedules.md has every formula and the reference each one is tested against.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace onnxtrain {

struct ScheduleSpec {
  std::string kind = "constant";  // one of schedule_kinds()
  int64_t step_size = 0;          // step: decay every step_size steps (required, >= 1)
  double gamma = 0.1;             // step, exponential: decay factor (> 0)
  int64_t total_steps = 0;        // cosine, linear: steps including warm-up (required, >= 1)
  int64_t warmup_steps = 0;       // cosine, linear: linear ramp from 0 over the first warmup_steps
  double min_lr = 0.0;            // cosine: the floor reached at total_steps and kept after it
  double power_t = 0.5;           // invscaling: lr0 / (k + 1)^power_t
  double tol = 1e-4;              // adaptive: an epoch improves when loss < best - tol
  int64_t n_iter_no_change = 10;  // adaptive: divide by 5 once more than this many epochs in a row did not
};

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  // The rate for step k >= 0 (throws Error for k < 0).
  virtual double lr(int64_t step) const = 0;
  // Called once per epoch with that epoch's mean training loss; only `adaptive` uses it.
  virtual void end_epoch(double loss) {}
  // True when scikit-learn would stop training (adaptive, once the rate is at or below 1e-6 and the loss still
  // stalls); the rate is then left unchanged.
  virtual bool stop_requested() const { return false; }
  // What end_epoch() has learned (adaptive: rate, best loss, epochs without improvement, stopped), so a
  // checkpoint can carry it; empty for the schedules that are a pure function of the step.
  virtual std::vector<double> state() const { return {}; }
  // Restores state(); throws Error on a vector of the wrong size.
  virtual void set_state(const std::vector<double>& s) {}
};

// Throws Error naming the key ("schedule.gamma: expected ...", "schedule.kind: ... valid kinds: ...").
std::unique_ptr<LrSchedule> make_schedule(const ScheduleSpec& spec, double base_lr);

const std::vector<std::string>& schedule_kinds();

}  // namespace onnxtrain
