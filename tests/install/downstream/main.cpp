// A downstream program: builds y = x W + b in the IR, trains it on y = 2x - 1 with the installed library.
#include <cmath>
#include <cstdio>

#include "graph/ir.h"
#include "graph/model_io.h"
#include "training/trainer.h"

using namespace onnxtrain;

int main() {
  Model m;
  m.opset_imports[""] = 18;
  Graph& g = m.graph;
  g.name = "linear";
  g.inputs.push_back({"x", {DType::Float32, Shape{Dim::sym("n"), Dim::of(1)}}});
  g.outputs.push_back({"y", {DType::Float32, Shape{Dim::sym("n"), Dim::of(1)}}});
  const float w0 = 0.1f, b0 = 0.0f;
  g.initializers["W"] = TensorData::from<float>({1, 1}, std::span<const float>(&w0, 1));
  g.initializers["b"] = TensorData::from<float>({1}, std::span<const float>(&b0, 1));
  g.nodes.push_back({"mm", "MatMul", "", {"x", "W"}, {"xw"}, {}});
  g.nodes.push_back({"add", "Add", "", {"xw", "b"}, {"y"}, {}});

  TrainingConfig cfg;
  cfg.optimizer.learning_rate = 0.1;
  // Through the protobuf edge: validation and shape inference, as for a model loaded from a file.
  TrainingSession s(load_model_from_bytes(serialize_model(m), "downstream model"), cfg);
  std::vector<float> x(64), y(64);
  for (int i = 0; i < 64; ++i) x[i] = i / 32.0f - 1, y[i] = 2 * x[i] - 1;
  DataLoader data({{"x", Tensor::from_vector<float>({64, 1}, x)}, {s.target_name(), Tensor::from_vector<float>({64, 1}, y)}}, 16);
  TrainerOptions opts;
  opts.epochs = 50;
  Trainer t(s, data, opts);
  float first = -1, last = 0;
  t.on_step([&](const StepInfo& st) {
    if (first < 0) first = st.loss;
    last = st.loss;
  });
  t.fit();
  const float w = s.get_weight("W").ptr<float>()[0], b = s.get_weight("b").ptr<float>()[0];
  std::printf("loss %g -> %g, W %g, b %g\n", first, last, w, b);
  if (!(last < first * 1e-3f) || std::abs(w - 2) > 1e-2 || std::abs(b + 1) > 1e-2) return 1;
  std::printf("downstream ok\n");
  return 0;
}
