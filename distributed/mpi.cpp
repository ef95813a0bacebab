#include "distributed/mpi.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "graph/error.h"
#include "graph/float16.h"

#if ONNXTRAIN_WITH_MPI
#include <mpi.h>
#endif

namespace onnxtrain {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

std::shared_ptr<Communicator> communicator_from_environment(MpiOptions options) {
  return launched_by_mpi() ? mpi_world(options) : single_process_communicator();
}

#if !ONNXTRAIN_WITH_MPI

bool mpi_available() { return false; }

std::shared_ptr<Communicator> mpi_world(MpiOptions) {
  fail("mpi", "onnxtrain was built without MPI (CMake found no MPI library; install libopenmpi-dev and rebuild)");
}

#else

bool mpi_available() { return true; }

namespace {

// MPI's lifetime for the process: finalized at exit if we initialized it. A failed collective leaves requests
// that will never complete, and MPI_Finalize may wait for the dead peer, so then we abort the job instead.
struct MpiRuntime {
  bool we_initialized = false;
  bool failed = false;
  ~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (failed) MPI_Abort(MPI_COMM_WORLD, 1);
    else if (we_initialized) MPI_Finalize();
  }
};

MpiRuntime& runtime() {
  static MpiRuntime r;
  return r;
}

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    default: return MPI_UINT16_T;  // float16, bfloat16: summed by the user ops below
  }
}

// Sums of 16-bit floats: each addition in float32, rounded once (MPI has no float16/bfloat16 sum).
template <class ToFloat, class FromFloat> void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = FromFloat{}(ToFloat{}(a[i]) + ToFloat{}(b[i]));
}

MPI_Op mpi_sum(DType t) {
  static MPI_Op half = MPI_OP_NULL, bf16 = MPI_OP_NULL;  // made once, after MPI_Init, freed by MPI_Finalize
  if (t == DType::Float16) {
    if (half == MPI_OP_NULL) MPI_Op_create(&sum16<HalfToFloat, FloatToHalf>, 1, &half);
    return half;
  }
  if (t == DType::BFloat16) {
    if (bf16 == MPI_OP_NULL) MPI_Op_create(&sum16<BFloat16ToFloat, FloatToBFloat16>, 1, &bf16);
    return bf16;
  }
  return MPI_SUM;
}

// MPI counts are int: larger buffers go in chunks.
constexpr size_t kMaxChunk = size_t(1) << 30;

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(double timeout) : timeout_(timeout) {
    runtime();  // constructed before MPI starts, so it is destroyed (finalizing MPI) after everything using it
    int init = 0;
    MPI_Initialized(&init);
    if (!init) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized) fail("mpi", "MPI was already finalized in this process; it cannot be started again");
      int provided = 0;
      // Our calls come from one thread at a time (kernels' OpenMP threads never call MPI).
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        fail("mpi", "MPI_Init_thread failed");
      runtime().we_initialized = true;
    }
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && !broken()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::CPU; }
  std::string backend() const override { return "mpi"; }

  [[noreturn]] void abort(int exit_code, const std::string& message) override {
    std::fprintf(stderr, "%s: %s\n", describe().c_str(), message.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this is for the type system
  }

 protected:
  void do_broadcast(void* data, size_t bytes, int root) override {
    for (size_t off = 0; off < bytes; off += kMaxChunk) {
      const int n = static_cast<int>(std::min(kMaxChunk, bytes - off));
      MPI_Request req;
      check(MPI_Ibcast(static_cast<char*>(data) + off, n, MPI_BYTE, root, comm_, &req), "broadcast");
      wait(req, "broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root));
    }
  }

  void do_allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    const size_t es = dtype_size(dtype);
    for (size_t off = 0; off < count; off += kMaxChunk) {
      const int n = static_cast<int>(std::min(kMaxChunk, count - off));
      char* r = static_cast<char*>(recv) + off * es;
      const void* s = send == recv ? MPI_IN_PLACE : static_cast<const char*>(send) + off * es;
      MPI_Request req;
      check(MPI_Iallreduce(s, r, n, mpi_type(dtype), mpi_sum(dtype), comm_, &req), "allreduce");
      wait(req, "allreduce of " + std::to_string(count) + " " + dtype_name(dtype) + " values");
    }
    if (op == ReduceOp::Mean) mean(recv, count, dtype);
  }

  // The nonblocking path (AllReduceStart/AllReduceWait): one MPI_Iallreduce left running between the two.
  // OpenMPI moves a collective's data only inside MPI calls, so starting a reduction also tests the ones still
  // in flight: the reductions of earlier buckets advance while the backward pass computes the next.
  bool overlaps() const override { return true; }

  void do_start_allreduce(PendingReduce& p) override {
    if (p.count > kMaxChunk) return Communicator::do_start_allreduce(p);  // several messages: at once
    MPI_Request req;
    check(MPI_Iallreduce(MPI_IN_PLACE, p.data, static_cast<int>(p.count), mpi_type(p.dtype), mpi_sum(p.dtype), comm_,
                         &req),
          "allreduce");
    static_assert(sizeof(MPI_Request) <= sizeof(PendingReduce::handle));
    std::memcpy(p.handle.data(), &req, sizeof req);
    p.in_flight = true;
    progress();
    in_flight_.push_back(&p);  // capacity kept: no allocation once every bucket has been seen
  }

  void do_wait(PendingReduce& p) override {
    MPI_Request req;
    std::memcpy(&req, p.handle.data(), sizeof req);
    std::erase(in_flight_, &p);
    wait(req, "allreduce of " + std::to_string(p.count) + " " + dtype_name(p.dtype) + " values");
    if (p.op == ReduceOp::Mean) mean(p.data, p.count, p.dtype);
  }

  void do_barrier() override {
    MPI_Request req;
    check(MPI_Ibarrier(comm_, &req), "barrier");
    wait(req, "barrier");
  }

 private:
  template <class T> void scale(T* p, size_t n) const {
    const T f = T(1) / static_cast<T>(size_);
    for (size_t i = 0; i < n; ++i) p[i] *= f;
  }
  template <class ToFloat, class FromFloat> void scale16(uint16_t* p, size_t n) const {
    const float f = 1.0f / static_cast<float>(size_);
    for (size_t i = 0; i < n; ++i) p[i] = FromFloat{}(ToFloat{}(p[i]) * f);
  }
  void mean(void* p, size_t n, DType dtype) const {
    switch (dtype) {
      case DType::Float32: return scale(static_cast<float*>(p), n);
      case DType::Float64: return scale(static_cast<double*>(p), n);
      case DType::Float16: return scale16<HalfToFloat, FloatToHalf>(static_cast<uint16_t*>(p), n);
      default: return scale16<BFloat16ToFloat, FloatToBFloat16>(static_cast<uint16_t*>(p), n);
    }
  }

  // Tests every reduction in flight once (MPI_Test on a completed request leaves MPI_REQUEST_NULL, which the
  // final wait sees as done).
  void progress() {
    for (PendingReduce* q : in_flight_) {
      MPI_Request req;
      std::memcpy(&req, q->handle.data(), sizeof req);
      int done = 0;
      const int rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        runtime().failed = true;
        fail_collective("allreduce failed: " + mpi_error(rc) + " (another rank probably died)");
      }
      std::memcpy(q->handle.data(), &req, sizeof req);
    }
  }

  void check(int rc, const std::string& what) {
    if (rc != MPI_SUCCESS) {
      runtime().failed = true;
      fail_collective(what + ": " + mpi_error(rc));
    }
  }

  // Polls the request. Peers normally arrive within microseconds, so it first spins; after that it sleeps
  // briefly between polls, so a waiting rank does not take a core from ranks that are still computing.
  void wait(MPI_Request& req, const std::string& what) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto limit = std::chrono::duration<double>(timeout_);
    for (unsigned polls = 0;; ++polls) {
      int done = 0;
      const int rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        runtime().failed = true;
        fail_collective(what + " failed: " + mpi_error(rc) + " (another rank probably died)");
      }
      if (done) return;
      if (polls < 4096) continue;
      const auto waited = clock::now() - start;
      if (waited > limit) {
        runtime().failed = true;
        fail_timeout(what, timeout_);
      }
      std::this_thread::sleep_for(waited < std::chrono::milliseconds(10) ? std::chrono::microseconds(20)
                                                                          : std::chrono::microseconds(500));
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<PendingReduce*> in_flight_;  // started, not yet waited for (in start order)
  int rank_ = 0, size_ = 1;
  double timeout_;
};

}  // namespace

std::shared_ptr<Communicator> mpi_world(MpiOptions options) {
  const double timeout = comm_timeout(options.timeout_seconds);
  return std::make_shared<MpiCommunicator>(timeout);
}

#endif

}  // namespace onnxtrain
