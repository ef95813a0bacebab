// The MPI program the data-parallel tests launch with `mpirun -np N dist_worker MODE ...`:
//   collectives                      every Communicator operation against known values
//   train MODEL CONFIG OUT [B] [STEPS] [MODE]   trains STEPS steps (default 20) of batch B (default 8) per rank,
//                                    reducing as MODE says (test::set_dp_mode; default overlap); every
//                                    rank writes OUT/final_rank<r>.onnx and OUT/losses_rank<r>.txt and calls
//                                    save_checkpoint(OUT/checkpoint_rank<r>.onnx) (only rank 0 may write)
//   fail MODEL HOW STEP              rank 1 fails at STEP: HOW = kill (SIGKILL itself), stop (SIGSTOP itself),
//                                    raise (an Error its main catches and returns 1 on), raise_abort (the same,
//                                    then Communicator::abort); rank 0 trains on and must end with an error
// Exit status 0 on success; errors are printed as "dist_worker: <message>".
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "distributed/mpi.h"
#include "dp_common.h"
#include "graph/error.h"
#include "graph/float16.h"
#include "graph/model_io.h"

using namespace onnxtrain;

namespace {

void expect(bool ok, const std::string& what) {
  if (!ok) fail("collectives", what);
}

void collectives(Communicator& c) {
  const int r = c.rank(), n = c.size();
  // broadcast: raw bytes from the last rank
  std::vector<int64_t> b = {r, r * 10, 7};
  c.broadcast(b.data(), b.size() * sizeof(int64_t), n - 1);
  expect(b[0] == n - 1 && b[1] == (n - 1) * 10 && b[2] == 7, "broadcast from the last rank");
  // allreduce sum and mean, float32 and float64, in place and out of place
  std::vector<float> f = {float(r + 1), 0.5f, -float(r)};
  c.allreduce(f.data(), f.size(), DType::Float32, ReduceOp::Sum);
  const float tri = float(n * (n + 1) / 2);
  expect(f[0] == tri && f[1] == 0.5f * n && f[2] == -float(n * (n - 1) / 2), "float32 sum in place");
  std::vector<double> d = {double(r), 1.0}, out(2, -1);
  c.allreduce(d.data(), out.data(), d.size(), DType::Float64, ReduceOp::Mean);
  expect(std::fabs(out[0] - (n - 1) / 2.0) < 1e-15 && out[1] == 1.0 && d[0] == r, "float64 mean out of place");
  expect(c.allreduce(double(r + 1), ReduceOp::Sum) == tri, "host double sum");
  // a tensor broadcast and a larger buffer than one bucket would usually hold
  Tensor t = Tensor::from_vector<float>({2, 2}, {float(r), 1, 2, 3});
  c.broadcast(t, 0);
  expect(t.ptr<float>()[0] == 0, "tensor broadcast from rank 0");
  std::vector<float> big(3 << 20, float(r));
  c.allreduce(big.data(), big.size(), DType::Float32, ReduceOp::Mean);
  expect(big.front() == float(n - 1) / 2 && big.back() == float(n - 1) / 2, "12 MB float32 mean");
  // 16-bit floats (gradient compression): summed in float32, rounded once
  std::vector<uint16_t> h = {FloatToBFloat16{}(float(r + 1)), FloatToBFloat16{}(0.5f)};
  c.allreduce(h.data(), h.size(), DType::BFloat16, ReduceOp::Sum);
  expect(BFloat16ToFloat{}(h[0]) == tri && BFloat16ToFloat{}(h[1]) == 0.5f * n, "bfloat16 sum");
  h = {FloatToHalf{}(float(r + 1)), FloatToHalf{}(-0.25f)};
  c.allreduce(h.data(), h.size(), DType::Float16, ReduceOp::Mean);
  expect(HalfToFloat{}(h[0]) == tri / n && HalfToFloat{}(h[1]) == -0.25f, "float16 mean");
  // nonblocking: two reductions in flight at once, waited for in the other order
  std::vector<float> u(1000, float(r)), v(5, 1.0f);
  PendingReduce pu, pv;
  c.start_allreduce(pu, u.data(), u.size(), DType::Float32, ReduceOp::Sum);
  c.start_allreduce(pv, v.data(), v.size(), DType::Float32, ReduceOp::Mean);
  c.wait(pv);
  c.wait(pu);
  expect(u.front() == float(n * (n - 1) / 2) && u.back() == u.front() && v[4] == 1.0f, "start_allreduce and wait");
  c.barrier();
  // bad arguments are errors, not crashes, and leave the communicator usable
  bool threw = false;
  try {
    int64_t i = 1;
    c.allreduce(&i, 1, DType::Int64, ReduceOp::Sum);
  } catch (const Error& e) {
    threw = std::strstr(e.what(), "expected float32, float64, float16 or bfloat16") != nullptr;
  }
  expect(threw, "an int64 allreduce must be refused with a clear error");
  c.barrier();
  std::printf("rank %d: collectives ok\n", r);
}

void write_lines(const std::string& path, const std::vector<float>& v) {
  std::ofstream o(path);
  o.precision(9);
  for (float x : v) o << x << "\n";
}

int run(int argc, char** argv, std::shared_ptr<Communicator>& comm) {
  const std::string mode = argc > 1 ? argv[1] : "";
  comm = mpi_world();
  const int r = comm->rank();
  if (mode == "collectives") {
    collectives(*comm);
    return 0;
  }
  const test::Dataset data = test::make_dataset(1024, 16, 3);
  if (mode == "train" && argc >= 5) {
    const std::string out = argv[4];
    const int64_t batch = argc > 5 ? std::stoll(argv[5]) : 8;
    const int steps = argc > 6 ? std::stoi(argv[6]) : 20;
    TrainingConfig cfg = test::dp_config(argv[3]);
    cfg.parallel.communicator = comm;
    cfg.parallel.bucket_bytes = 1024;  // several buckets even for this small model
    test::set_dp_mode(cfg.parallel, argc > 7 ? argv[7] : "overlap");
    TrainingSession s = TrainingSession::from_file(argv[2], cfg);
    const std::vector<float> losses = test::train_shard(s, data, r, comm->size(), steps, batch);
    const std::string tag = "_rank" + std::to_string(r);
    save_model(s.export_inference(), out + "/final" + tag + ".onnx");
    write_lines(out + "/losses" + tag + ".txt", losses);
    s.save_checkpoint(out + "/checkpoint" + tag + ".onnx");
    comm->barrier();
    return 0;
  }
  if (mode == "fail" && argc >= 5) {
    const std::string how = argv[3];
    const int at = std::stoi(argv[4]);
    TrainingConfig cfg = test::dp_config("sgd_momentum");
    cfg.parallel.communicator = comm;
    TrainingSession s = TrainingSession::from_file(argv[2], cfg);
    SamplerOptions so;
    DistributedSampler sampler(data.x.shape[0], r, comm->size(), so);
    const std::vector<int64_t> idx = sampler.indices();
    for (int k = 0; k < 60; ++k) {
      if (r == 1 && k == at) {
        std::fprintf(stderr, "rank 1: failing by '%s' at step %d\n", how.c_str(), k);
        std::fflush(stderr);
        if (how == "kill") kill(getpid(), SIGKILL);
        if (how == "stop") kill(getpid(), SIGSTOP);
        if (how == "raise" || how == "raise_abort") fail("rank 1", "a deliberate error at step " + std::to_string(k));
      }
      s.train_step(test::gather_batch(data, idx, k * 8, 8, s));
    }
    std::fprintf(stderr, "rank %d: finished all steps, the failure was not noticed\n", r);
    return 3;
  }
  std::fprintf(stderr, "usage: dist_worker collectives | train MODEL CONFIG OUT [B] [STEPS] [MODE] | fail MODEL HOW STEP\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::shared_ptr<Communicator> comm;
  try {
    return run(argc, argv, comm);
  } catch (const Error& e) {
    if (comm && argc > 3 && std::string(argv[3]) == "raise_abort") comm->abort(1, e.what());
    std::fprintf(stderr, "dist_worker: %s\n", e.what());
    return 1;
  }
}
