#pragma once
// Progress of a training run: a live bar on a terminal (epoch, step, loss, throughput, ETA), plain log lines
// otherwise (one per epoch, and a step line at most every 10 seconds). Steps skipped by on_non_finite "skip" are
// warned about on `warn` whatever the mode (rate-limited: report_skipped_step).
#include <chrono>
#include <cstdio>
#include <string>

#include "training/trainer.h"

namespace onnxtrain::cli {

// Whether the n-th skipped step (1-based) gets a warning line: each of the first kSkipWarnFirst, then every
// kSkipWarnEvery-th, so a run that skips often still shows it without drowning the log.
inline constexpr int64_t kSkipWarnFirst = 10, kSkipWarnEvery = 100;
bool report_skipped_step(int64_t n);

class Progress : public Callback {
 public:
  // mode: "bar", "lines" or "none"; "auto" picks bar when `out` is a terminal.
  Progress(std::string mode, std::FILE* out = stdout, std::FILE* warn = stderr);
  void on_step(Trainer& t, const StepInfo& s) override;
  void on_epoch_end(Trainer& t, const EpochInfo& e) override;
  void on_train_end(Trainer& t, TrainResult& r) override;

 private:
  using Clock = std::chrono::steady_clock;
  void clear_bar();
  void warn_skipped(Trainer& t, const StepInfo& s);
  std::string mode_;
  std::FILE* out_;
  std::FILE* warn_;
  bool started_ = false, bar_shown_ = false;
  Clock::time_point start_, last_print_;
  double start_fraction_ = 0;
  int64_t samples_ = 0;
};

// "1:02:03" / "2:03".
std::string format_duration(double seconds);

}  // namespace onnxtrain::cli
