// Learning-rate schedules against their references: torch.optim.lr_scheduler step by step (Debian's
// python3 has torch) and scikit-learn's own optimizer code for invscaling and adaptive (the project venv).
// This test writes our rates to .npy; tests/training/schedule_reference.py does the comparing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sys/wait.h>

#include "common/test_env.h"
#include "graph/error.h"
#include "optimizers/schedule.h"
#include "training/npy.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;

constexpr const char* kTorchPython = "/usr/bin/python3";

struct Case {
  std::string name;
  ScheduleSpec spec;
  double base;
  int64_t steps;
};

ScheduleSpec spec(const std::string& kind) {
  ScheduleSpec s;
  s.kind = kind;
  return s;
}

std::vector<Case> torch_cases() {
  std::vector<Case> c;
  c.push_back({"constant", spec("constant"), 0.05, 50});
  ScheduleSpec s = spec("step");
  s.step_size = 7;
  s.gamma = 0.3;
  c.push_back({"step_7_0.3", s, 0.1, 60});
  s.step_size = 1;
  s.gamma = 0.9;
  c.push_back({"step_1_0.9", s, 1.0, 40});
  s = spec("exponential");
  s.gamma = 0.97;
  c.push_back({"exponential_0.97", s, 0.02, 200});
  s = spec("cosine");
  s.total_steps = 50;
  c.push_back({"cosine_50", s, 0.1, 70});  // 20 steps past the end: held at the floor
  s.min_lr = 0.001;
  c.push_back({"cosine_50_min", s, 0.1, 51});
  s.warmup_steps = 10;
  c.push_back({"cosine_warmup_10_50_min", s, 0.1, 65});
  s.min_lr = 0;
  s.warmup_steps = 1;
  s.total_steps = 3;
  c.push_back({"cosine_warmup_1_3", s, 0.5, 6});
  s = spec("linear");
  s.warmup_steps = 8;
  s.total_steps = 40;
  c.push_back({"linear_8_40", s, 3e-4, 50});
  s.warmup_steps = 0;
  s.total_steps = 13;
  c.push_back({"linear_0_13", s, 1.0, 20});
  s.warmup_steps = 5;
  s.total_steps = 5;
  c.push_back({"linear_5_5", s, 1.0, 9});
  return c;
}

std::vector<Case> sklearn_cases() {
  std::vector<Case> c;
  ScheduleSpec s = spec("invscaling");
  c.push_back({"invscaling_0.5", s, 0.01, 300});
  s.power_t = 0.25;
  c.push_back({"invscaling_0.25", s, 0.7, 100});
  s.power_t = 0.0;
  c.push_back({"invscaling_0", s, 0.3, 10});
  s = spec("adaptive");
  s.tol = 1e-4;
  s.n_iter_no_change = 3;
  c.push_back({"adaptive_3", s, 1e-4, 200});  // small rate: reaches sklearn's 1e-6 stop
  s.n_iter_no_change = 10;  // MLPClassifier's default
  c.push_back({"adaptive_10", s, 0.1, 200});
  s.tol = 0.0;
  s.n_iter_no_change = 1;
  c.push_back({"adaptive_tol0", s, 0.5, 120});
  return c;
}

// A loss curve with every kind of epoch the adaptive rule distinguishes: real improvements, improvements
// smaller than tol, exact repeats, regressions, and late breakthroughs that reset the count.
std::vector<double> loss_curve(int64_t n) {
  std::vector<double> l;
  for (int64_t e = 0; e < n; ++e) {
    double v = e < 8 ? 1.0 - 0.05 * static_cast<double>(e) : 0.6 + 3e-5 * std::sin(1.7 * static_cast<double>(e));
    if (e >= 40) v -= 0.1;         // a breakthrough
    if (e >= 41 && e < 44) v -= 0.02 * static_cast<double>(e - 40);
    if (e % 23 == 0) v += 0.05;    // a bad epoch
    if (e >= 90 && e < 95) v = 0.5;  // exact repeats
    if (e >= 130) v = 0.4 - 2e-5 * static_cast<double>(e - 130);  // steady progress below tol
    l.push_back(v);
  }
  return l;
}

Tensor vec(const std::vector<double>& v) { return Tensor::from_vector<double>({static_cast<int64_t>(v.size())}, v); }

void write_cases(const fs::path& dir, const std::vector<Case>& cases, bool corrupt) {
  std::ofstream m(dir / "cases.txt");
  m.precision(17);
  for (const Case& c : cases) {
    const ScheduleSpec& s = c.spec;
    m << c.name << ' ' << s.kind << ' ' << c.base << ' ' << s.step_size << ' ' << s.gamma << ' ' << s.total_steps
      << ' ' << s.warmup_steps << ' ' << s.min_lr << ' ' << s.power_t << ' ' << s.tol << ' ' << s.n_iter_no_change
      << ' ' << c.steps << '\n';
    auto sched = make_schedule(s, c.base);
    std::vector<double> rates;
    if (s.kind == "adaptive") {
      const std::vector<double> losses = loss_curve(c.steps);
      int64_t stop = -1;
      for (int64_t e = 0; e < c.steps; ++e) {
        rates.push_back(sched->lr(e));
        sched->end_epoch(losses[e]);
        if (sched->stop_requested()) {
          stop = e;
          break;
        }
      }
      write_npy(dir / (c.name + "_loss.npy"), vec(losses));
      write_npy(dir / (c.name + "_stop.npy"), Tensor::from_vector<int64_t>({1}, {stop}));
    } else {
      for (int64_t k = 0; k < c.steps; ++k) rates.push_back(sched->lr(k));
    }
    // One wrong step, barely: the comparison must notice a 1e-10 relative error late in the run.
    if (corrupt) {
      size_t i = rates.size() * 3 / 4;
      while (i > 0 && rates[i] == 0) --i;  // zero stays zero under scaling
      rates[i] *= 1 + 1e-10;
    }
    write_npy(dir / (c.name + ".npy"), vec(rates));
  }
}

struct RunResult {
  int exit_code = -1;
  std::string output;
};

RunResult run_reference(const std::string& python, const std::string& mode, const fs::path& dir) {
  const fs::path script = test::source_dir() / "tests" / "training" / "schedule_reference.py";
  const std::string cmd = python + " " + script.string() + " " + mode + " " + dir.string() + " 2>&1";
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) r.output += buf;
  const int rc = pclose(p);
  r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return r;
}

// Our rates must match; the same rates with one step of each case off by 1e-10 must fail, for every case.
void check_against(const std::string& python, const std::string& mode, const std::vector<Case>& cases) {
  const fs::path dir = test::temp_dir("schedules_" + mode);
  write_cases(dir, cases, false);
  const RunResult good = run_reference(python, mode, dir);
  std::cout << good.output;
  EXPECT_EQ(good.exit_code, 0) << good.output;

  const fs::path bad = test::temp_dir("schedules_" + mode + "_corrupted");
  write_cases(bad, cases, true);
  const RunResult r = run_reference(python, mode, bad);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  for (const Case& c : cases)
    EXPECT_NE(r.output.find(c.name + " vs "), std::string::npos) << c.name << ": a corrupted rate went unnoticed\n"
                                                                  << r.output;
}

bool python_has(const std::string& python, const std::string& module) {
  const std::string cmd = python + " -c 'import " + module + "' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

TEST(Schedules, MatchTorchLrSchedulerStepByStep) {
  if (!python_has(kTorchPython, "torch")) GTEST_SKIP() << kTorchPython << " has no torch";
  check_against(kTorchPython, "torch", torch_cases());
}

TEST(Schedules, MatchScikitLearnInvscalingAndAdaptive) {
  if (!python_has(test::python(), "sklearn")) GTEST_SKIP() << test::python() << " has no scikit-learn";
  check_against(test::python(), "sklearn", sklearn_cases());
}

// The adaptive cases above must actually exercise the rule: divisions, and (for the small rate) the stop.
TEST(Schedules, AdaptiveCasesDivideAndStop) {
  for (const Case& c : sklearn_cases()) {
    if (c.spec.kind != "adaptive") continue;
    auto s = make_schedule(c.spec, c.base);
    const std::vector<double> losses = loss_curve(c.steps);
    int divisions = 0;
    for (int64_t e = 0; e < c.steps && !s->stop_requested(); ++e) {
      const double before = s->lr(e);
      s->end_epoch(losses[e]);
      if (s->lr(e) != before) {
        EXPECT_DOUBLE_EQ(s->lr(e), before / 5) << c.name;
        ++divisions;
      }
    }
    EXPECT_GE(divisions, 2) << c.name;
    if (c.name == "adaptive_3") {
      EXPECT_TRUE(s->stop_requested());
    }
  }
}

std::string error_of(const ScheduleSpec& s, double base = 0.1) {
  try {
    make_schedule(s, base);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Schedules, ErrorsNameTheKey) {
  ScheduleSpec s = spec("cosine_annealing");
  std::string e = error_of(s);
  EXPECT_NE(e.find("schedule.kind"), std::string::npos) << e;
  EXPECT_NE(e.find("cosine_annealing"), std::string::npos) << e;
  for (const std::string& k : schedule_kinds()) EXPECT_NE(e.find(k), std::string::npos) << k << " not listed: " << e;

  s = spec("step");
  e = error_of(s);
  EXPECT_EQ(e.rfind("schedule.step_size: expected >= 1", 0), 0u) << e;
  s.step_size = 3;
  s.gamma = -0.5;
  e = error_of(s);
  EXPECT_EQ(e.rfind("schedule.gamma: expected a positive", 0), 0u) << e;

  s = spec("linear");
  e = error_of(s);
  EXPECT_EQ(e.rfind("schedule.total_steps:", 0), 0u) << e;
  s.total_steps = 10;
  s.warmup_steps = 11;
  e = error_of(s);
  EXPECT_EQ(e.rfind("schedule.warmup_steps:", 0), 0u) << e;

  s = spec("cosine");
  s.total_steps = 10;
  s.min_lr = 0.5;
  e = error_of(s, 0.1);
  EXPECT_EQ(e.rfind("schedule.min_lr:", 0), 0u) << e;

  s = spec("invscaling");
  s.power_t = -1;
  EXPECT_EQ(error_of(s).rfind("schedule.power_t:", 0), 0u);
  s = spec("adaptive");
  s.n_iter_no_change = 0;
  EXPECT_EQ(error_of(s).rfind("schedule.n_iter_no_change:", 0), 0u);
  s.n_iter_no_change = 2;
  s.tol = -1;
  EXPECT_EQ(error_of(s).rfind("schedule.tol:", 0), 0u);

  e = error_of(spec("constant"), 0.0);
  EXPECT_EQ(e.rfind("learning_rate:", 0), 0u) << e;
  EXPECT_THROW(make_schedule(spec("constant"), 0.1)->lr(-1), Error);
}

}  // namespace
}  // namespace onnxtrain
