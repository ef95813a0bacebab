#include "distributed/nccl.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "graph/error.h"

#if ONNXTRAIN_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace onnxtrain {

#if !ONNXTRAIN_WITH_NCCL

bool nccl_available() { return false; }

std::shared_ptr<Communicator> nccl_communicator(std::shared_ptr<Communicator>, NcclOptions) {
  fail("nccl", "onnxtrain was built without NCCL (CMake found no CUDA toolkit with nccl.h and libnccl; "
               "docs/distributed.md)");
}

#else

bool cuda_available();  // executor/cuda/device.cu
namespace cuda {
cudaStream_t stream();  // executor/cuda/runtime.h: the stream the kernels of this thread run on
}

bool nccl_available() { return true; }

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("nccl", std::string(what) + " failed: " + cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::Float32: return ncclFloat32;
    case DType::Float64: return ncclFloat64;
    case DType::Float16: return ncclFloat16;
    default: return ncclBfloat16;
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Communicator> bootstrap, int device, double timeout)
      : bootstrap_(std::move(bootstrap)), timeout_(timeout) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    // Blocking stream: it waits for work on the legacy default stream, where the kernels produced the buffers.
    check_cuda(cudaStreamCreate(&stream_), "cudaStreamCreate");
    ncclUniqueId id{};
    if (bootstrap_->rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    bootstrap_->broadcast(&id, sizeof id, 0);
    check(ncclCommInitRank(&comm_, bootstrap_->size(), id, bootstrap_->rank()), "ncclCommInitRank");
  }
  ~NcclCommunicator() override {
    if (comm_) broken() ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (side_) cudaStreamDestroy(side_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return bootstrap_->rank(); }
  int size() const override { return bootstrap_->size(); }
  Device device() const override { return Device::CUDA; }
  std::string backend() const override { return "nccl"; }
  [[noreturn]] void abort(int exit_code, const std::string& message) override {
    if (comm_) ncclCommAbort(comm_);
    bootstrap_->abort(exit_code, message);
    std::_Exit(exit_code);  // not reached
  }

 protected:
  void do_broadcast(void* data, size_t bytes, int root) override {
    check(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast");
    wait("broadcast of " + std::to_string(bytes) + " bytes");
  }
  void do_allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    check(ncclAllReduce(send, recv, count, nccl_type(dtype), op == ReduceOp::Sum ? ncclSum : ncclAvg, comm_, stream_),
          "ncclAllReduce");
    wait("allreduce of " + std::to_string(count) + " " + dtype_name(dtype) + " values");
  }
  // The nonblocking path (AllReduceStart/AllReduceWait): the reduction runs on a non-blocking stream of its own,
  // after an event marks the compute stream's work so far (the kernels that wrote the bucket), so the kernels
  // launched after it (the rest of the backward pass) run beside it. wait() polls its completion event against
  // the timeout, as every NCCL wait here does. Compiled, never run on a GPU (docs/distributed.md).
  bool overlaps() const override { return true; }
  void do_start_allreduce(PendingReduce& p) override {
    if (!side_) check_cuda(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    cudaEvent_t ready = event(p, 0), done = event(p, 1);
    check_cuda(cudaEventRecord(ready, cuda::stream()), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(side_, ready, 0), "cudaStreamWaitEvent");
    check(ncclAllReduce(p.data, p.data, p.count, nccl_type(p.dtype), p.op == ReduceOp::Sum ? ncclSum : ncclAvg, comm_,
                        side_),
          "ncclAllReduce");
    check_cuda(cudaEventRecord(done, side_), "cudaEventRecord");
    p.in_flight = true;
  }
  void do_wait(PendingReduce& p) override {
    const cudaEvent_t done = event(p, 1);
    wait_until([&] { return cudaEventQuery(done); },
               "allreduce of " + std::to_string(p.count) + " " + dtype_name(p.dtype) + " values");
  }
  void do_barrier() override { bootstrap_->barrier(); }
  void host_allreduce(double* values, size_t count, ReduceOp op) override {
    bootstrap_->allreduce(values, count, DType::Float64, op);
  }

 private:
  void check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) {
      if (comm_) ncclCommAbort(comm_);
      comm_ = nullptr;
      fail_collective(std::string(what) + " failed: " + ncclGetErrorString(r));
    }
  }

  // Event `which` (0 ready, 1 done) of p, made on first use and kept in p's handle until the communicator goes.
  cudaEvent_t event(PendingReduce& p, size_t which) {
    cudaEvent_t e = nullptr;
    std::memcpy(&e, &p.handle[which], sizeof e);
    if (!e) {
      check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      events_.push_back(e);
      std::memcpy(&p.handle[which], &e, sizeof e);
    }
    return e;
  }

  // Polls the stream: NCCL kernels spin on the GPU forever when a peer is gone, so the host must give up.
  void wait(const std::string& what) {
    wait_until([&] { return cudaStreamQuery(stream_); }, what);
  }
  template <class Query> void wait_until(Query query, const std::string& what) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    for (;;) {
      const cudaError_t e = query();
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) check_cuda(e, what.c_str());
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) check(async, what.c_str());
      if (clock::now() - start > std::chrono::duration<double>(timeout_)) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        fail_timeout(what, timeout_);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  std::shared_ptr<Communicator> bootstrap_;
  double timeout_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t side_ = nullptr;  // the nonblocking reductions'
  std::vector<cudaEvent_t> events_;
  ncclComm_t comm_ = nullptr;
};

int local_rank(const Communicator& c) {
  if (const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) return std::atoi(v);
  if (const char* v = std::getenv("MPI_LOCALRANKID")) return std::atoi(v);
  return c.rank();
}

}  // namespace

std::shared_ptr<Communicator> nccl_communicator(std::shared_ptr<Communicator> bootstrap, NcclOptions options) {
  if (!bootstrap) fail("nccl", "needs a bootstrap communicator (mpi_world()) to share NCCL's unique id");
  if (bootstrap->device() != Device::CPU) fail("nccl", "the bootstrap communicator must use host buffers (MPI)");
  if (!cuda_available()) fail("nccl", "no CUDA device is visible to this process");
  int devices = 0;
  check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  const int device = options.device >= 0 ? options.device : local_rank(*bootstrap) % devices;
  if (device >= devices)
    fail("nccl", "device " + std::to_string(device) + " requested, but " + std::to_string(devices) + " are visible");
  const double timeout = comm_timeout(options.timeout_seconds);
  return std::make_shared<NcclCommunicator>(std::move(bootstrap), device, timeout);
}

#endif

}  // namespace onnxtrain
