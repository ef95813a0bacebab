#pragma once
// Communicator: the collectives data-parallel training needs (broadcast, allreduce, barrier) over a group of
// ranks. Backends: a single-process one (null_communicator), MPI for host buffers (mpi.h) and NCCL for CUDA
// buffers (nccl.h). We write no transport of our own. docs/distributed.md describes launching and failures.
//
// Every rank must call the same collectives in the same order (SPMD). A backend never waits forever: a
// collective that does not complete within its timeout throws Error naming the operation, and the
// communicator is then broken (every later call throws at once).
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "executor/tensor.h"

namespace onnxtrain {

enum class ReduceOp { Sum, Mean };

// True for the dtypes allreduce takes: float32 and float64, and float16/bfloat16 (gradient compression), which
// every backend sums in float32 and rounds once per addition, as NCCL does.
bool reducible_dtype(DType t);

// A nonblocking allreduce in flight (Communicator::start_allreduce). The buffer belongs to the collective until
// wait() returns. Plain data owned by its caller (the AllReduceStart kernel), so a steady-state step allocates
// nothing; the handle holds the backend's request (an MPI_Request, CUDA events).
struct PendingReduce {
  void* data = nullptr;
  size_t count = 0;
  DType dtype = DType::Float32;
  ReduceOp op = ReduceOp::Sum;
  bool in_flight = false;
  std::array<uint64_t, 4> handle{};
};
std::string reduce_op_name(ReduceOp op);  // "sum", "mean"
ReduceOp reduce_op_from_name(const std::string& name, const std::string& where);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Device device() const = 0;        // where buffers passed to it live
  virtual std::string backend() const = 0;  // "single", "mpi", "nccl"

  // The non-virtual entry points check arguments (errors name the operation and what was expected) and that
  // the communicator is usable, then call the backend.
  // Copies root's `bytes` bytes at data into every other rank's data.
  void broadcast(void* data, size_t bytes, int root = 0);
  // Reduces count float32/float64 values across ranks. send == recv reduces in place.
  void allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op);
  void allreduce(void* data, size_t count, DType dtype, ReduceOp op) { allreduce(data, data, count, dtype, op); }
  // Several buffers of one dtype in one collective: buffer i of every rank reduces with buffer i of the others.
  // Backends that read their peers' memory (threads) reduce them in place at once; the default reduces them one
  // by one, so the AllReduce kernel packs them into one buffer for those (reduces_many_at_once() false).
  void allreduce_many(std::span<const void* const> send, std::span<void* const> recv, std::span<const size_t> counts,
                      DType dtype, ReduceOp op);
  virtual bool reduces_many_at_once() const { return false; }
  // Starts reducing p's count values in place at `data` and returns; wait(p) completes it. Every rank must start
  // the same reductions in the same order (they may be waited for in any order). Backends that cannot leave a
  // collective running (threads, single process, test communicators) reduce before start_allreduce returns, which
  // overlaps nothing but gives the same values; overlaps() says which kind this is. A p still in flight is waited
  // for first.
  void start_allreduce(PendingReduce& p, void* data, size_t count, DType dtype, ReduceOp op);
  void wait(PendingReduce& p);
  virtual bool overlaps() const { return false; }
  void barrier();
  // Host-side conveniences for metrics and small values (always host memory, whatever the backend's device).
  double allreduce(double value, ReduceOp op);
  void broadcast(Tensor& t, int root = 0);  // a tensor on this communicator's device, same shape on every rank

  // Ends the whole job now with this exit code, after printing message to stderr: for a rank that fails while
  // the others may be waiting in a collective (a normal exit could leave them waiting until their timeout).
  [[noreturn]] virtual void abort(int exit_code, const std::string& message);

  bool broken() const { return broken_; }
  // "mpi rank 0 of 2", for messages.
  std::string describe() const;

 protected:
  virtual void do_broadcast(void* data, size_t bytes, int root) = 0;
  virtual void do_allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;
  virtual void do_barrier() = 0;
  virtual void do_allreduce_many(std::span<const void* const> send, std::span<void* const> recv,
                                 std::span<const size_t> counts, DType dtype, ReduceOp op);
  // The default reduces at once (do_allreduce) and has nothing to wait for.
  virtual void do_start_allreduce(PendingReduce& p);
  virtual void do_wait(PendingReduce& p);
  // Host-memory allreduce of doubles for the conveniences above; the default uses do_allreduce, which suits
  // backends whose device is the host.
  virtual void host_allreduce(double* values, size_t count, ReduceOp op);
  // Marks the communicator unusable and throws "<describe()>: <what>".
  [[noreturn]] void fail_collective(const std::string& what);
  // The same for a collective that did not complete within timeout seconds, with the common explanation.
  [[noreturn]] void fail_timeout(const std::string& what, double timeout);

 private:
  void check_usable(const char* op) const;
  bool broken_ = false;
};

// One process alone: rank 0 of 1, every collective is a copy or nothing. Host buffers.
std::shared_ptr<Communicator> single_process_communicator();

// Seconds a collective may wait for the other ranks before it fails: `requested` when positive; for 0 the
// environment variable ONNXTRAIN_COMM_TIMEOUT when set (a positive number), else 300.
double comm_timeout(double requested = 0);

}  // namespace onnxtrain
