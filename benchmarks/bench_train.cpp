// Trains one shared benchmark workload (../shared/bench) with TrainingSession and prints its metrics as JSON
// lines, following the PyTorch peers' protocol (peers/torch_harness.py) so the two can be compared as ratios:
//   warm-up from the initial weights -> untimed reference run recording the per-step losses -> 3 timed runs,
//   each from the initial weights, timing only the training loop -> median; final loss over the whole data
//   set after the last timed run.
//
//   bench_train --workload w1|w2|w3|w4|w1sgd --models DIR --data DIR [--threads N] [--repeats 3] [--losses PATH]
//               [--profile] [--profile-top N]
//
// --profile: one more epoch after the timed ones with TrainingConfig::profile on, and its per-step times
// (format_profile) on stderr: the N most expensive steps (--profile-top, default 20; it implies --profile).
//
// w1    = W1 "tabular-mlp": MLP 64->256->256->1, batch 128 x 512 steps, MSE, Adam lr 1e-3; train_samples_per_s.
// w2    = W2 "cnn": 2x(Conv-ReLU-MaxPool) + 2 Gemm, batch 64 x 200 steps, softmax cross-entropy on int64
//         labels, SGD lr 0.01 momentum 0.9 nesterov; train_samples_per_s.
// w3    = W3 "transformer": 2-layer post-LN encoder, batch 16 x 100 steps of 64 tokens, token cross-entropy,
//         AdamW lr 1e-3 wd 0.01 on every parameter; train_tokens_per_s.
// w4    = W4 "overhead": MLP 16->32->1, batch 1 x 5000 steps, MSE, SGD lr 0.01; us_per_step.
// w1sgd = the W1 model and data with plain SGD lr 0.01 instead of Adam (kept for comparison with older
//         entries of results.md); train_samples_per_s.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "benchmarks/token_logits.h"
#include "graph/error.h"
#include "graph/model_io.h"
#include "training/replicas.h"
#include "training/session.h"

using namespace onnxtrain;

namespace {

struct Workload {
  std::string id, model, x, y;  // model file stem and the data arrays (see bench_data.py DATASETS)
  int64_t batch, steps, warmup;
  std::string loss;  // "mse" or "cross_entropy" (int64 class indices)
  std::string optimizer;
  double lr;
  double momentum = 0;
  bool nesterov = false;
  std::string metric = "train_samples_per_s", unit = "samples/s";
  int64_t units_per_sample = 1;  // tokens per sequence for W3's tokens/s
  int64_t eval_chunk = 0;        // rows per inference call for the final loss (0 = all at once)
  double weight_decay = 0;
};

// The values of SPEC in peers/bench_data.py (warm-up steps from the peer scripts); w1sgd swaps W1's Adam for
// SGD with W4's learning rate. Adam/AdamW betas and eps are the optimizer's defaults, which are torch's.
const Workload kWorkloads[] = {
    {"w1", "w1", "w1_X", "w1_y", 128, 512, 512, "mse", "adam", 1e-3},
    // Inference in chunks: the whole of W2 (12800 images) or W3 (1600 x 64 x 1000 logits) at once would
    // need several hundred MB of activations; torch's eval_ce of W3 also goes 200 sequences at a time.
    {"w2", "w2", "w2_X", "w2_labels", 64, 200, 20, "cross_entropy", "sgd", 0.01, 0.9, true, "train_samples_per_s",
     "samples/s", 1, 1600},
    {"w3", "w3", "w3_tokens", "w3_targets", 16, 100, 10, "cross_entropy", "adamw", 1e-3, 0, false,
     "train_tokens_per_s", "tokens/s", 64, 200, 0.01},
    {"w4", "w4", "w4_X", "w4_y", 1, 5000, 500, "mse", "sgd", 0.01, 0, false, "us_per_step", "us/step"},
    {"w1sgd", "w1", "w1_X", "w1_y", 128, 512, 512, "mse", "sgd", 0.01},
};

struct Args {
  std::string workload, models, data, losses;
  int threads = 1, repeats = 3;
  int replicas = 1;  // > 1: a ReplicatedSession of that many one-thread replicas (training/replicas.h)
  bool profile = false;
  int profile_top = 20;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_train: %s\nusage: bench_train --workload w1|w2|w3|w4|w1sgd --models DIR --data DIR [--threads N] "
               "[--repeats R] [--replicas N] [--losses PATH] [--profile] [--profile-top N]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value for " + k);
      return argv[++i];
    };
    try {
      if (k == "--workload") a.workload = next();
      else if (k == "--models") a.models = next();
      else if (k == "--data") a.data = next();
      else if (k == "--losses") a.losses = next();
      else if (k == "--threads") a.threads = std::stoi(next());
      else if (k == "--repeats") a.repeats = std::stoi(next());
      else if (k == "--replicas") a.replicas = std::stoi(next());
      else if (k == "--profile") a.profile = true;
      else if (k == "--profile-top") a.profile = true, a.profile_top = std::stoi(next());
      else usage("unknown option " + k);
    } catch (const std::logic_error&) {
      usage("bad number for " + k);
    }
  }
  if (a.workload.empty() || a.models.empty() || a.data.empty()) usage("--workload, --models and --data are required");
  if (a.threads < 1 || a.repeats < 1 || a.profile_top < 1 || a.replicas < 1)
    usage("--threads, --repeats, --replicas and --profile-top must be positive");
  return a;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, "cannot open (run bench_data.py --materialize with BENCH_DATA_DIR set to this folder)");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The manifest bench_data.py writes is fixed-format JSON: "arrays": {"<name>": {"file": ..., "dtype": ...,
// "shape": [...], ...}}. This reads just those three fields of one entry rather than pulling in a JSON library.
struct ArrayInfo {
  std::string file, dtype;
  std::vector<int64_t> shape;
};

std::string string_field(const std::string& obj, const std::string& key, const std::string& where) {
  const size_t k = obj.find("\"" + key + "\"");
  const size_t q1 = k == std::string::npos ? k : obj.find('"', obj.find(':', k) + 1);
  const size_t q2 = q1 == std::string::npos ? q1 : obj.find('"', q1 + 1);
  if (q2 == std::string::npos) fail(where, "no string field '" + key + "'");
  return obj.substr(q1 + 1, q2 - q1 - 1);
}

ArrayInfo array_info(const std::string& manifest, const std::string& name, const std::string& path) {
  const std::string where = path + " entry '" + name + "'";
  const size_t at = manifest.find("\"" + name + "\"");
  const size_t open = at == std::string::npos ? at : manifest.find('{', at);
  const size_t close = open == std::string::npos ? open : manifest.find('}', open);
  if (close == std::string::npos) fail(where, "missing");
  const std::string obj = manifest.substr(open, close - open + 1);
  ArrayInfo info{string_field(obj, "file", where), string_field(obj, "dtype", where), {}};
  const size_t s = obj.find("\"shape\"");
  const size_t lb = s == std::string::npos ? s : obj.find('[', s);
  const size_t rb = lb == std::string::npos ? lb : obj.find(']', lb);
  if (rb == std::string::npos) fail(where, "no 'shape' list");
  std::stringstream dims(obj.substr(lb + 1, rb - lb - 1));
  for (std::string d; std::getline(dims, d, ',');) info.shape.push_back(std::stoll(d));
  return info;
}

// Raw little-endian C-order float32 or int64 (labels, tokens); this runs on little-endian x86 only.
Tensor load_array(const std::string& dir, const std::string& name) {
  const std::string mpath = dir + "/manifest.json";
  const ArrayInfo info = array_info(read_text(mpath), name, mpath);
  DType dt;
  if (info.dtype == "float32") dt = DType::Float32;
  else if (info.dtype == "int64") dt = DType::Int64;
  else fail(mpath + " entry '" + name + "'", "dtype " + info.dtype + ", expected float32 or int64");
  Tensor t = Tensor::empty(dt, info.shape);
  const std::string bytes = read_text(dir + "/" + info.file);
  if (bytes.size() != t.nbytes())
    fail(dir + "/" + info.file, std::to_string(bytes.size()) + " bytes, expected " + std::to_string(t.nbytes()) +
                                    " for " + t.describe());
  std::copy(bytes.begin(), bytes.end(), static_cast<char*>(t.data));
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string json_list(const std::vector<double>& v) {
  std::string s = "[";
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.6g", i ? ", " : "", v[i]);
    s += buf;
  }
  return s + "]";
}

// Rows [row, row + rows) of a [N, ...] array, as a view.
Tensor rows_view(const Tensor& t, int64_t row, int64_t rows) {
  std::vector<int64_t> shape = t.shape;
  shape.at(0) = rows;
  const size_t row_bytes = t.nbytes() / static_cast<size_t>(t.shape.at(0));
  return Tensor::view(t.dtype, shape, static_cast<char*>(t.data) + row * row_bytes);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const Workload* w = nullptr;
  for (const Workload& c : kWorkloads)
    if (c.id == a.workload) w = &c;
  if (!w) usage("unknown workload '" + a.workload + "' (w1, w2, w3, w4 or w1sgd)");
  // OMP_NUM_THREADS is set by run.sh as well; this makes a bare invocation honour --threads too.
  omp_set_num_threads(a.threads);

  try {
    const std::string model_path = a.models + "/" + w->model + ".onnx";
    const Model loaded = load_model(model_path);
    Model model = loaded;
    const bool ce = w->loss == "cross_entropy";
    if (w->id == "w3") bench::flatten_token_logits(model, model_path);
    TrainingConfig cfg;
    cfg.loss.kind = w->loss;
    cfg.loss.reduction = "mean";
    cfg.optimizer.kind = w->optimizer;
    cfg.optimizer.learning_rate = w->lr;
    cfg.optimizer.momentum = w->momentum;
    cfg.optimizer.nesterov = w->nesterov;
    if (w->optimizer != "sgd") cfg.optimizer.weight_decay = w->weight_decay;
    // Every run starts from a new session: the initial weights (the file's initializers) and a fresh optimizer
    // state. Resetting only the weights would carry Adam's moments and step count, or SGD's momentum buffers,
    // from one run into the next; torch's harness likewise builds a new model and optimizer per run. Building
    // the session (planning included) stays outside the timer, as torch's build(w) does.
    std::unique_ptr<Session> s;
    // A fresh session (or set of replicas): the previous one's memory goes before the next one is planned.
    auto build = [&] {
      s.reset();
      if (a.replicas > 1) s = std::make_unique<ReplicatedSession>(model, cfg, a.replicas);
      else s = std::make_unique<TrainingSession>(model, cfg);
    };
    build();
    const std::string target = s->target_name();
    auto step = [&](const Feeds& f) { return s->train_step(f); };

    Tensor X = load_array(a.data, w->x), Y = load_array(a.data, w->y);
    const int64_t n = X.shape.at(0);
    if (Y.shape.at(0) != n) fail(a.data, w->x + " and " + w->y + " have different row counts");
    if (n < w->batch * w->steps) fail(a.data, w->x + " has fewer rows than batch x steps");
    if (ce && Y.dtype != DType::Int64) fail(a.data, w->y + " should hold int64 class indices");
    const std::string input = model.graph.inputs.at(0).name;
    // Class indices have no class axis; W3's [batch, 64] targets are fed flat, matching the flattened logits.
    const int64_t y_per_row = Y.numel() / n;
    auto target_view = [&](int64_t row, int64_t rows) {
      if (!ce) return rows_view(Y, row, rows);
      return Tensor::view(DType::Int64, {rows * y_per_row}, Y.ptr<int64_t>() + row * y_per_row);
    };

    // Batches are views into the loaded data, built before any timer starts (as the peers pre-slice theirs).
    const int64_t max_steps = std::max(w->steps, w->warmup);
    std::vector<Feeds> batches;
    batches.reserve(max_steps);
    for (int64_t i = 0; i < max_steps; ++i) {
      const int64_t row = (i * w->batch) % n;
      batches.push_back({{input, rows_view(X, row, w->batch)}, {target, target_view(row, w->batch)}});
    }

    auto run = [&](int64_t steps, std::vector<float>* losses) {
      build();
      float sink = 0;  // keeps the loop from being optimised away; no per-step readback is recorded
      const auto t0 = std::chrono::steady_clock::now();
      if (losses)
        for (int64_t i = 0; i < steps; ++i) losses->push_back(step(batches[i]));
      else
        for (int64_t i = 0; i < steps; ++i) sink += step(batches[i]);
      const auto t1 = std::chrono::steady_clock::now();
      if (sink == 12345.678f) std::fprintf(stderr, " ");
      return std::chrono::duration<double>(t1 - t0).count();
    };
    // The loss over the whole data set, in float64 from the model's float32 outputs: MSE, or the mean over
    // all samples (tokens) of logsumexp(logits) - logits[label].
    auto full_loss = [&] {
      const int64_t chunk = w->eval_chunk > 0 ? w->eval_chunk : n;
      double sum = 0;
      int64_t count = 0;
      for (int64_t r0 = 0; r0 < n; r0 += chunk) {
        const int64_t rows = std::min(chunk, n - r0);
        const Feeds in{{input, rows_view(X, r0, rows)}};
        const Tensor p = s->infer(in).at(0);
        const Tensor y = target_view(r0, rows);
        const float* pv = p.ptr<float>();
        if (!ce) {
          if (p.numel() != y.numel()) fail(model_path, "prediction " + p.describe() + " does not match " + y.describe());
          for (int64_t i = 0; i < p.numel(); ++i) {
            const double d = double(pv[i]) - double(y.ptr<float>()[i]);
            sum += d * d;
          }
          count += p.numel();
          continue;
        }
        const int64_t samples = y.numel(), classes = p.shape.back();
        if (p.shape.size() != 2 || p.shape[0] != samples)
          fail(model_path, "logits " + p.describe() + " do not match targets " + y.describe());
        for (int64_t i = 0; i < samples; ++i) {
          const float* l = pv + i * classes;
          const int64_t label = y.ptr<int64_t>()[i];
          if (label < 0 || label >= classes) fail(a.data, "label out of range: " + std::to_string(label));
          const double mx = *std::max_element(l, l + classes);
          double e = 0;
          for (int64_t c = 0; c < classes; ++c) e += std::exp(double(l[c]) - mx);
          sum += mx + std::log(e) - double(l[label]);
        }
        count += samples;
      }
      return sum / double(count);
    };

    run(w->warmup, nullptr);
    std::vector<float> losses;
    const double ref_s = run(w->steps, &losses);
    const double ref_final = full_loss();
    if (!a.losses.empty()) {
      std::FILE* f = std::fopen(a.losses.c_str(), "w");
      if (!f) fail(a.losses, "cannot write");
      for (float l : losses) std::fprintf(f, "%.9g\n", l);
      std::fclose(f);
    }
    std::vector<double> times;
    for (int r = 0; r < a.repeats; ++r) times.push_back(run(w->steps, nullptr));
    const double final_loss = full_loss();
    if (a.profile) {
      // A separate run after the timed ones, so the clock reads around every step never touch the reported speed.
      cfg.profile = true;
      run(w->steps, nullptr);
      std::fprintf(stderr, "bench_train %s, %d thread(s): where one epoch's train_step time went\n%s", w->id.c_str(),
                   a.threads, format_profile(s->profile(), a.profile_top).c_str());
    }

    std::vector<double> metric;
    const bool per_step = w->metric == "us_per_step";
    for (double t : times) {
      if (per_step) metric.push_back(t / double(w->steps) * 1e6);
      else metric.push_back(double(w->steps * w->batch * w->units_per_sample) / t);
    }
    const auto [lo, hi] = std::minmax_element(metric.begin(), metric.end());
    std::printf(
        "{\"workload\": \"%s\", \"peer\": \"onnxtrain\", \"threads\": %d, \"omp_max_threads\": %d, \"replicas\": %d, "
        "\"metric\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"runs\": %s, \"times_s\": %s, \"notes\": \"runs %.4g-%.4g%s\"}\n",
        w->id.c_str(), a.threads, omp_get_max_threads(), a.replicas, w->metric.c_str(), median(metric), w->unit.c_str(),
        json_list(metric).c_str(), json_list(times).c_str(), *lo, *hi,
        a.replicas > 1 ? ("; " + std::to_string(a.replicas) + " one-thread replicas").c_str() : "");
    std::printf(
        "{\"workload\": \"%s\", \"peer\": \"onnxtrain\", \"threads\": %d, \"metric\": \"final_train_loss\", "
        "\"value\": %.9g, \"unit\": \"loss\", \"reference_run_final\": %.9g, \"first_step_loss\": %.9g, "
        "\"last_step_loss\": %.9g, \"ref_run_s\": %.6g}\n",
        w->id.c_str(), a.threads, final_loss, ref_final, losses.front(), losses.back(), ref_s);
    // Peak resident memory of the whole process (data, every session built, warm-up and all runs), as the
    // Python peers record theirs; ru_maxrss is in KiB on Linux.
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    std::printf(
        "{\"workload\": \"%s\", \"peer\": \"onnxtrain\", \"threads\": %d, \"metric\": \"peak_rss_mb\", "
        "\"value\": %.6g, \"unit\": \"MiB\"}\n",
        w->id.c_str(), a.threads, double(ru.ru_maxrss) / 1024.0);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_train: %s\n", e.what());
    return 1;
  }
  return 0;
}
