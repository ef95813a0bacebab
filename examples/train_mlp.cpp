// Trains an MLP regressor from an ONNX file with the C++ API and prints the loss per epoch.
//
//   train_mlp MODEL.onnx [--epochs 10] [--batch 64] [--lr 0.05] [--samples 4096] [--out trained.onnx]
//             [--optimizer sgd|adam|adamw|adagrad] [--momentum 0.9] [--schedule constant|cosine|...]
//             [--loss square|absolute|huber|...]
//             [--dump DIR]   (writes x.npy, y.npy and the trained model's predictions pred.npy)
//             [--checkpoint PATH]   (writes a trainable checkpoint at the end; docs/checkpoint.md)
//
// The data is a learnable synthetic regression made here: y = tanh(x . a) + 0.5 * sin(x . b) for fixed random
// directions a, b. The model must take x[batch, F] and return y[batch, 1].
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "graph/error.h"
#include "graph/model_io.h"
#include "training/npy.h"
#include "training/session.h"
#include "synthetic.h"

using namespace onnxtrain;

namespace {

struct Args {
  std::string model, out, dump, checkpoint, optimizer = "sgd", schedule = "constant", loss = "square";
  double momentum = 0;
  int epochs = 10, batch = 64, samples = 4096;
  float lr = 0.05f;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "train_mlp: %s\nusage: train_mlp MODEL.onnx [--epochs N] [--batch B] [--lr F] [--samples N] [--out PATH] [--dump DIR]\n                 [--checkpoint PATH] [--optimizer NAME] [--momentum M] [--schedule NAME] [--loss NAME]\n", why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + k).c_str());
      return argv[++i];
    };
    try {
      if (k == "--epochs") a.epochs = std::stoi(next());
      else if (k == "--batch") a.batch = std::stoi(next());
      else if (k == "--lr") a.lr = std::stof(next());
      else if (k == "--samples") a.samples = std::stoi(next());
      else if (k == "--out") a.out = next();
      else if (k == "--dump") a.dump = next();
      else if (k == "--checkpoint") a.checkpoint = next();
      else if (k == "--optimizer") a.optimizer = next();
      else if (k == "--momentum") a.momentum = std::stod(next());
      else if (k == "--schedule") a.schedule = next();
      else if (k == "--loss") a.loss = next();
      else if (k == "-h" || k == "--help") usage("help");
      else if (!k.empty() && k[0] == '-') usage(("unknown option " + k).c_str());
      else a.model = k;
    } catch (const std::logic_error&) {
      usage(("bad number for " + k).c_str());
    }
  }
  if (a.model.empty()) usage("no model given");
  if (a.epochs < 1 || a.batch < 1 || a.samples < a.batch || !(a.lr > 0)) usage("epochs, batch, samples and lr must be positive, samples >= batch");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  try {
    TrainingConfig cfg;
    cfg.optimizer.kind = a.optimizer;
    cfg.optimizer.learning_rate = a.lr;
    cfg.optimizer.momentum = a.momentum;
    cfg.loss.kind = a.loss;
    cfg.schedule.kind = a.schedule;
    const int steps = a.samples / a.batch;
    cfg.schedule.total_steps = int64_t(steps) * a.epochs;  // cosine and linear decay over the whole run
    cfg.schedule.warmup_steps = a.schedule == "cosine" || a.schedule == "linear" ? steps : 0;
    TrainingSession s = TrainingSession::from_file(a.model, cfg);
    const Model m = s.export_inference();
    const auto& in_shape = m.graph.inputs.at(0).type.shape;
    if (!in_shape || in_shape->size() != 2 || !(*in_shape)[1].known())
      fail(a.model, "expected an input of shape [batch, features]");
    const int64_t features = (*in_shape)[1].value;
    const std::string input = m.graph.inputs.at(0).name;

    auto [x, y] = examples::make_regression(a.samples, features);

    std::printf("training %s: %zu trainable tensors, %d samples, batch %d, %s lr %g, %s schedule, %s loss\n",
                a.model.c_str(), s.trainable().size(), a.samples, a.batch, a.optimizer.c_str(), a.lr,
                a.schedule.c_str(), a.loss.c_str());
    for (int e = 1; e <= a.epochs; ++e) {
      double sum = 0;
      for (int k = 0; k < steps; ++k) {
        Feeds f;
        f[input] = Tensor::view(DType::Float32, {a.batch, features}, x.ptr<float>() + int64_t(k) * a.batch * features);
        f[s.target_name()] = Tensor::view(DType::Float32, {a.batch, 1}, y.ptr<float>() + int64_t(k) * a.batch);
        sum += s.train_step(f);
      }
      std::printf("epoch %2d  loss %.6f\n", e, sum / steps);
      s.end_epoch(sum / steps);  // the adaptive schedule reacts to the epoch's loss
    }
    if (!a.dump.empty()) {
      std::filesystem::create_directories(a.dump);
      write_npy(std::filesystem::path(a.dump) / "x.npy", x);
      write_npy(std::filesystem::path(a.dump) / "y.npy", y);
      write_npy(std::filesystem::path(a.dump) / "pred.npy", s.infer({{input, x}}).at(0));
    }
    if (!a.out.empty()) {
      save_model(s.export_inference(), a.out);
      std::printf("wrote %s\n", a.out.c_str());
    }
    if (!a.checkpoint.empty()) {
      s.save_checkpoint(a.checkpoint);
      std::printf("wrote checkpoint %s\n", a.checkpoint.c_str());
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
    return 1;
  }
  return 0;
}
