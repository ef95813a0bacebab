// A session on a device against the same session on the CPU (docs/gpu.md): scalar state, training steps,
// weights, checkpoints across devices, the non-finite guard, the Yield boundary, Trainer with validation and
// checkpoints. Parameterised over the devices: "guarded" (the test device of executor/guarded.h, whose memory
// faults when host code touches it outside kernels and copies; it runs everywhere, so CI runs every case) and
// "cuda:0" (skipped, saying so, where no GPU is visible).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>

#include "common/mlp_model.h"
#include "common/test_env.h"
#include "executor/device.h"
#include "executor/finite.h"
#include "graph/builder.h"
#include "graph/shape_inference.h"
#include "training/trainer.h"

namespace onnxtrain {
namespace {

// x [N, 4] -> Gemm(8) -> Relu -> Gemm(3) -> logits [N, 3]: a classifier for the cross-entropy cases.
Model classifier() {
  Model m;
  m.opset_imports[""] = 17;
  Graph& g = m.graph;
  g.name = "classifier";
  GraphBuilder b(g);
  b.add_input("x", TypeInfo{DType::Float32, Shape{Dim::sym("N"), Dim::of(4)}});
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  auto init = [&](const std::string& w, std::vector<int64_t> dims, float scale) {
    std::vector<float> v(static_cast<size_t>(numel_of(dims)));
    for (float& x : v) x = nd(rng) * scale;
    g.initializers[w] = TensorData::from<float>(dims, std::span<const float>(v));
  };
  init("fc1.weight", {8, 4}, 0.5f);
  init("fc1.bias", {8}, 0.1f);
  init("fc2.weight", {3, 8}, 0.5f);
  init("fc2.bias", {3}, 0.1f);
  const std::string h = b.add("Gemm", {"x", "fc1.weight", "fc1.bias"}, {{"transB", int64_t{1}}});
  const std::string r = b.add("Relu", {h});
  b.add_node("Gemm", {r, "fc2.weight", "fc2.bias"}, 1, {{"transB", int64_t{1}}}, {}, {"logits"});
  b.add_output("logits", TypeInfo{DType::Float32, Shape{Dim::sym("N"), Dim::of(3)}});
  infer_shapes(m);
  return m;
}

struct Data {
  Tensor x, y;
};

// n rows of 4 features; y is class indices (int64) or a regression target [n, 1].
Data make_data(int64_t n, bool classes, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  Data d{Tensor::empty(DType::Float32, {n, 4}),
         classes ? Tensor::empty(DType::Int64, {n}) : Tensor::empty(DType::Float32, {n, 1})};
  for (int64_t i = 0; i < n; ++i) {
    float sum = 0;
    for (int k = 0; k < 4; ++k) sum += d.x.ptr<float>()[i * 4 + k] = nd(rng) + (classes && k == i % 3 ? 2.0f : 0.0f);
    if (classes) d.y.ptr<int64_t>()[i] = i % 3;
    else d.y.ptr<float>()[i] = std::sin(sum);
  }
  return d;
}

// Rows [begin, begin + n) of a host tensor, as a view.
Tensor rows(const Tensor& t, int64_t begin, int64_t n) {
  std::vector<int64_t> shape = t.shape;
  const size_t row = t.nbytes() / static_cast<size_t>(t.shape[0]);
  shape[0] = n;
  return Tensor::view(t.dtype, shape, static_cast<char*>(t.data) + static_cast<size_t>(begin) * row);
}

TrainingConfig adam_cosine(const std::string& loss, const std::string& device) {
  TrainingConfig c;
  c.device = device;
  c.loss.kind = loss;
  c.optimizer.kind = "adam";
  c.optimizer.learning_rate = 0.02;
  c.schedule.kind = "cosine";
  c.schedule.warmup_steps = 2;
  c.schedule.total_steps = 10;
  return c;
}

Model model_for(const std::string& loss) {
  return loss == "cross_entropy" ? classifier() : test::relu_mlp<float>("mlp", 4, 8, 3, 0.3f, test::Fc2::Gemm);
}

// Float32 kernels differ between the devices in the order of their sums (and the CPU plan fuses elementwise
// chains and the Adam update), so agreement is to float32 rounding, not to the bit.
void expect_close(const Tensor& a, const Tensor& b, const std::string& what, float tol = 2e-5f) {
  ASSERT_EQ(a.device, Device::CPU) << what;
  ASSERT_EQ(b.device, Device::CPU) << what;
  ASSERT_EQ(a.describe(), b.describe()) << what;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float x = a.ptr<float>()[i], y = b.ptr<float>()[i];
    ASSERT_NEAR(x, y, tol * (1 + std::abs(y))) << what << " at " << i;
  }
}

void expect_same_weights(const TrainingSession& a, const TrainingSession& b, float tol = 2e-5f) {
  for (const auto& [name, w] : a.weights()) expect_close(w, b.get_weight(name), "weight '" + name + "'", tol);
  EXPECT_EQ(a.step(), b.step());
  EXPECT_NEAR(a.learning_rate(), b.learning_rate(), 1e-15);
}

class DeviceSession : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam().rfind("cuda", 0) == 0 && !cuda_available())
      GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  }
  const std::string& device() const { return GetParam(); }
};

TEST_P(DeviceSession, ScalarStateRoundTrips) {
  TrainingSession s(model_for("mse"), adam_cosine("mse", device()));
  EXPECT_EQ(s.device(), parse_device(device()));
  EXPECT_EQ(s.step(), 0);
  EXPECT_DOUBLE_EQ(s.learning_rate(), 0.02);
  s.set_learning_rate(0.125);
  EXPECT_DOUBLE_EQ(s.learning_rate(), 0.125);
  Data d = make_data(8, false, 1);
  const Feeds f{{"x", d.x}, {s.target_name(), d.y}};
  EXPECT_TRUE(std::isfinite(s.train_step(f)));
  EXPECT_EQ(s.step(), 1);
  // Before each update the cosine schedule writes its rate for the step (docs/schedules.md): warming up over
  // 2 steps, base * k / 2 for k = 0, then 1.
  EXPECT_EQ(s.learning_rate(), 0.0);
  EXPECT_TRUE(std::isfinite(s.train_step(f)));
  EXPECT_EQ(s.step(), 2);
  EXPECT_NEAR(s.learning_rate(), 0.02 * 1 / 2.0, 1e-15);
  const Tensor step = s.state("optim.step");
  EXPECT_EQ(step.device, Device::CPU);
  EXPECT_EQ(step.ptr<int64_t>()[0], 2);
}

TEST_P(DeviceSession, StepsAgreeWithTheCpu) {
  for (const std::string loss : {"mse", "cross_entropy"}) {
    SCOPED_TRACE(loss);
    const bool classes = loss == "cross_entropy";
    Data d = make_data(21, classes, 2);  // batches of 8, 8 and a smaller last one of 5
    TrainingSession cpu(model_for(loss), adam_cosine(loss, "cpu"));
    TrainingSession dev(model_for(loss), adam_cosine(loss, device()));
    for (int epoch = 0; epoch < 2; ++epoch)
      for (int64_t b = 0; b < 21; b += 8) {
        const int64_t n = std::min<int64_t>(8, 21 - b);
        Feeds f{{"x", rows(d.x, b, n)}, {cpu.target_name(), rows(d.y, b, n)}};
        const float a = cpu.train_step(f), g = dev.train_step(f);
        EXPECT_NEAR(g, a, 2e-5f * (1 + std::abs(a))) << "epoch " << epoch << " batch at " << b;
      }
    expect_same_weights(dev, cpu);
    expect_close(dev.state("fc1.weight.exp_avg_sq"), cpu.state("fc1.weight.exp_avg_sq"), "exp_avg_sq", 1e-4f);
    // The other ways in read the same weights.
    expect_close(dev.infer({{"x", d.x}})[0], cpu.infer({{"x", d.x}})[0], "infer");
    TrainingSession::Gradients gd = dev.gradients({{"x", d.x}, {cpu.target_name(), d.y}});
    TrainingSession::Gradients gc = cpu.gradients({{"x", d.x}, {cpu.target_name(), d.y}});
    EXPECT_NEAR(gd.loss, gc.loss, 2e-5f * (1 + std::abs(gc.loss)));
    for (const auto& [w, g] : gc.grads) expect_close(gd.grads.at(w), g, "gradient of " + w, 1e-4f);
    const Model ed = dev.export_inference(), ec = cpu.export_inference();
    for (const auto& [w, t] : ec.graph.initializers)
      expect_close(Tensor::from_data(ed.graph.initializers.at(w)), Tensor::from_data(t), "exported " + w);
  }
}

TEST_P(DeviceSession, WeightsAndCheckpointsRoundTripAcrossDevices) {
  const auto dir = test::temp_dir("device_ckpt_" + std::to_string(std::hash<std::string>()(device())));
  Data d = make_data(16, true, 3);
  TrainingSession dev(classifier(), adam_cosine("cross_entropy", device()));
  const Feeds f{{"x", d.x}, {dev.target_name(), d.y}};
  // set_weight from the host, get_weight back: the same bytes.
  Tensor w = dev.get_weight("fc2.bias");
  w.ptr<float>()[1] = 0.75f;
  dev.set_weight("fc2.bias", w);
  EXPECT_EQ(dev.get_weight("fc2.bias").ptr<float>()[1], 0.75f);
  for (int i = 0; i < 3; ++i) dev.train_step(f);
  dev.save_checkpoint(dir / "dev.onnx");
  // Resumed on the CPU and on the device: both continue as the original session does.
  TrainingSession on_cpu = TrainingSession::from_checkpoint(dir / "dev.onnx", {}, "cpu");
  TrainingSession on_dev = TrainingSession::from_checkpoint(dir / "dev.onnx", {}, device());
  EXPECT_EQ(on_cpu.device(), Device::CPU);
  EXPECT_EQ(on_dev.device(), parse_device(device()));
  expect_same_weights(on_cpu, dev, 0);
  expect_same_weights(on_dev, dev, 0);
  for (int i = 0; i < 2; ++i) {
    const float a = dev.train_step(f), b = on_cpu.train_step(f), c = on_dev.train_step(f);
    EXPECT_NEAR(b, a, 2e-5f * (1 + std::abs(a)));
    EXPECT_EQ(c, a);  // the same device and the same state: the same bits
  }
  expect_same_weights(on_dev, dev, 0);
  // And back: a CPU checkpoint resumed on the device.
  on_cpu.save_checkpoint(dir / "cpu.onnx");
  TrainingSession back = TrainingSession::from_checkpoint(dir / "cpu.onnx", {}, device());
  expect_same_weights(back, on_cpu, 0);
  std::filesystem::remove_all(dir);
}

TEST_P(DeviceSession, NonFiniteFeedIsCaughtOnTheDevice) {
  Data d = make_data(8, false, 4);
  d.x.ptr<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  TrainingConfig c = adam_cosine("mse", device());
  {
    TrainingSession s(model_for("mse"), c);
    const Tensor before = s.get_weight("fc1.weight");
    try {
      s.train_step({{"x", d.x}, {s.target_name(), d.y}});
      ADD_FAILURE() << "a NaN feed trained";
    } catch (const NonFiniteError& e) {
      EXPECT_NE(std::string(e.what()).find("went non-finite"), std::string::npos) << e.what();
    }
    expect_close(s.get_weight("fc1.weight"), before, "fc1.weight after the refused step", 0);
    EXPECT_EQ(s.step(), 0);
  }
  c.on_non_finite = "skip";
  TrainingSession s(model_for("mse"), c);
  const Tensor before = s.get_weight("fc1.weight");
  EXPECT_TRUE(std::isnan(s.train_step({{"x", d.x}, {s.target_name(), d.y}})));
  EXPECT_EQ(s.skipped_steps(), 1);
  EXPECT_EQ(s.step(), 0);
  expect_close(s.get_weight("fc1.weight"), before, "fc1.weight after the skipped step", 0);
}

TEST_P(DeviceSession, YieldBoundaryAgreesWithTheCpu) {
  TrainingConfig cd = adam_cosine("mse", device()), cc = adam_cosine("mse", "cpu");
  cd.inputs_requiring_grad = cc.inputs_requiring_grad = {"x"};
  TrainingSession dev(model_for("mse"), cd), cpu(model_for("mse"), cc);
  Data d = make_data(6, false, 5);
  std::vector<Tensor> yd = dev.run_forward({{"x", d.x}}), yc = cpu.run_forward({{"x", d.x}});
  ASSERT_EQ(yd.size(), 1u);
  expect_close(yd[0], yc[0], "forward");
  Tensor dy = Tensor::empty(DType::Float32, {6, 1});
  for (int i = 0; i < 6; ++i) dy.ptr<float>()[i] = 0.5f - 0.25f * static_cast<float>(i);
  std::map<std::string, Tensor> gd = dev.run_backward({dy}), gc = cpu.run_backward({dy});
  ASSERT_EQ(gd.size(), gc.size());
  for (const auto& [name, g] : gc) expect_close(gd.at(name), g, "gradient of " + name, 1e-4f);
}

TEST_P(DeviceSession, TrainerValidatesAndCheckpointsOnTheDevice) {
  const auto dir = test::temp_dir("device_trainer_" + std::to_string(std::hash<std::string>()(device())));
  Data train = make_data(40, true, 6), val = make_data(15, true, 7);
  std::map<std::string, std::map<std::string, double>> metrics;
  for (const std::string& dev : {std::string("cpu"), device()}) {
    TrainingSession s(classifier(), adam_cosine("cross_entropy", dev));
    DataLoader tl({{"x", train.x}, {s.target_name(), train.y}}, 16, std::make_shared<RandomSampler>(40, true, 11));
    DataLoader vl({{"x", val.x}, {s.target_name(), val.y}}, 8);
    TrainerOptions o;
    o.epochs = 3;
    o.metrics = {"loss", "accuracy"};
    Trainer t(s, tl, o);
    t.set_validation(&vl);
    auto ckpt = std::make_shared<CheckpointEvery>(dir / dev, 2, 2);
    t.add_callback(ckpt);
    t.add_callback(std::make_shared<MetricsLog>(dir / (dev + ".csv"), std::vector<std::string>{"val_loss", "val_accuracy"}));
    TrainResult r = t.fit();
    EXPECT_EQ(r.reason, "finished");
    EXPECT_EQ(r.steps, 9);
    ASSERT_TRUE(std::filesystem::exists(ckpt->last())) << ckpt->last();
    EXPECT_TRUE(std::filesystem::exists(dir / (dev + ".csv")));
    metrics[dev == "cpu" ? "cpu" : "device"] = r.metrics;
    // The last checkpoint resumes on the CPU with the device's weights.
    TrainingSession back = TrainingSession::from_checkpoint(ckpt->last(), {}, "cpu");
    expect_same_weights(back, s, 0);
  }
  ASSERT_EQ(metrics["cpu"].size(), 2u);
  for (const auto& [k, v] : metrics["cpu"]) EXPECT_NEAR(metrics["device"].at(k), v, 1e-4) << k;
  std::filesystem::remove_all(dir);
}

// Mixed precision on the device: half-precision products, a dynamic loss scale kept in the store. float16 and
// bfloat16 products round differently from run to run only where the summation order differs (cuBLAS against
// the CPU's GEMM), so the losses agree to the half type's precision.
TEST_P(DeviceSession, MixedPrecisionAgreesWithTheCpu) {
  for (const std::string dtype : {"float16", "bfloat16"}) {
    SCOPED_TRACE(dtype);
    TrainingConfig cd = adam_cosine("cross_entropy", device()), cc = adam_cosine("cross_entropy", "cpu");
    cd.mixed_precision.dtype = cc.mixed_precision.dtype = dtype;
    TrainingSession dev(classifier(), cd), cpu(classifier(), cc);
    Data d = make_data(16, true, 8);
    const Feeds f{{"x", d.x}, {cpu.target_name(), d.y}};
    const float tol = dtype == "float16" ? 2e-3f : 1.6e-2f;
    for (int i = 0; i < 4; ++i) {
      const float a = cpu.train_step(f), g = dev.train_step(f);
      EXPECT_NEAR(g, a, tol * (1 + std::abs(a))) << "step " << i;
    }
    EXPECT_EQ(dev.loss_scale(), cpu.loss_scale());
    EXPECT_EQ(dev.overflow_steps(), cpu.overflow_steps());
    EXPECT_EQ(dev.step(), cpu.step());
    expect_same_weights(dev, cpu, 10 * tol);
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, DeviceSession, ::testing::Values("guarded", "cuda:0"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return i.param == "guarded" ? std::string("Guarded") : std::string("Cuda0");
                         });

}  // namespace
}  // namespace onnxtrain
