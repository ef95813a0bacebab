#include "distributed/threads.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "graph/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace onnxtrain {

namespace {

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Ranks of a replicated step reach each collective within microseconds of each other (they run the same
// plan on equal shards), so a short spin saves a futex round trip; past it, a rank sleeps on the condition
// variable so that more ranks than cores still make progress.
constexpr int kSpins = 4000;

}  // namespace

struct ThreadGroup::Shared {
  int n = 0;
  double timeout = 0;
  // Barrier: the last of n arrivals resets `arrived` and advances `generation`.
  std::atomic<int> arrived{0};
  std::atomic<uint64_t> generation{0};
  std::mutex m;
  std::condition_variable cv;
  std::atomic<int> failed_rank{-1};
  std::string failed_what;  // under m
  // Per-rank slots of the current collective, written before its first barrier and read before its second.
  std::vector<const void*> send;
  std::vector<void*> recv;
  std::vector<size_t> count;
  std::vector<double> mean_weights, sum_weights;  // empty: 1/n, and 1

  // Returns normally once all n ranks arrived; throws (via comm) when the wait times out or a rank failed.
  void barrier(Communicator& comm, const char* op) {
    const uint64_t gen = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
      arrived.store(0, std::memory_order_relaxed);
      {
        // Advanced under the mutex so that a sleeper between its check and its wait cannot miss it.
        std::lock_guard<std::mutex> lock(m);
        generation.fetch_add(1, std::memory_order_acq_rel);
      }
      cv.notify_all();
      return;
    }
    for (int i = 0; i < kSpins; ++i) {
      if (generation.load(std::memory_order_acquire) != gen) return;
      if (failed_rank.load(std::memory_order_acquire) >= 0) break;
      cpu_relax();
    }
    std::unique_lock<std::mutex> lock(m);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    const bool done = cv.wait_until(lock, deadline, [&] {
      return generation.load(std::memory_order_acquire) != gen || failed_rank.load(std::memory_order_acquire) >= 0;
    });
    // A rank that failed after this barrier completed does not undo it.
    if (generation.load(std::memory_order_acquire) != gen) return;
    if (done) {
      const std::string what = failed_what;
      const int r = failed_rank.load();
      lock.unlock();
      throw_failed(comm, op, r, what);
    }
    lock.unlock();
    fail_timeout(comm, op);
  }

  [[noreturn]] static void throw_failed(Communicator& comm, const char* op, int r, const std::string& what);
  [[noreturn]] static void fail_timeout(Communicator& comm, const char* op);
};

namespace {

class ThreadRank final : public Communicator {
 public:
  ThreadRank(std::shared_ptr<ThreadGroup::Shared> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->n; }
  Device device() const override { return Device::CPU; }
  std::string backend() const override { return "threads"; }

  [[noreturn]] void failed(const char* op, int r, const std::string& what) {
    fail_collective(std::string(op) + ": replica " + std::to_string(r) + " stopped with an error, so this " + op +
                    " cannot complete (" + what + ")");
  }
  [[noreturn]] void timed_out(const char* op) { fail_timeout(op, s_->timeout); }

 protected:
  void do_broadcast(void* data, size_t bytes, int root) override {
    ThreadGroup::Shared& s = *s_;
    s.recv[static_cast<size_t>(rank_)] = data;
    s.count[static_cast<size_t>(rank_)] = bytes;
    s.barrier(*this, "broadcast");
    const auto root_bytes = s.count[static_cast<size_t>(root)];
    const bool ok = root_bytes == bytes;
    if (ok && rank_ != root) std::memcpy(data, s.recv[static_cast<size_t>(root)], bytes);
    s.barrier(*this, "broadcast");
    if (!ok)
      fail_collective("broadcast: " + std::to_string(bytes) + " bytes here, " + std::to_string(root_bytes) +
                      " at root " + std::to_string(root) + " (every rank must pass the same size)");
  }

  void do_allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    if (dtype == DType::Float32) reduce<float>(send, recv, count, op);
    else reduce<double>(send, recv, count, op);
  }

  void do_barrier() override { s_->barrier(*this, "barrier"); }

 private:
  // Rank r reduces the r-th slice of the elements over all ranks and writes the result into every rank's recv:
  // each element is summed once, in rank order, so all ranks get the same bits, and a slice is read and written
  // by one rank only, which makes send == recv safe.
  template <class T> void reduce(const void* send, void* recv, size_t count, ReduceOp op) {
    ThreadGroup::Shared& s = *s_;
    const auto me = static_cast<size_t>(rank_);
    s.send[me] = send;
    s.recv[me] = recv;
    s.count[me] = count;
    s.barrier(*this, "allreduce");
    const size_t n = static_cast<size_t>(s.n);
    bool same = true;
    std::string counts;  // for the message, read before the slots may be reused
    for (size_t k = 0; k < n; ++k) same = same && s.count[k] == count;
    if (!same)
      for (size_t k = 0; k < n; ++k) counts += (k ? ", " : "") + std::to_string(s.count[k]);
    if (same) {
      T w[64];
      const size_t ranks = std::min<size_t>(n, 64);
      for (size_t k = 0; k < ranks; ++k)
        w[k] = op == ReduceOp::Sum ? (s.sum_weights.empty() ? T(1) : static_cast<T>(s.sum_weights[k]))
                                   : (s.mean_weights.empty() ? T(1) / T(n) : static_cast<T>(s.mean_weights[k]));
      const size_t lo = count * me / n, hi = count * (me + 1) / n;
      const T* src0 = static_cast<const T*>(s.send[0]);
      if (n == 2) {
        // The common case, as one vectorisable loop.
        const T* src1 = static_cast<const T*>(s.send[1]);
        T* d0 = static_cast<T*>(s.recv[0]);
        T* d1 = static_cast<T*>(s.recv[1]);
        const T w0 = w[0], w1 = w[1];
        if (op == ReduceOp::Sum && s.sum_weights.empty()) {
          for (size_t j = lo; j < hi; ++j) d0[j] = d1[j] = src0[j] + src1[j];
        } else {
          for (size_t j = lo; j < hi; ++j) d0[j] = d1[j] = w0 * src0[j] + w1 * src1[j];
        }
      } else {
        for (size_t j = lo; j < hi; ++j) {
          T acc = w[0] * src0[j];
          for (size_t k = 1; k < ranks; ++k) acc += w[k] * static_cast<const T*>(s.send[k])[j];
          for (size_t k = 0; k < ranks; ++k) static_cast<T*>(s.recv[k])[j] = acc;
        }
      }
    }
    s.barrier(*this, "allreduce");
    if (!same) fail_collective("allreduce: the ranks passed different element counts (" + counts + ")");
  }

  std::shared_ptr<ThreadGroup::Shared> s_;
  int rank_;
};

}  // namespace

void ThreadGroup::Shared::throw_failed(Communicator& comm, const char* op, int r, const std::string& what) {
  static_cast<ThreadRank&>(comm).failed(op, r, what);
}

void ThreadGroup::Shared::fail_timeout(Communicator& comm, const char* op) {
  static_cast<ThreadRank&>(comm).timed_out(op);
}

ThreadGroup::ThreadGroup(int size, double timeout) : shared_(std::make_shared<Shared>()) {
  if (size < 1 || size > 64) fail("thread group", "expected 1 to 64 ranks, got " + std::to_string(size));
  Shared& s = *shared_;
  s.n = size;
  s.timeout = comm_timeout(timeout);
  s.send.assign(static_cast<size_t>(size), nullptr);
  s.recv.assign(static_cast<size_t>(size), nullptr);
  s.count.assign(static_cast<size_t>(size), 0);
  for (int r = 0; r < size; ++r) ranks_.push_back(std::make_shared<ThreadRank>(shared_, r));
}

ThreadGroup::~ThreadGroup() = default;

int ThreadGroup::size() const { return shared_->n; }

std::shared_ptr<Communicator> ThreadGroup::rank(int r) const {
  if (r < 0 || r >= size()) fail("thread group", "no rank " + std::to_string(r) + " in a group of " + std::to_string(size()));
  return ranks_[static_cast<size_t>(r)];
}

void ThreadGroup::set_weights(const std::vector<double>& mean, const std::vector<double>& sum) {
  for (const auto* w : {&mean, &sum})
    if (!w->empty() && w->size() != static_cast<size_t>(size()))
      fail("thread group", "expected one weight per rank (" + std::to_string(size()) + "), got " +
                               std::to_string(w->size()));
  shared_->mean_weights = mean;
  shared_->sum_weights = sum;
}

void ThreadGroup::rank_failed(int r, const std::string& what) {
  Shared& s = *shared_;
  {
    std::lock_guard<std::mutex> lock(s.m);
    int expected = -1;
    if (s.failed_rank.compare_exchange_strong(expected, r)) s.failed_what = what;
  }
  s.cv.notify_all();
}

bool ThreadGroup::has_failure() const { return shared_->failed_rank.load() >= 0; }

void ThreadGroup::clear_failures() {
  Shared& s = *shared_;
  std::lock_guard<std::mutex> lock(s.m);
  s.failed_rank.store(-1);
  s.failed_what.clear();
}

}  // namespace onnxtrain
