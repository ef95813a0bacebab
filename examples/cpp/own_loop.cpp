// A training loop written by hand against TrainingSession: fine-tunes the head of the digits classifier.
//
//   own_loop MODEL.onnx TRAIN.npz VAL.npz OUT.onnx      (files from examples/digits/make_digits.py)
//
// The .npz files hold "pixels" (float32 [N, 64]) and "label" (int64 [N]).
#include <algorithm>
#include <cstdio>

#include "graph/error.h"
#include "training/data.h"
#include "training/session.h"

using namespace onnxtrain;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: own_loop MODEL.onnx TRAIN.npz VAL.npz OUT.onnx\n");
    return 2;
  }
  try {
    TrainingConfig cfg;
    cfg.trainable = {"head.weight", "head.bias"};  // the body stays frozen
    cfg.loss.kind = "cross_entropy";
    cfg.optimizer.kind = "adam";
    cfg.optimizer.learning_rate = 0.01;
    TrainingSession s = TrainingSession::from_file(argv[1], cfg);

    Dataset train = read_npz(argv[2]), val = read_npz(argv[3]);
    const Tensor& x = train.at("pixels");
    const Tensor& y = train.at("label");
    const int64_t n = x.shape[0], batch = 32;
    for (int epoch = 1; epoch <= 5; ++epoch) {
      double sum = 0;
      int64_t steps = 0;
      for (int64_t start = 0; start < n; start += batch, ++steps) {
        const int64_t rows = std::min(batch, n - start);
        // Views into the arrays: no copy per batch.
        Feeds f{{"pixels", Tensor::view(DType::Float32, {rows, 64}, const_cast<float*>(x.ptr<float>()) + start * 64)},
                {s.target_name(), Tensor::view(DType::Int64, {rows}, const_cast<int64_t*>(y.ptr<int64_t>()) + start)}};
        sum += s.train_step(f);
      }
      // Validation accuracy: argmax of the logits against the labels.
      Tensor logits = s.infer({{"pixels", val.at("pixels")}}).at(0);
      const int64_t vn = logits.shape[0];
      int64_t correct = 0;
      for (int64_t i = 0; i < vn; ++i) {
        const float* row = logits.ptr<float>() + i * 10;
        correct += std::max_element(row, row + 10) - row == val.at("label").ptr<int64_t>()[i];
      }
      std::printf("epoch %d  train loss %.4f  val accuracy %.4f\n", epoch, sum / steps, double(correct) / vn);
    }
    s.export_inference(argv[4]);
    std::printf("wrote %s\n", argv[4]);
  } catch (const Error& e) {
    std::fprintf(stderr, "own_loop: %s\n", e.what());
    return 1;
  }
  return 0;
}
