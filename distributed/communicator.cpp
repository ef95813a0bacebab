#include "distributed/communicator.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "graph/error.h"

namespace onnxtrain {

std::string reduce_op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "mean"; }

ReduceOp reduce_op_from_name(const std::string& name, const std::string& where) {
  if (name == "sum") return ReduceOp::Sum;
  if (name == "mean") return ReduceOp::Mean;
  fail(where, "expected reduction 'sum' or 'mean', got '" + name + "'");
}

bool reducible_dtype(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Float16 || t == DType::BFloat16;
}

std::string Communicator::describe() const {
  return backend() + " rank " + std::to_string(rank()) + " of " + std::to_string(size());
}

void Communicator::check_usable(const char* op) const {
  if (broken_)
    fail(describe(), std::string(op) +
                         ": the communicator failed in an earlier collective (a rank died, raised or timed out); "
                         "it cannot be used any more");
}

void Communicator::fail_collective(const std::string& what) {
  broken_ = true;
  fail(describe(), what);
}

void Communicator::fail_timeout(const std::string& what, double timeout) {
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", timeout);
  fail_collective(what + " timed out after " + secs +
                  " s waiting for the other ranks: one of them died, raised an error, or is stuck (every rank must "
                  "call the same collectives in the same order). ONNXTRAIN_COMM_TIMEOUT sets the limit.");
}

void Communicator::broadcast(void* data, size_t bytes, int root) {
  check_usable("broadcast");
  if (root < 0 || root >= size())
    fail(describe(), "broadcast: root " + std::to_string(root) + " is not a rank (0.." + std::to_string(size() - 1) + ")");
  if (bytes == 0) return;
  if (!data) fail(describe(), "broadcast: null buffer");
  do_broadcast(data, bytes, root);
}

void Communicator::allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  check_usable("allreduce");
  if (!reducible_dtype(dtype))
    fail(describe(), "allreduce: expected float32, float64, float16 or bfloat16 values, got " + dtype_name(dtype));
  if (count == 0) return;
  if (!send || !recv) fail(describe(), "allreduce: null buffer");
  do_allreduce(send, recv, count, dtype, op);
}

void Communicator::allreduce_many(std::span<const void* const> send, std::span<void* const> recv,
                                  std::span<const size_t> counts, DType dtype, ReduceOp op) {
  check_usable("allreduce");
  if (!reducible_dtype(dtype))
    fail(describe(), "allreduce: expected float32, float64, float16 or bfloat16 values, got " + dtype_name(dtype));
  if (send.size() != recv.size() || send.size() != counts.size())
    fail(describe(), "allreduce: expected as many send and receive buffers as counts");
  for (size_t i = 0; i < send.size(); ++i)
    if (counts[i] && (!send[i] || !recv[i])) fail(describe(), "allreduce: null buffer " + std::to_string(i));
  if (!send.empty()) do_allreduce_many(send, recv, counts, dtype, op);
}

void Communicator::do_allreduce_many(std::span<const void* const> send, std::span<void* const> recv,
                                     std::span<const size_t> counts, DType dtype, ReduceOp op) {
  for (size_t i = 0; i < send.size(); ++i)
    if (counts[i]) do_allreduce(send[i], recv[i], counts[i], dtype, op);
}

void Communicator::start_allreduce(PendingReduce& p, void* data, size_t count, DType dtype, ReduceOp op) {
  if (p.in_flight) wait(p);
  check_usable("allreduce");
  if (!reducible_dtype(dtype))
    fail(describe(), "allreduce: expected float32, float64, float16 or bfloat16 values, got " + dtype_name(dtype));
  if (count && !data) fail(describe(), "allreduce: null buffer");
  p.data = data;
  p.count = count;
  p.dtype = dtype;
  p.op = op;
  if (count) do_start_allreduce(p);
}

void Communicator::wait(PendingReduce& p) {
  if (!p.in_flight) return;
  check_usable("allreduce");
  do_wait(p);
  p.in_flight = false;
}

void Communicator::do_start_allreduce(PendingReduce& p) { do_allreduce(p.data, p.data, p.count, p.dtype, p.op); }

void Communicator::do_wait(PendingReduce&) {}

void Communicator::barrier() {
  check_usable("barrier");
  do_barrier();
}

void Communicator::host_allreduce(double* values, size_t count, ReduceOp op) {
  do_allreduce(values, values, count, DType::Float64, op);
}

double Communicator::allreduce(double value, ReduceOp op) {
  check_usable("allreduce");
  host_allreduce(&value, 1, op);
  return value;
}

void Communicator::broadcast(Tensor& t, int root) {
  if (t.device != device())
    fail(describe(), "broadcast: tensor " + t.describe() + " is on " + device_name(t.device) + ", the communicator uses " +
                         device_name(device()) + " buffers");
  broadcast(t.data, t.nbytes(), root);
}

void Communicator::abort(int exit_code, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", describe().c_str(), message.c_str());
  std::fflush(stderr);
  std::_Exit(exit_code);
}

namespace {

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Device device() const override { return Device::CPU; }
  std::string backend() const override { return "single"; }

 protected:
  void do_broadcast(void*, size_t, int) override {}
  void do_allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp) override {
    if (send != recv) std::memcpy(recv, send, count * dtype_size(dtype));
  }
  void do_barrier() override {}
};

}  // namespace

std::shared_ptr<Communicator> single_process_communicator() { return std::make_shared<SingleProcess>(); }

double comm_timeout(double requested) {
  if (requested > 0 && std::isfinite(requested)) return requested;
  if (requested != 0) fail("communicator timeout", "expected seconds > 0 (or 0 for the default), got " + std::to_string(requested));
  const char* env = std::getenv("ONNXTRAIN_COMM_TIMEOUT");
  if (!env || !*env) return 300.0;
  char* end = nullptr;
  const double v = std::strtod(env, &end);
  if (end == env || *end != '\0' || !(v > 0) || !std::isfinite(v))
    fail("ONNXTRAIN_COMM_TIMEOUT", std::string("expected a positive number of seconds, got '") + env + "'");
  return v;
}

}  // namespace onnxtrain
