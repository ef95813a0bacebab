// Whole-model gradient parity with torch autograd (issue 3, "Verification"). tests/python/torch_parity_models.py
// builds four PyTorch models (MLP; CNN with BatchNorm, a residual block and pooling; a transformer encoder with
// embeddings, masked attention, LayerNorm and GELU; a 1D-conv sequence model), exports them in training mode and
// records torch's gradients. Here onnxtrain computes the same gradients two ways, each within 1e-4 relative
// (largest difference over the reference's largest magnitude, per tensor) in float32:
//   - run_forward / run_backward with torch's dL/d output for a cross-entropy loss (inputs' gradients too);
//   - gradients() with our own MSE loss against torch's mse_loss.
// For the CNN and the transformer, the exported gradient graph must also pass onnx's full checker and give our
// executor's gradients in onnxruntime (the script's --ort mode).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "graph/model_io.h"
#include "training/npy.h"
#include "training/session.h"
#include "training/yield_test_util.h"

namespace onnxtrain {
namespace {

using namespace test;

constexpr double kTolerance = 1e-4;

std::string script() { return (source_dir() / "tests/python/torch_parity_models.py").string(); }

void run_python(const std::string& args) {
  std::string cmd = test::python() + " " + script() + " " + args + " 2>&1";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
}

struct Parity {
  std::filesystem::path dir;
  Model model;
  std::map<std::string, Tensor> fx;  // the fixtures, by name (see the script's docstring)
  TrainingConfig config;             // torch's parameters train; floating-point inputs require grad

  const Tensor& at(const std::string& name) const {
    auto it = fx.find(name);
    if (it == fx.end()) throw std::runtime_error("fixture '" + name + "' missing");
    return it->second;
  }
  Feeds inputs() const {
    Feeds f;
    for (const ValueInfo& in : model.graph.inputs)
      if (!model.graph.is_initializer(in.name)) f[in.name] = at("input/" + in.name);
    return f;
  }
};

Parity generate(const std::string& name) {
  Parity p;
  p.dir = temp_dir("torch_parity_" + name);
  run_python(name + " " + p.dir.string() + " > /dev/null");
  p.model = load_model(p.dir / (name + ".onnx"));
  for (const auto& [k, data] : load_model(p.dir / (name + ".fixtures.onnx")).graph.initializers)
    p.fx[k] = Tensor::from_data(data);
  for (const auto& [k, t] : p.fx) {
    if (!k.starts_with("grad/")) continue;
    const std::string v = k.substr(5);
    (p.model.graph.is_initializer(v) ? p.config.trainable : p.config.inputs_requiring_grad).push_back(v);
  }
  return p;
}

// Also keeps the largest error seen, for the summary line each test prints.
void expect_close(const Tensor& ours, const Tensor& ref, const std::string& what, double& worst) {
  ASSERT_EQ(ours.shape, ref.shape) << what;
  ASSERT_EQ(ours.dtype, DType::Float32) << what;
  const double e = rel_diff<float>(ours, ref);
  EXPECT_LT(e, kTolerance) << what << ": relative error " << e;
  worst = std::max(worst, e);
}

// run_forward, then run_backward with torch's gradient of the cross-entropy loss.
void check_run_backward(const std::string& name, const Parity& p) {
  TrainingSession s(p.model, p.config);
  std::vector<Tensor> y = s.run_forward(p.inputs());
  std::vector<std::optional<Tensor>> dy(y.size());
  double worst_output = 0, worst = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    expect_close(y[i], p.at("output/" + std::to_string(i)), "output " + std::to_string(i), worst_output);
    // Outputs the loss does not read get no gradient from torch: the missing gradient is zeros.
    if (auto it = p.fx.find("output_grad/" + std::to_string(i)); it != p.fx.end()) dy[i] = it->second;
  }
  auto grads = s.run_backward(dy);
  ASSERT_EQ(grads.size(), p.config.trainable.size() + p.config.inputs_requiring_grad.size());
  for (const auto& [name, g] : grads) expect_close(g, p.at("grad/" + name), "gradient of '" + name + "'", worst);
  std::printf("%s: %zu outputs, largest relative error %.2g; %zu gradients, largest relative error %.2g\n",
              name.c_str(), y.size(), worst_output, grads.size(), worst);
}

// gradients() with our MSE loss; for the CNN and the transformer, the exported gradient graph in onnxruntime.
void check_mse(const std::string& name, const Parity& p) {
  TrainingConfig config = p.config;
  config.inputs_requiring_grad.clear();
  TrainingSession s(p.model, config);
  Feeds feeds = p.inputs();
  feeds[s.target_name()] = p.at("mse_target");
  auto r = s.gradients(feeds);
  ASSERT_EQ(r.grads.size(), config.trainable.size());
  double worst = 0;
  for (const auto& [name, g] : r.grads) expect_close(g, p.at("mse_grad/" + name), "MSE gradient of '" + name + "'", worst);
  std::printf("%s: %zu MSE gradients, largest relative error %.2g\n", name.c_str(), r.grads.size(), worst);
  if (name != "cnn" && name != "transformer") return;

  // The portable gradient graph: full checker, then onnxruntime against the gradients we just computed.
  save_model(s.export_gradient_model(), p.dir / "gradients.onnx");
  std::filesystem::create_directories(p.dir / "ours");
  for (const auto& [name, g] : r.grads) write_npy(p.dir / "ours" / (name + ".npy"), g);
  run_python("--ort " + (p.dir / "gradients.onnx").string() + " " + (p.dir / (name + ".fixtures.onnx")).string() +
             " " + (p.dir / "ours").string());
}

// One test per model: exporting from torch is most of the time, so both checks share one export.
class TorchParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchParity, GradientsMatchAutograd) {
  const Parity p = generate(GetParam());
  {
    SCOPED_TRACE("run_forward/run_backward");
    check_run_backward(GetParam(), p);
  }
  SCOPED_TRACE("gradients() with MSE");
  check_mse(GetParam(), p);
}

INSTANTIATE_TEST_SUITE_P(Models, TorchParity, ::testing::Values("mlp", "cnn", "transformer", "conv1d", "gelu_mlp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace onnxtrain
