#include "training/replicas.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <typeinfo>

#include "distributed/spin.h"
#include "graph/error.h"


namespace onnxtrain {

namespace {

// Steps follow each other within microseconds in a training loop: a short spin before sleeping on the futex
// keeps the wake-up off the step's critical path; a loop that pauses longer costs one futex wake per step.
constexpr int kSpins = 20000;

template <class Pred> void spin_then_wait(const std::atomic<uint32_t>& a, uint32_t old, Pred done) {
  for (int i = 0; i < kSpins; ++i) {
    if (done()) return;
    cpu_relax();
  }
  while (!done()) a.wait(old, std::memory_order_acquire);
}

// Kernels size their thread teams from omp_get_max_threads() of the calling thread: one per replica.
class OneOmpThread {
 public:
  OneOmpThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneOmpThread() { omp_set_num_threads(saved_); }
  OneOmpThread(const OneOmpThread&) = delete;
  OneOmpThread& operator=(const OneOmpThread&) = delete;

 private:
  int saved_;
};

}  // namespace

// Worker r (1..N-1) runs replica r; replica 0 runs on the caller's thread. A job is a plain function pointer and
// context, so dispatching a step allocates nothing.
struct ReplicatedSession::Pool {
  std::vector<std::thread> threads;
  std::atomic<uint32_t> task{0};
  std::vector<std::unique_ptr<std::atomic<uint32_t>>> done;  // per replica: the last task finished
  std::vector<std::exception_ptr> errors;
  void (*job)(void*, int) = nullptr;
  void* ctx = nullptr;
  bool stop = false;

  ThreadGroup* group = nullptr;

  // A replica that stopped with an error will not join the collectives the others wait in: the group tells
  // them, so they fail at once instead of at the timeout.
  void execute(int r) {
    try {
      job(ctx, r);
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(r)] = std::current_exception();
      group->rank_failed(r, e.what());
    } catch (...) {
      errors[static_cast<size_t>(r)] = std::current_exception();
      group->rank_failed(r, "an unknown exception");
    }
  }

  void worker(int r) {
    omp_set_num_threads(1);
    uint32_t seen = 0;
    for (;;) {
      spin_then_wait(task, seen, [&] { return task.load(std::memory_order_acquire) != seen; });
      seen = task.load(std::memory_order_acquire);
      if (stop) return;
      execute(r);
      done[static_cast<size_t>(r)]->store(seen, std::memory_order_release);
      done[static_cast<size_t>(r)]->notify_one();
    }
  }
};

ReplicatedSession::ReplicatedSession(int replicas, const Factory& make) {
  if (replicas < 1 || replicas > 64)
    fail("replicas", "expected 1 to 64 replicas, got " + std::to_string(replicas));
  group_ = std::make_unique<ThreadGroup>(replicas);
  sessions_.resize(static_cast<size_t>(replicas));
  pool_ = std::make_unique<Pool>();
  pool_->group = group_.get();
  pool_->errors.resize(static_cast<size_t>(replicas));
  for (int r = 0; r < replicas; ++r) pool_->done.push_back(std::make_unique<std::atomic<uint32_t>>(0));
  for (int r = 1; r < replicas; ++r) pool_->threads.emplace_back([p = pool_.get(), r] { p->worker(r); });
  struct Ctx {
    ReplicatedSession* self;
    const Factory* make;
  } ctx{this, &make};
  try {
    run(
        [](void* c, int r) {
          auto& x = *static_cast<Ctx*>(c);
          DataParallelSpec spec;
          spec.communicator = x.self->group_->rank(r);
          x.self->sessions_[static_cast<size_t>(r)] = std::make_unique<TrainingSession>((*x.make)(spec));
        },
        &ctx, "building the replicas");
  } catch (...) {
    pool_->stop = true;
    pool_->task.fetch_add(1, std::memory_order_release);
    pool_->task.notify_all();
    for (std::thread& t : pool_->threads) t.join();
    throw;
  }
}

bool replicas_run_on(const std::string& device) { return device == "cpu" || device == "guarded"; }

namespace {

TrainingConfig checked(const TrainingConfig& config) {
  if (config.parallel.communicator)
    fail("replicas", "the training config already has a communicator (" + config.parallel.communicator->describe() +
                         "); replicas bring their own, so leave config.parallel empty");
  if (!replicas_run_on(config.device))
    fail("replicas", "replicas run on the CPU; the config asks for device '" + config.device + "'");
  return config;
}

}  // namespace

ReplicatedSession::ReplicatedSession(const Model& model, const TrainingConfig& config, int replicas)
    : ReplicatedSession(replicas, [&model, c = checked(config)](const DataParallelSpec& spec) {
        TrainingConfig mine = c;
        mine.parallel.communicator = spec.communicator;  // the config's reduction options (compression...) stay
        return TrainingSession(model, std::move(mine));
      }) {}

std::unique_ptr<ReplicatedSession> ReplicatedSession::from_checkpoint(const std::filesystem::path& path, int replicas) {
  return std::make_unique<ReplicatedSession>(
      replicas, [&path](const DataParallelSpec& spec) { return TrainingSession::from_checkpoint(path, spec); });
}

ReplicatedSession::~ReplicatedSession() {
  if (!pool_) return;
  pool_->stop = true;
  pool_->task.fetch_add(1, std::memory_order_release);
  pool_->task.notify_all();
  for (std::thread& t : pool_->threads) t.join();
}

void ReplicatedSession::check_usable() const {
  if (!broken_.empty()) fail("replicated session", broken_);
}

void ReplicatedSession::run(void (*job)(void*, int), void* ctx, const char* what) {
  Pool& p = *pool_;
  p.job = job;
  p.ctx = ctx;
  for (auto& e : p.errors) e = nullptr;
  const uint32_t task = p.task.fetch_add(1, std::memory_order_acq_rel) + 1;
  p.task.notify_all();
  {
    const OneOmpThread serial;
    p.execute(0);
  }
  for (size_t r = 1; r < p.done.size(); ++r) {
    std::atomic<uint32_t>& d = *p.done[r];
    spin_then_wait(d, d.load(std::memory_order_relaxed), [&] { return d.load(std::memory_order_acquire) == task; });
  }
  if (std::none_of(p.errors.begin(), p.errors.end(), [](const auto& e) { return e != nullptr; })) return;

  // The origin: the first replica that raised by itself, not because another one's failure broke a collective.
  int origin = -1;
  bool out_of_step = false;
  for (size_t r = 0; r < p.errors.size(); ++r) {
    const bool in_collective = sessions_[r] && sessions_[r]->communicator()->broken();
    if (!p.errors[r] || in_collective) out_of_step = true;
    else if (origin < 0) origin = static_cast<int>(r);
  }
  // Every replica raised by itself at the same point (as a non-finite loss makes them, from the reduced values):
  // no collective was left half done, and the weights still agree.
  if (!out_of_step && std::all_of(sessions_.begin(), sessions_.end(), [](const auto& s) { return s != nullptr; }))
    group_->clear_failures();
  else
    broken_ = std::string("an earlier call (") + what + ") failed on some replicas only, so they may no longer hold "
              "the same weights; build the session again or resume it from a checkpoint";
  if (origin < 0) origin = 0;
  try {
    std::rethrow_exception(p.errors[static_cast<size_t>(origin)]);
  } catch (const Error& e) {
    // Plain errors get the replica and its rows; typed ones (NonFiniteError, ...) pass unchanged, for callers
    // that catch them by type.
    if (typeid(e) != typeid(Error) || rows_.size() != sessions_.size() || p.job != step_job) throw;
    const auto [start, count] = rows_[static_cast<size_t>(origin)];
    throw Error("replica " + std::to_string(origin) + " (rows " + std::to_string(start) + ".." +
                std::to_string(start + count - 1) + " of the batch): " + e.what());
  }
}

void ReplicatedSession::split(const Feeds& feeds) {
  const int n = replicas();
  if (feeds.empty()) fail("replicated step", "no feeds");
  // The batch is the smallest first dimension; a feed with k times as many rows (per-token targets flattened
  // beside [batch, tokens] inputs) is split in blocks of k.
  int64_t rows = -1;
  for (const auto& [name, t] : feeds) {
    if (t.device != Device::CPU) fail("feed '" + name + "'", "replicas read host arrays, got one on " + device_name(t.device));
    if (t.rank() == 0)
      fail("feed '" + name + "'", "replicas split every feed along dimension 0 (the batch), got a scalar " + t.describe());
    rows = rows < 0 ? t.shape[0] : std::min(rows, t.shape[0]);
  }
  for (const auto& [name, t] : feeds)
    if (rows == 0 || t.shape[0] % rows != 0) {
      std::string all;  // built only for the message: a step allocates nothing
      for (const auto& [n2, t2] : feeds) all += (all.empty() ? "" : ", ") + n2 + " " + t2.describe();
      fail("replicated step", "every feed's dimension 0 must be the batch's row count or a multiple of it (per-token "
                              "values flattened) to be split over the replicas; got " + all);
    }
  if (rows != batch_rows_) {
    batch_rows_ = rows;
    rows_.assign(static_cast<size_t>(n), {0, 0});
    std::vector<double> mean(static_cast<size_t>(n), 0.0), sum(static_cast<size_t>(n), 0.0);
    int64_t start = 0;
    for (int r = 0; r < n; ++r) {
      const int64_t count = rows / n + (r < rows % n ? 1 : 0);
      // With fewer rows than replicas (an epoch's last batch), a replica without rows of its own runs on row 0
      // and counts for nothing: every replica must join the step's collectives.
      rows_[static_cast<size_t>(r)] = count > 0 ? std::pair{start, count} : std::pair<int64_t, int64_t>{0, 1};
      mean[static_cast<size_t>(r)] = static_cast<double>(count) / static_cast<double>(rows);
      sum[static_cast<size_t>(r)] = count > 0 ? 1.0 : 0.0;
      start += count;
    }
    const bool even = rows % n == 0;
    group_->set_weights(even ? std::vector<double>{} : mean, rows >= n ? std::vector<double>{} : sum);
    parts_.clear();
  }
  // Views into the caller's arrays; rebuilt only when the feeds' names, types or shapes change.
  bool same = parts_.size() == static_cast<size_t>(n) && parts_[0].size() == feeds.size();
  if (same) {
    auto it = parts_[0].begin();
    for (const auto& [name, t] : feeds) {
      same = same && it->first == name && it->second.dtype == t.dtype && it->second.rank() == t.rank() &&
             it->second.shape[0] == rows_[0].second * (t.shape[0] / rows) &&
             std::equal(t.shape.begin() + 1, t.shape.end(), it->second.shape.begin() + 1);
      ++it;
    }
  }
  if (!same) {
    parts_.assign(static_cast<size_t>(n), Feeds{});
    for (int r = 0; r < n; ++r)
      for (const auto& [name, t] : feeds) {
        std::vector<int64_t> shape = t.shape;
        shape[0] = rows_[static_cast<size_t>(r)].second * (t.shape[0] / rows);
        parts_[static_cast<size_t>(r)][name] = Tensor::view(t.dtype, std::move(shape), nullptr);
      }
  }
  for (int r = 0; r < n; ++r) {
    auto it = parts_[static_cast<size_t>(r)].begin();
    for (const auto& [name, t] : feeds) {
      const size_t row_bytes = t.nbytes() / static_cast<size_t>(rows);  // per batch row
      it->second.data = static_cast<char*>(t.data) + static_cast<size_t>(rows_[static_cast<size_t>(r)].first) * row_bytes;
      ++it;
    }
  }
}

void ReplicatedSession::step_job(void* c, int r) {
  auto* self = static_cast<ReplicatedSession*>(c);
  const auto i = static_cast<size_t>(r);
  self->losses_[i] = self->sessions_[i]->train_step(self->parts_[i]);
}

float ReplicatedSession::train_step(const Feeds& feeds) {
  check_usable();
  split(feeds);
  losses_.resize(sessions_.size());
  run(step_job, this, "train_step");
  return losses_[0];
}

std::vector<Tensor> ReplicatedSession::infer(const Feeds& inputs) {
  check_usable();
  const OneOmpThread serial;
  return sessions_.front()->infer(inputs);
}

void ReplicatedSession::for_each(const std::function<void(TrainingSession&)>& f) {
  check_usable();
  struct Ctx {
    ReplicatedSession* self;
    const std::function<void(TrainingSession&)>* f;
  } ctx{this, &f};
  run([](void* c, int r) {
        auto& x = *static_cast<Ctx*>(c);
        (*x.f)(*x.self->sessions_[static_cast<size_t>(r)]);
      },
      &ctx, "for_each");
}

void ReplicatedSession::set_weight(const std::string& name, const Tensor& value) {
  for_each([&](TrainingSession& s) { s.set_weight(name, value); });
}

void ReplicatedSession::set_learning_rate(double lr) {
  for_each([lr](TrainingSession& s) { s.set_learning_rate(lr); });
}

void ReplicatedSession::end_epoch(double mean_loss) {
  for_each([mean_loss](TrainingSession& s) { s.end_epoch(mean_loss); });
}

}  // namespace onnxtrain
