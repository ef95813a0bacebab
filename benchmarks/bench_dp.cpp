// Data-parallel throughput for the scaling benchmark (benchmarks/scaling.sh): run it under `mpirun -np N` with
// one thread per rank. Every rank trains MODEL (an MLP [batch, F] -> [batch, 1], e.g. the shared W1) with Adam
// on its shard of synthetic data, BATCH samples per rank and step; rank 0 prints one JSON line with the
// global throughput (all ranks' samples) of the median of REPEATS timed runs of STEPS steps.
//
//   mpirun -np 2 bench_dp MODEL [--batch 128] [--steps 200] [--warmup 20] [--repeats 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "distributed/mpi.h"
#include "distributed/sampler.h"
#include "examples/synthetic.h"
#include "graph/error.h"
#include "training/session.h"

using namespace onnxtrain;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: mpirun -np N bench_dp MODEL [--batch 128] [--steps 200] [--warmup 20] [--repeats 3]\n");
    return 2;
  }
  int64_t batch = 128;
  int steps = 200, warmup = 20, repeats = 3;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--batch") batch = v;
    else if (k == "--steps") steps = v;
    else if (k == "--warmup") warmup = v;
    else if (k == "--repeats") repeats = v;
    else {
      std::fprintf(stderr, "bench_dp: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  std::shared_ptr<Communicator> comm;
  try {
    comm = communicator_from_environment();
    TrainingConfig cfg;
    cfg.optimizer.kind = "adam";
    cfg.optimizer.learning_rate = 1e-3;
    cfg.parallel.communicator = comm;
    TrainingSession s = TrainingSession::from_file(argv[1], cfg);
    const ValueInfo in = s.export_inference().graph.inputs.at(0);
    const int64_t features = in.type.shape.value().at(1).value;
    if (features <= 0) fail(argv[1], "expected an input [batch, features] with known features");
    const int64_t per_rank = batch * steps;
    auto [x, y] = examples::make_regression(per_rank * comm->size(), features);
    const std::vector<int64_t> idx = DistributedSampler(x.shape[0], comm->rank(), comm->size()).indices();
    // Batches are gathered once, outside the timer: the benchmark measures training, not data loading.
    std::vector<Feeds> batches;
    for (int k = 0; k < steps; ++k) {
      Tensor bx = Tensor::empty(DType::Float32, {batch, features}), by = Tensor::empty(DType::Float32, {batch, 1});
      for (int64_t i = 0; i < batch; ++i) {
        const int64_t row = idx[k * batch + i];
        std::memcpy(bx.ptr<float>() + i * features, x.ptr<float>() + row * features, sizeof(float) * features);
        by.ptr<float>()[i] = y.ptr<float>()[row];
      }
      batches.push_back({{in.name, bx}, {s.target_name(), by}});
    }
    for (int k = 0; k < warmup; ++k) s.train_step(batches[k % steps]);
    std::vector<double> secs;
    float loss = 0;
    for (int r = 0; r < repeats; ++r) {
      comm->barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (const Feeds& f : batches) loss = s.train_step(f);
      comm->barrier();
      secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(secs.begin(), secs.end());
    const double med = secs[secs.size() / 2];
    if (comm->rank() == 0)
      std::printf("{\"ranks\": %d, \"batch_per_rank\": %lld, \"steps\": %d, \"seconds\": %.4f, \"samples_per_s\": %.1f, "
                  "\"final_loss\": %.6f}\n",
                  comm->size(), static_cast<long long>(batch), steps, med,
                  double(batch) * steps * comm->size() / med, loss);
  } catch (const Error& e) {
    if (comm && comm->size() > 1) comm->abort(1, std::string("bench_dp: ") + e.what());
    std::fprintf(stderr, "bench_dp: %s\n", e.what());
    return 1;
  }
  return 0;
}
