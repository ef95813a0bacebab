// The same fine-tuning with Trainer: shuffled batches, validation metrics, early stopping, checkpoints every
// 50 steps (newest 2 kept) and a CSV metrics log come from the library.
//
//   with_trainer MODEL.onnx TRAIN.npz VAL.npz OUT_DIR [REPLICAS]   (files from examples/digits/make_digits.py)
//
// REPLICAS > 1 trains N one-thread copies of the session, each on its part of every batch (docs/replicas.md).
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "graph/error.h"
#include "graph/model_io.h"
#include "training/replicas.h"
#include "training/trainer.h"

using namespace onnxtrain;

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: with_trainer MODEL.onnx TRAIN.npz VAL.npz OUT_DIR [REPLICAS]\n");
    return 2;
  }
  const int replicas = argc == 6 ? std::atoi(argv[5]) : 1;
  try {
    TrainingConfig cfg;
    cfg.trainable = {"head.weight", "head.bias"};
    cfg.loss.kind = "cross_entropy";
    cfg.optimizer.kind = "adam";
    cfg.optimizer.learning_rate = 0.01;
    // Either kind is a Session; everything below takes one.
    std::unique_ptr<Session> session;
    if (replicas > 1) session = std::make_unique<ReplicatedSession>(load_model(argv[1]), cfg, replicas);
    else session = std::make_unique<TrainingSession>(TrainingSession::from_file(argv[1], cfg));
    Session& s = *session;

    // Feeds by name: the model input and the loss target.
    Dataset train = read_npz(argv[2]), val = read_npz(argv[3]);
    const int64_t rows = train.at("pixels").shape[0];
    DataLoader train_data({{"pixels", train.at("pixels")}, {s.target_name(), train.at("label")}}, 32,
                          std::make_shared<RandomSampler>(rows, /*shuffle=*/true, /*seed=*/0));
    DataLoader val_data({{"pixels", val.at("pixels")}, {s.target_name(), val.at("label")}}, 256);

    TrainerOptions opts;
    opts.epochs = 10;
    opts.metrics = {"loss", "accuracy"};
    Trainer t(s, train_data, opts);
    t.set_validation(&val_data);
    const std::filesystem::path out = argv[4];
    t.add_callback(std::make_shared<CheckpointEvery>(out / "checkpoints", 50, 2));
    t.add_callback(std::make_shared<EarlyStopping>("val_accuracy", 3));
    t.add_callback(std::make_shared<MetricsLog>(out / "metrics.csv", std::vector<std::string>{"val_loss", "val_accuracy"}));
    t.on_epoch_end([](const EpochInfo& e) {
      std::printf("epoch %lld  train loss %.4f  val accuracy %.4f\n", static_cast<long long>(e.epoch + 1), e.train_loss,
                  e.metrics.at("val_accuracy"));
    });
    TrainResult r = t.fit();
    s.export_inference(out / "model.onnx");
    std::printf("%s after %lld steps; val accuracy %.4f; checkpoint %s\n", r.reason.c_str(), static_cast<long long>(r.steps),
                r.metrics.at("val_accuracy"), r.checkpoint.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "with_trainer: %s\n", e.what());
    return 1;
  }
  return 0;
}
