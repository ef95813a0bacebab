#pragma once
// In-process ranks: a group of communicators, one per thread of one process, whose collectives exchange
// host buffers through shared memory. ReplicatedSession (training/replicas.h) runs one single-threaded replica
// of a training session on each, so the data-parallel machinery (AllReduce nodes, the initial broadcast, the
// agreed non-finite decision) works unchanged between threads as it does between MPI ranks.
//
// Why a transport of our own here: a collective between two threads is two barriers and a loop; MPI would need
// MPI_THREAD_MULTIPLE and a launcher for what is a function call.
//
// Collectives never wait forever: a rank waits at most comm_timeout() seconds, and fails at once when another
// rank of the group has stopped (ThreadGroup::rank_failed), naming it.
#include <memory>
#include <string>
#include <vector>

#include "distributed/communicator.h"

namespace onnxtrain {

class ThreadGroup {
 public:
  // `size` ranks; `timeout` as comm_timeout(timeout).
  explicit ThreadGroup(int size, double timeout = 0);
  ~ThreadGroup();
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  int size() const;
  // Rank r's communicator; each must be used by one thread at a time.
  std::shared_ptr<Communicator> rank(int r) const;

  // How much each rank's values count, so that ranks holding unequal parts of a batch still give the batch's
  // mean or sum: a Mean allreduce gives sum_r mean[r] * x_r instead of the plain average (mean[r] = rows_r /
  // rows), a Sum allreduce sum_r sum[r] * x_r (0 for a rank that only stands in, with no rows of its own). Set
  // between collectives only; an empty vector restores the plain average or sum.
  void set_weights(const std::vector<double>& mean, const std::vector<double>& sum);

  // Rank r has stopped with an error (`what`) and will not join further collectives: the others, waiting or
  // arriving, fail at once with a message naming r. clear_failures() makes the group usable again, when the
  // caller knows no collective was left half done (every rank stopped at the same point).
  void rank_failed(int r, const std::string& what);
  bool has_failure() const;
  void clear_failures();

  struct Shared;  // the state the ranks share (threads.cpp)

 private:
  std::shared_ptr<Shared> shared_;
  std::vector<std::shared_ptr<Communicator>> ranks_;
};

}  // namespace onnxtrain
