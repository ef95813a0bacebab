#include "distributed/threads.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <span>

#include "distributed/spin.h"
#include "graph/error.h"
#include "graph/float16.h"


namespace onnxtrain {

namespace {

// Ranks of a replicated step reach each collective within microseconds of each other (they run the same
// plan on equal shards), so a short spin saves a futex round trip; past it, a rank sleeps on the condition
// variable so that more ranks than cores still make progress.
constexpr int kSpins = 4000;

// How one dtype is stored and summed: float32/float64 as themselves, float16/bfloat16 (gradient compression)
// widened to float32 for each addition and rounded once.
template <class T> struct Plain {
  using Stored = T;
  using Acc = T;
  static Acc load(T v) { return v; }
  static T store(Acc v) { return v; }
};
template <class ToFloat, class FromFloat> struct Half {
  using Stored = uint16_t;
  using Acc = float;
  static float load(uint16_t v) { return ToFloat{}(v); }
  static uint16_t store(float v) { return FromFloat{}(v); }
};
using Float16Num = Half<HalfToFloat, FloatToHalf>;
using BFloat16Num = Half<BFloat16ToFloat, FloatToBFloat16>;

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
  // Per-rank slots of the current collective, written before its first barrier and read before its second: an
  // allreduce's buffers (pointers into the caller's arrays), a broadcast's buffer.
  struct Buffers {
    const void* const* send = nullptr;
    void* const* recv = nullptr;
    const size_t* count = nullptr;
    size_t n = 0;
  };
  std::vector<Buffers> reduce;
  std::vector<void*> data;
  std::vector<size_t> bytes;
  std::vector<double> mean_weights, sum_weights;  // empty: 1/n, and 1

  // Complete once all n ranks arrived; RankFailed (with the rank and its error in `failed`) when one stopped
  // first; TimedOut after `timeout` seconds. The caller turns the last two into its communicator's error.
  enum class Arrival { Complete, RankFailed, TimedOut };
  Arrival barrier(std::pair<int, std::string>& failed) {
    const uint64_t gen = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
      arrived.store(0, std::memory_order_relaxed);
      {
        // Advanced under the mutex so that a sleeper between its check and its wait cannot miss it.
        std::lock_guard<std::mutex> lock(m);
        generation.fetch_add(1, std::memory_order_acq_rel);
      }
      cv.notify_all();
      return Arrival::Complete;
    }
    for (int i = 0; i < kSpins; ++i) {
      if (generation.load(std::memory_order_acquire) != gen) return Arrival::Complete;
      if (failed_rank.load(std::memory_order_acquire) >= 0) break;
      cpu_relax();
    }
    std::unique_lock<std::mutex> lock(m);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    const bool done = cv.wait_until(lock, deadline, [&] {
      return generation.load(std::memory_order_acquire) != gen || failed_rank.load(std::memory_order_acquire) >= 0;
    });
    // A rank that failed after this barrier completed does not undo it.
    if (generation.load(std::memory_order_acquire) != gen) return Arrival::Complete;
    if (!done) return Arrival::TimedOut;
    failed = {failed_rank.load(), failed_what};
    return Arrival::RankFailed;
  }
};

namespace {

class ThreadRank final : public Communicator {
 public:
  ThreadRank(std::shared_ptr<ThreadGroup::Shared> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->n; }
  Device device() const override { return Device::CPU; }
  std::string backend() const override { return "threads"; }

 protected:
  void do_broadcast(void* data, size_t bytes, int root) override {
    ThreadGroup::Shared& s = *s_;
    s.data[static_cast<size_t>(rank_)] = data;
    s.bytes[static_cast<size_t>(rank_)] = bytes;
    wait("broadcast");
    const auto root_bytes = s.bytes[static_cast<size_t>(root)];
    const bool ok = root_bytes == bytes;
    if (ok && rank_ != root) std::memcpy(data, s.data[static_cast<size_t>(root)], bytes);
    wait("broadcast");
    if (!ok)
      fail_collective("broadcast: " + std::to_string(bytes) + " bytes here, " + std::to_string(root_bytes) +
                      " at root " + std::to_string(root) + " (every rank must pass the same size)");
  }

  void do_allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    do_allreduce_many({&send, 1}, {&recv, 1}, {&count, 1}, dtype, op);
  }

  bool reduces_many_at_once() const override { return true; }

  void do_allreduce_many(std::span<const void* const> send, std::span<void* const> recv,
                         std::span<const size_t> counts, DType dtype, ReduceOp op) override {
    switch (dtype) {
      case DType::Float32: return reduce<Plain<float>>(send, recv, counts, op);
      case DType::Float64: return reduce<Plain<double>>(send, recv, counts, op);
      case DType::Float16: return reduce<Float16Num>(send, recv, counts, op);
      default: return reduce<BFloat16Num>(send, recv, counts, op);
    }
  }

  void do_barrier() override { wait("barrier"); }

 private:
  // The elements of all buffers, in order, are cut into one slice per rank. Rank r reduces its slice over all
  // ranks and writes the result into every rank's recv: each element is summed once, in rank order, so all ranks
  // get the same bits, and a slice is read and written by one rank only, which makes send == recv safe. The
  // buffers are read where they are: no packing into one message.
  template <class Num> void reduce(std::span<const void* const> send, std::span<void* const> recv,
                                 std::span<const size_t> counts, ReduceOp op) {
    ThreadGroup::Shared& s = *s_;
    const auto me = static_cast<size_t>(rank_);
    s.reduce[me] = {send.data(), recv.data(), counts.data(), counts.size()};
    wait("allreduce");
    const size_t n = static_cast<size_t>(s.n);
    bool same = true;
    for (size_t k = 0; k < n && same; ++k) {
      same = s.reduce[k].n == counts.size();
      for (size_t i = 0; i < counts.size() && same; ++i) same = s.reduce[k].count[i] == counts[i];
    }
    std::string mismatch;  // for the message, read before the slots may be reused
    if (!same)
      for (size_t k = 0; k < n; ++k) {
        size_t total = 0;
        for (size_t i = 0; i < s.reduce[k].n; ++i) total += s.reduce[k].count[i];
        mismatch += (k ? ", " : "") + std::to_string(s.reduce[k].n) + " buffer(s) of " + std::to_string(total);
      }
    if (same) {
      using T = typename Num::Acc;
      T w[64];
      for (size_t k = 0; k < n; ++k)
        w[k] = op == ReduceOp::Sum ? (s.sum_weights.empty() ? T(1) : static_cast<T>(s.sum_weights[k]))
                                   : (s.mean_weights.empty() ? T(1) / T(n) : static_cast<T>(s.mean_weights[k]));
      const bool plain_sum = op == ReduceOp::Sum && s.sum_weights.empty();
      size_t total = 0;
      for (size_t c : counts) total += c;
      const size_t lo = total * me / n, hi = total * (me + 1) / n;
      size_t offset = 0;
      for (size_t i = 0; i < counts.size(); offset += counts[i], ++i) {
        const size_t a = std::max(lo, offset), b = std::min(hi, offset + counts[i]);
        if (a < b) reduce_range<Num>(i, a - offset, b - offset, w, plain_sum);
      }
    }
    wait("allreduce");
    if (!same) fail_collective("allreduce: the ranks passed different buffers (" + mismatch + " elements)");
  }

  // Elements [lo, hi) of buffer i, over every rank.
  template <class Num>
  void reduce_range(size_t i, size_t lo, size_t hi, const typename Num::Acc* w, bool plain_sum) {
    using T = typename Num::Stored;
    using A = typename Num::Acc;
    ThreadGroup::Shared& s = *s_;
    const size_t n = static_cast<size_t>(s.n);
    auto src = [&](size_t k) { return static_cast<const T*>(s.reduce[k].send[i]); };
    auto dst = [&](size_t k) { return static_cast<T*>(s.reduce[k].recv[i]); };
    if (n == 2) {
      // The common case, as one vectorisable loop.
      const T *src0 = src(0), *src1 = src(1);
      T *d0 = dst(0), *d1 = dst(1);
      const A w0 = w[0], w1 = w[1];
      if (plain_sum)
        for (size_t j = lo; j < hi; ++j) d0[j] = d1[j] = Num::store(Num::load(src0[j]) + Num::load(src1[j]));
      else
        for (size_t j = lo; j < hi; ++j) d0[j] = d1[j] = Num::store(w0 * Num::load(src0[j]) + w1 * Num::load(src1[j]));
      return;
    }
    for (size_t j = lo; j < hi; ++j) {
      A acc = w[0] * Num::load(src(0)[j]);
      for (size_t k = 1; k < n; ++k) acc += w[k] * Num::load(src(k)[j]);
      for (size_t k = 0; k < n; ++k) dst(k)[j] = Num::store(acc);
    }
  }

  // The group's barrier, failing this communicator when another rank stopped or the wait timed out.
  void wait(const char* op) {
    std::pair<int, std::string> failed;
    switch (s_->barrier(failed)) {
      case ThreadGroup::Shared::Arrival::Complete:
        return;
      case ThreadGroup::Shared::Arrival::RankFailed:
        fail_collective(std::string(op) + ": replica " + std::to_string(failed.first) + " stopped with an error, so " +
                        "this " + op + " cannot complete (" + failed.second + ")");
      case ThreadGroup::Shared::Arrival::TimedOut:
        fail_timeout(op, s_->timeout);
    }
  }

  std::shared_ptr<ThreadGroup::Shared> s_;
  int rank_;
};

}  // namespace

ThreadGroup::ThreadGroup(int size, double timeout) : shared_(std::make_shared<Shared>()) {
  if (size < 1 || size > 64) fail("thread group", "expected 1 to 64 ranks, got " + std::to_string(size));
  Shared& s = *shared_;
  s.n = size;
  s.timeout = comm_timeout(timeout);
  s.reduce.assign(static_cast<size_t>(size), {});
  s.data.assign(static_cast<size_t>(size), nullptr);
  s.bytes.assign(static_cast<size_t>(size), 0);
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
