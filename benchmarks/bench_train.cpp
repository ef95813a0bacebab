// Trains one shared benchmark workload (../shared/bench) with TrainingSession and prints its metrics as JSON
// lines, following the PyTorch peers' protocol (peers/torch_harness.py) so the two can be compared as ratios:
//   warm-up from the initial weights -> untimed reference run recording the per-step losses -> 3 timed runs,
//   each from the initial weights, timing only the training loop -> median; final loss over the whole data
//   set after the last timed run.
//
//   bench_train --workload w4|w1sgd --models DIR --data DIR [--threads N] [--repeats 3] [--losses PATH]
//
// w4    = W4 "overhead": MLP 16->32->1, batch 1 x 5000 steps, MSE, SGD lr 0.01; metric us_per_step.
// w1sgd = the W1 model and data (MLP 64->256->256->1, batch 128 x 512 steps) with plain SGD lr 0.01 instead
//         of W1's Adam, which onnxtrain does not have yet; metric train_samples_per_s.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "graph/error.h"
#include "graph/model_io.h"
#include "training/session.h"

using namespace onnxtrain;

namespace {

struct Workload {
  std::string id, model, x, y;  // model file stem and the data arrays (see bench_data.py DATASETS)
  int64_t batch, steps, warmup;
  double lr;
};

// The values of SPEC in peers/bench_data.py; w1sgd swaps W1's Adam for SGD with W4's learning rate.
const Workload kWorkloads[] = {
    {"w4", "w4", "w4_X", "w4_y", 1, 5000, 500, 0.01},
    {"w1sgd", "w1", "w1_X", "w1_y", 128, 512, 512, 0.01},
};

struct Args {
  std::string workload, models, data, losses;
  int threads = 1, repeats = 3;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_train: %s\nusage: bench_train --workload w4|w1sgd --models DIR --data DIR [--threads N] "
               "[--repeats R] [--losses PATH]\n",
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
      else usage("unknown option " + k);
    } catch (const std::logic_error&) {
      usage("bad number for " + k);
    }
  }
  if (a.workload.empty() || a.models.empty() || a.data.empty()) usage("--workload, --models and --data are required");
  if (a.threads < 1 || a.repeats < 1) usage("--threads and --repeats must be positive");
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

// Raw little-endian C-order float32 (the only dtype w1/w4 use; this runs on little-endian x86 only).
Tensor load_array(const std::string& dir, const std::string& name) {
  const std::string mpath = dir + "/manifest.json";
  const ArrayInfo info = array_info(read_text(mpath), name, mpath);
  if (info.dtype != "float32") fail(mpath + " entry '" + name + "'", "dtype " + info.dtype + ", expected float32");
  Tensor t = Tensor::empty(DType::Float32, info.shape);
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

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const Workload* w = nullptr;
  for (const Workload& c : kWorkloads)
    if (c.id == a.workload) w = &c;
  if (!w) usage("unknown workload '" + a.workload + "' (w4 or w1sgd)");
  // OMP_NUM_THREADS is set by run.sh as well; this makes a bare invocation honour --threads too.
  omp_set_num_threads(a.threads);

  try {
    const std::string model_path = a.models + "/" + w->model + ".onnx";
    const Model model = load_model(model_path);
    TrainingConfig cfg;
    cfg.loss.kind = "mse";
    cfg.loss.reduction = "mean";
    cfg.optimizer.kind = "sgd";
    cfg.optimizer.learning_rate = w->lr;
    TrainingSession s(model, cfg);

    Tensor X = load_array(a.data, w->x), Y = load_array(a.data, w->y);
    const int64_t n = X.shape.at(0), features = X.shape.at(1), outs = Y.shape.at(1);
    if (Y.shape.at(0) != n) fail(a.data, w->x + " and " + w->y + " have different row counts");
    if (n < w->batch * w->steps) fail(a.data, w->x + " has fewer rows than batch x steps");
    const std::string input = model.graph.inputs.at(0).name;

    // Every trainable weight must be an initializer of the file: those are the shared initial weights.
    std::vector<std::pair<std::string, Tensor>> initial;
    for (const std::string& name : s.trainable()) {
      auto it = model.graph.initializers.find(name);
      if (it == model.graph.initializers.end()) fail(model_path, "trainable '" + name + "' is not an initializer");
      initial.emplace_back(name, Tensor::from_data(it->second));
    }
    auto reset = [&] {
      for (const auto& [name, t] : initial) s.set_weight(name, t);
    };

    // Batches are views into the loaded data, built before any timer starts (as the peers pre-slice theirs).
    const int64_t max_steps = std::max(w->steps, w->warmup);
    std::vector<Feeds> batches;
    batches.reserve(max_steps);
    for (int64_t i = 0; i < max_steps; ++i) {
      const int64_t row = (i * w->batch) % n;
      batches.push_back({{input, Tensor::view(DType::Float32, {w->batch, features}, X.ptr<float>() + row * features)},
                         {s.target_name(), Tensor::view(DType::Float32, {w->batch, outs}, Y.ptr<float>() + row * outs)}});
    }

    auto run = [&](int64_t steps, std::vector<float>* losses) {
      reset();
      float sink = 0;  // keeps the loop from being optimised away; no per-step readback is recorded
      const auto t0 = std::chrono::steady_clock::now();
      if (losses)
        for (int64_t i = 0; i < steps; ++i) losses->push_back(s.train_step(batches[i]));
      else
        for (int64_t i = 0; i < steps; ++i) sink += s.train_step(batches[i]);
      const auto t1 = std::chrono::steady_clock::now();
      if (sink == 12345.678f) std::fprintf(stderr, " ");
      return std::chrono::duration<double>(t1 - t0).count();
    };
    auto full_loss = [&] {
      const Tensor p = s.infer({{input, X}}).at(0);
      if (p.numel() != Y.numel()) fail(model_path, "prediction " + p.describe() + " does not match " + Y.describe());
      double sum = 0;
      for (int64_t i = 0; i < p.numel(); ++i) {
        const double d = double(p.ptr<float>()[i]) - double(Y.ptr<float>()[i]);
        sum += d * d;
      }
      return sum / double(p.numel());
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

    std::vector<double> metric;
    std::string name, unit;
    for (double t : times) {
      if (w->id == "w4") metric.push_back(t / double(w->steps) * 1e6);
      else metric.push_back(double(w->steps * w->batch) / t);
    }
    if (w->id == "w4") name = "us_per_step", unit = "us/step";
    else name = "train_samples_per_s", unit = "samples/s";
    const auto [lo, hi] = std::minmax_element(metric.begin(), metric.end());
    std::printf(
        "{\"workload\": \"%s\", \"peer\": \"onnxtrain\", \"threads\": %d, \"omp_max_threads\": %d, \"metric\": \"%s\", "
        "\"value\": %.6g, \"unit\": \"%s\", \"runs\": %s, \"times_s\": %s, \"notes\": \"runs %.4g-%.4g\"}\n",
        w->id.c_str(), a.threads, omp_get_max_threads(), name.c_str(), median(metric), unit.c_str(),
        json_list(metric).c_str(), json_list(times).c_str(), *lo, *hi);
    std::printf(
        "{\"workload\": \"%s\", \"peer\": \"onnxtrain\", \"threads\": %d, \"metric\": \"final_train_loss\", "
        "\"value\": %.9g, \"unit\": \"loss\", \"reference_run_final\": %.9g, \"first_step_loss\": %.9g, "
        "\"last_step_loss\": %.9g, \"ref_run_s\": %.6g}\n",
        w->id.c_str(), a.threads, final_loss, ref_final, losses.front(), losses.back(), ref_s);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_train: %s\n", e.what());
    return 1;
  }
  return 0;
}
