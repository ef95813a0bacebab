#include "distributed/mpi.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "graph/error.h"

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

MPI_Datatype mpi_type(DType t) { return t == DType::Float32 ? MPI_FLOAT : MPI_DOUBLE; }

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
      check(MPI_Iallreduce(s, r, n, mpi_type(dtype), MPI_SUM, comm_, &req), "allreduce");
      wait(req, "allreduce of " + std::to_string(count) + " " + dtype_name(dtype) + " values");
    }
    if (op == ReduceOp::Mean) {
      if (dtype == DType::Float32) scale(static_cast<float*>(recv), count);
      else scale(static_cast<double*>(recv), count);
    }
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
