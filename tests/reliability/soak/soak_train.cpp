// Soak driver for scripts/soak.sh: trains the shared benchmark's W1 (Adam lr 1e-3, batch 128, synthetic data)
// through the C++ API for a wall-clock budget, saves a checkpoint at a fixed interval, samples the resident set,
// and at the end loads every checkpoint back and takes one step from it. Prints one line per sample and a summary;
// exits 1 when memory grew or a checkpoint did not load.
//
//   soak_train --model w1.onnx --seconds 1800 --every 60 --out DIR [--max-growth-kb 4096]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "graph/error.h"
#include "reliability/soak/w1.h"
#include "training/session.h"

using namespace onnxtrain;
namespace fs = std::filesystem;

namespace {

int run(int argc, char** argv) {
  std::string model, out;
  double seconds = 1800, every = 60;
  long max_growth_kb = 4096;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") model = v;
    else if (k == "--out") out = v;
    else if (k == "--seconds") seconds = std::stod(v);
    else if (k == "--every") every = std::stod(v);
    else if (k == "--max-growth-kb") max_growth_kb = std::stol(v);
    else fail("soak_train", "unknown option " + k);
  }
  if (model.empty() || out.empty() || !(seconds > 0) || !(every > 0))
    fail("soak_train", "usage: soak_train --model PATH --seconds N --every S --out DIR [--max-growth-kb K]");
  fs::create_directories(out);

  TrainingSession s = TrainingSession::from_file(model, soak::w1_config());
  const std::vector<Feeds> batches = soak::w1_batches(s, 16);  // one synthetic "epoch", cycled

  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(clock::now() - start).count(); };
  std::vector<std::pair<fs::path, int64_t>> checkpoints;
  std::vector<long> rss;
  double next = every;
  float loss = 0;
  std::printf("seconds,steps,loss,rss_kb,checkpoint\n");
  for (size_t i = 0;; ++i) {
    loss = s.train_step(batches[i % batches.size()]);
    if (!std::isfinite(loss)) fail("soak_train", "loss went non-finite at step " + std::to_string(s.step()));
    const double t = elapsed();
    if (t < next && t < seconds) continue;
    const fs::path ckpt = fs::path(out) / ("ckpt_" + std::to_string(checkpoints.size()) + ".onnx");
    s.save_checkpoint(ckpt);
    checkpoints.emplace_back(ckpt, s.step());
    rss.push_back(soak::rss_kb());
    std::printf("%.1f,%lld,%.5f,%ld,%s\n", t, static_cast<long long>(s.step()), loss, rss.back(), ckpt.filename().c_str());
    std::fflush(stdout);
    next += every;
    if (t >= seconds) break;
  }

  int bad = 0;
  for (const auto& [path, step] : checkpoints) {
    try {
      TrainingSession back = TrainingSession::from_checkpoint(path);
      if (back.step() != step) throw Error(path.string() + ": step " + std::to_string(back.step()) + ", saved at " + std::to_string(step));
      if (!std::isfinite(back.train_step(batches[0]))) throw Error(path.string() + ": non-finite loss after reload");
    } catch (const Error& e) {
      std::fprintf(stderr, "checkpoint failed: %s\n", e.what());
      ++bad;
    }
  }
  // The first sample includes plan compilation and allocator warm-up; growth is measured from the second.
  const long base = rss.size() > 1 ? rss[1] : rss.front();
  long peak = base;
  for (size_t i = 1; i < rss.size(); ++i) peak = std::max(peak, rss[i]);
  std::printf("summary: %.0f s, %lld steps, %zu checkpoints (%d failed to load), RSS %ld kB at the second sample, "
              "%ld kB at the end, peak %ld kB\n",
              elapsed(), static_cast<long long>(s.step()), checkpoints.size(), bad, base, rss.back(), peak);
  if (bad) return 1;
  if (peak - base > max_growth_kb) {
    std::fprintf(stderr, "memory grew by %ld kB (limit %ld kB)\n", peak - base, max_growth_kb);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "soak_train: %s\n", e.what());
    return 2;
  }
}
