#include "cli/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace onnxtrain::cli {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

bool report_skipped_step(int64_t n) { return n <= kSkipWarnFirst || n % kSkipWarnEvery == 0; }

Progress::Progress(std::string mode, std::FILE* out, std::FILE* warn) : mode_(std::move(mode)), out_(out), warn_(warn) {
  if (mode_ == "auto") mode_ = isatty(fileno(out_)) ? "bar" : "lines";
}

void Progress::clear_bar() {
  if (bar_shown_) std::fprintf(out_, "\r\033[K");
  bar_shown_ = false;
}

void Progress::warn_skipped(Trainer& t, const StepInfo& s) {
  const int64_t n = t.session().skipped_steps();
  if (!report_skipped_step(n)) return;
  clear_bar();
  std::fflush(out_);
  std::fprintf(warn_, "onnxtrain: warning: skipped step #%lld (epoch %lld, batch %lld/%lld): %s\n", static_cast<long long>(n),
               static_cast<long long>(s.epoch + 1), static_cast<long long>(s.batch + 1),
               static_cast<long long>(s.batches_per_epoch), t.session().last_skip_reason().c_str());
  if (n == kSkipWarnFirst)
    std::fprintf(warn_, "onnxtrain: warning: %lld steps skipped so far; from now on only every %lldth skipped step is "
                        "reported (the summary counts them all)\n",
                 static_cast<long long>(n), static_cast<long long>(kSkipWarnEvery));
  std::fflush(warn_);
}

void Progress::on_step(Trainer& t, const StepInfo& s) {
  if (s.skipped) warn_skipped(t, s);
  if (mode_ == "none") return;
  const auto now = Clock::now();
  const double total = double(s.epochs) * s.batches_per_epoch;
  const double done = double(s.epoch) * s.batches_per_epoch + s.batch + 1;
  double fraction = done / total;
  if (s.max_steps > 0) fraction = std::max(fraction, double(s.step) / s.max_steps);
  fraction = std::min(fraction, 1.0);
  if (!started_) {
    // A resumed run starts part-way: rates and ETA count from here.
    started_ = true;
    start_ = last_print_ = now;
    start_fraction_ = fraction - 1.0 / total;
    samples_ = 0;
  }
  samples_ += s.samples;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? samples_ / elapsed : 0;
  const double eta = fraction > start_fraction_ ? elapsed * (1 - fraction) / (fraction - start_fraction_) : NAN;
  if (mode_ == "bar") {
    if (now - last_print_ < std::chrono::milliseconds(100) && done < total) return;
    last_print_ = now;
    const int width = 24, filled = static_cast<int>(fraction * width);
    std::string bar(filled, '#');
    bar.resize(width, '.');
    std::fprintf(out_, "\r\033[Kepoch %lld/%lld [%s] %3.0f%% step %lld loss %.4g %.0f samples/s ETA %s",
                 static_cast<long long>(s.epoch + 1), static_cast<long long>(s.epochs), bar.c_str(), fraction * 100,
                 static_cast<long long>(s.step), s.loss, rate, format_duration(eta).c_str());
    std::fflush(out_);
    bar_shown_ = true;
  } else if (now - last_print_ >= std::chrono::seconds(10)) {
    last_print_ = now;
    std::fprintf(out_, "epoch %lld/%lld batch %lld/%lld step %lld loss %.6g %.0f samples/s ETA %s\n",
                 static_cast<long long>(s.epoch + 1), static_cast<long long>(s.epochs), static_cast<long long>(s.batch + 1),
                 static_cast<long long>(s.batches_per_epoch), static_cast<long long>(s.step), s.loss, rate,
                 format_duration(eta).c_str());
    std::fflush(out_);
  }
}

void Progress::on_epoch_end(Trainer&, const EpochInfo& e) {
  if (mode_ == "none") return;
  clear_bar();
  std::fprintf(out_, "epoch %lld done: step %lld train_loss %.6g", static_cast<long long>(e.epoch + 1),
               static_cast<long long>(e.step), e.train_loss);
  if (e.skipped) std::fprintf(out_, " skipped %lld", static_cast<long long>(e.skipped));
  for (const auto& [k, v] : e.metrics) std::fprintf(out_, " %s %.6g", k.c_str(), v);
  std::fprintf(out_, " (%s)\n", format_duration(e.seconds).c_str());
  std::fflush(out_);
}

void Progress::on_train_end(Trainer&, TrainResult&) {
  if (mode_ != "none") clear_bar();
  std::fflush(out_);
}

}  // namespace onnxtrain::cli
