// Data-parallel throughput for the scaling benchmark (benchmarks/scaling.sh): run it under `mpirun -np N` with
// one thread per rank, or alone (one process at the global batch, or one of two "lone" processes: the ceiling).
// Every rank trains MODEL on its shard of synthetic data, BATCH samples per rank and step; rank 0 prints one JSON
// line with the global throughput (all ranks' samples) of the median of REPEATS timed runs of STEPS steps.
//
//   mpirun -np 2 bench_dp MODEL [--workload w1|w3|w5] [--batch 128] [--steps 200] [--warmup 20] [--repeats 3]
//                         [--overlap 1] [--bucket-bytes 1048576] [--compression none] [--profile 0]
//                         [--accumulate 1] [--sums 0] [--curve 0]
//
// w1: an MLP [batch, F] -> [batch, 1] (the shared W1), MSE, Adam lr 1e-3, regression data.
// w3: a token model [batch, seq] int64 -> [batch, seq, classes] (the shared W3), token cross-entropy, AdamW lr 1e-3
//     weight decay 0.01 (bench_train's W3 settings), uniform random tokens and targets.
// w5: the real all-MiniLM-L6-v2 classifier (`benchmarks/w5_minilm.py --export MODEL`): input_ids and attention_mask
//     [batch, seq], cross-entropy on 2 classes, AdamW lr 2e-5 weight decay 0.01 (W5's settings), batches drawn as
//     W5 draws them (random ids after [CLS], lengths 32..seq, masked after them, labels 0/1).
// --profile 1 adds one more timed run with the step profiler on (docs/performance.md) and prints, per step, the
// time in compute (every plan step but the collectives), in AllReduceStart (packing and starting the reductions),
// in AllReduceWait (waiting for them and unpacking) and in blocking AllReduce steps (communication and waiting for
// the slower rank, which a blocking call cannot tell apart). The profiled run is not the one whose rate is printed.
// --accumulate k trains with optimizer.gradient_accumulation k (each train_step is a micro-batch), --sums 1 with
// distributed.reduce_every_micro_batch false. --curve N adds a fresh session's loss curve: N train_step calls over
// the batches in order, the reported loss averaged over each tenth of them ("curve", for benchmarks/README.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "benchmarks/token_logits.h"
#include "distributed/mpi.h"
#include "training/sampler.h"
#include "examples/synthetic.h"
#include "graph/error.h"
#include "graph/model_io.h"
#include "training/session.h"

using namespace onnxtrain;

namespace {

struct Options {
  std::string workload = "w1";
  int64_t batch = 128;
  int steps = 200, warmup = 20, repeats = 3;
  bool overlap = true, profile = false;
  size_t bucket_bytes = DataParallelSpec::kDefaultBucketBytes;
  std::string compression = "none";
  int accumulate = 1, curve = 0;
  bool sums = false;
};

// Per-rank batches, gathered once outside the timer: the benchmark measures training, not data loading.
std::vector<Feeds> make_batches(const Options& o, const Model& m, const TrainingSession& s, const Communicator& comm) {
  const ValueInfo& in = m.graph.inputs.at(0);
  const int64_t cols = in.type.shape.value().at(1).value;
  if (cols <= 0) fail("bench_dp", "expected an input [batch, n] with a known n");
  std::vector<Feeds> batches;
  if (o.workload == "w1") {
    const int64_t per_rank = o.batch * o.steps;
    auto [x, y] = examples::make_regression(per_rank * comm.size(), cols);
    const std::vector<int64_t> idx = DistributedSampler(x.shape[0], comm.rank(), comm.size()).indices();
    for (int k = 0; k < o.steps; ++k) {
      Tensor bx = Tensor::empty(DType::Float32, {o.batch, cols}), by = Tensor::empty(DType::Float32, {o.batch, 1});
      for (int64_t i = 0; i < o.batch; ++i) {
        const int64_t row = idx[k * o.batch + i];
        std::memcpy(bx.ptr<float>() + i * cols, x.ptr<float>() + row * cols, sizeof(float) * cols);
        by.ptr<float>()[i] = y.ptr<float>()[row];
      }
      batches.push_back({{in.name, bx}, {s.target_name(), by}});
    }
    return batches;
  }
  if (o.workload == "w5") {
    constexpr int64_t kVocab = 30522, kCls = 101, kSep = 102;
    const ValueInfo& mask_in = m.graph.inputs.at(1);
    std::mt19937 rng(1234u + static_cast<unsigned>(comm.rank()));
    std::uniform_int_distribution<int64_t> token(1000, kVocab - 1), length(std::min<int64_t>(32, cols), cols), label(0, 1);
    for (int k = 0; k < o.steps; ++k) {
      Tensor ids = Tensor::empty(DType::Int64, {o.batch, cols}), mask = Tensor::empty(DType::Int64, {o.batch, cols});
      Tensor y = Tensor::empty(DType::Int64, {o.batch});
      for (int64_t i = 0; i < o.batch; ++i) {
        const int64_t len = length(rng);
        for (int64_t j = 0; j < cols; ++j) {
          const bool in_text = j < len;
          ids.ptr<int64_t>()[i * cols + j] = !in_text ? 0 : j == 0 ? kCls : j == len - 1 ? kSep : token(rng);
          mask.ptr<int64_t>()[i * cols + j] = in_text ? 1 : 0;
        }
        y.ptr<int64_t>()[i] = label(rng);
      }
      batches.push_back({{in.name, ids}, {mask_in.name, mask}, {s.target_name(), y}});
    }
    return batches;
  }
  // w3: token ids below the class count (the vocabulary of the shared W3 is its class count).
  const int64_t classes = m.graph.outputs.at(0).type.shape.value().back().value;
  std::mt19937 rng(1234u + static_cast<unsigned>(comm.rank()));
  std::uniform_int_distribution<int64_t> token(0, classes - 1);
  for (int k = 0; k < o.steps; ++k) {
    Tensor bx = Tensor::empty(DType::Int64, {o.batch, cols}), by = Tensor::empty(DType::Int64, {o.batch * cols});
    for (int64_t i = 0; i < o.batch * cols; ++i) {
      bx.ptr<int64_t>()[i] = token(rng);
      by.ptr<int64_t>()[i] = token(rng);
    }
    batches.push_back({{in.name, bx}, {s.target_name(), by}});
  }
  return batches;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: mpirun -np N bench_dp MODEL [--workload w1|w3|w5] [--batch 128] [--steps 200] [--warmup 20] "
                 "[--repeats 3] [--overlap 1] [--bucket-bytes N] [--compression none|bfloat16|float16] [--profile 0]\n");
    return 2;
  }
  Options o;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--workload") o.workload = v;
    else if (k == "--batch") o.batch = std::stoll(v);
    else if (k == "--steps") o.steps = std::stoi(v);
    else if (k == "--warmup") o.warmup = std::stoi(v);
    else if (k == "--repeats") o.repeats = std::stoi(v);
    else if (k == "--overlap") o.overlap = v != "0";
    else if (k == "--bucket-bytes") o.bucket_bytes = std::stoull(v);
    else if (k == "--compression") o.compression = v;
    else if (k == "--profile") o.profile = v != "0";
    else if (k == "--accumulate") o.accumulate = std::stoi(v);
    else if (k == "--sums") o.sums = v != "0";
    else if (k == "--curve") o.curve = std::stoi(v);
    else {
      std::fprintf(stderr, "bench_dp: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (o.workload != "w1" && o.workload != "w3" && o.workload != "w5") {
    std::fprintf(stderr, "bench_dp: --workload is w1, w3 or w5, got %s\n", o.workload.c_str());
    return 2;
  }
  std::shared_ptr<Communicator> comm;
  try {
    comm = communicator_from_environment();
    Model model = load_model(argv[1]);
    TrainingConfig cfg;
    if (o.workload == "w1") {
      cfg.optimizer.kind = "adam";
      cfg.optimizer.learning_rate = 1e-3;
    } else if (o.workload == "w5") {
      cfg.loss.kind = "cross_entropy";
      cfg.optimizer.kind = "adamw";
      cfg.optimizer.learning_rate = 2e-5;
      cfg.optimizer.weight_decay = 0.01;
    } else {
      bench::flatten_token_logits(model, argv[1]);
      cfg.loss.kind = "cross_entropy";
      cfg.optimizer.kind = "adamw";
      cfg.optimizer.learning_rate = 1e-3;
      cfg.optimizer.weight_decay = 0.01;
    }
    cfg.parallel.communicator = comm;
    cfg.parallel.overlap = o.overlap;
    cfg.parallel.bucket_bytes = o.bucket_bytes;
    cfg.parallel.compression = o.compression;
    cfg.optimizer.gradient_accumulation = o.accumulate;
    cfg.parallel.reduce_every_micro_batch = !o.sums;
    auto run_once = [&](TrainingSession& s, const std::vector<Feeds>& batches, float& loss) {
      comm->barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (const Feeds& f : batches) loss = s.train_step(f);
      comm->barrier();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    TrainingSession s(model, cfg);
    const std::vector<Feeds> batches = make_batches(o, model, s, *comm);
    for (int k = 0; k < o.warmup; ++k) s.train_step(batches[k % o.steps]);
    std::vector<double> secs;
    float loss = 0;
    for (int r = 0; r < o.repeats; ++r) secs.push_back(run_once(s, batches, loss));
    std::sort(secs.begin(), secs.end());
    const double med = secs[secs.size() / 2];
    // The time split: a profiled session of its own, so the rate above is unprofiled.
    double compute = 0, started = 0, waited = 0, blocking = 0, profiled = 0;
    if (o.profile) {
      cfg.profile = true;
      TrainingSession p(model, cfg);
      for (int k = 0; k < o.warmup; ++k) p.train_step(batches[k % o.steps]);
      float ignored = 0;
      profiled = run_once(p, batches, ignored);
      for (const StepTime& t : p.profile()) {
        double& slot = t.op == kAllReduceStartOp ? started : t.op == kAllReduceWaitOp ? waited
                       : t.op == kAllReduceOp    ? blocking
                                                 : compute;
        slot += t.seconds;
      }
      // The profile counts the warm-up steps too: per step over all of them.
      const double n = o.warmup + o.steps;
      compute /= n, started /= n, waited /= n, blocking /= n, profiled /= o.steps;
    }
    std::vector<double> curve;
    if (o.curve > 0) {
      cfg.profile = false;
      TrainingSession c(model, cfg);
      const int chunk = std::max(1, o.curve / 10);
      double sum = 0;
      for (int k = 0; k < o.curve; ++k) {
        sum += c.train_step(batches[k % o.steps]);
        if ((k + 1) % chunk == 0) curve.push_back(sum / chunk), sum = 0;
      }
    }
    if (comm->rank() == 0) {
      std::printf("{\"workload\": \"%s\", \"ranks\": %d, \"batch_per_rank\": %lld, \"steps\": %d, \"overlap\": %d, "
                  "\"bucket_bytes\": %zu, \"compression\": \"%s\", \"seconds\": %.4f, \"samples_per_s\": %.1f, "
                  "\"final_loss\": %.6f",
                  o.workload.c_str(), comm->size(), static_cast<long long>(o.batch), o.steps, int(o.overlap),
                  o.bucket_bytes, o.compression.c_str(), med, double(o.batch) * o.steps * comm->size() / med, loss);
      if (o.profile)
        std::printf(", \"profiled_step_us\": %.1f, \"compute_us\": %.1f, \"start_us\": %.1f, \"wait_us\": %.1f, "
                    "\"blocking_allreduce_us\": %.1f",
                    1e6 * profiled, 1e6 * compute, 1e6 * started, 1e6 * waited, 1e6 * blocking);
      if (!curve.empty()) {
        std::printf(", \"accumulate\": %d, \"sums\": %d, \"curve\": [", o.accumulate, int(o.sums));
        for (size_t i = 0; i < curve.size(); ++i) std::printf("%s%.6g", i ? ", " : "", curve[i]);
        std::printf("]");
      }
      std::printf("}\n");
    }
  } catch (const Error& e) {
    if (comm && comm->size() > 1) comm->abort(1, std::string("bench_dp: ") + e.what());
    std::fprintf(stderr, "bench_dp: %s\n", e.what());
    return 1;
  }
  return 0;
}
