// LSTM / GRU / RNN kernels on cases small enough to work out by hand (the ONNX node tests, the gradient-check
// table and tests/python/test_recurrent_torch.py cover the general maths), and their errors.
#include <gtest/gtest.h>

#include "executor/kernel.h"
#include "graph/error.h"
#include "kernel_test_util.h"

namespace onnxtrain::test {
namespace {

using Strings = std::vector<std::string>;

// A one-unit RNN with the identity activation (Affine, alpha 1, beta 0): h_t = x_t + 0.5 h_{t-1}.
Node identity_rnn(const std::string& direction) {
  return make_node("RNN", 6,
                   {{"hidden_size", int64_t{1}},
                    {"direction", direction},
                    {"activations", Strings{"Affine"}},
                    {"activation_alpha", std::vector<float>{1.0f}},
                    {"activation_beta", std::vector<float>{0.0f}}},
                   "", 2);
}

TEST(Recurrent, ReverseWithSequenceLensStartsAtEachEntrysLastStep) {
  // X [S=3, B=2, 1]: entry 0 is 1, 2, 3 (length 2: the 3 is padding), entry 1 is 10, 20, 30 (length 3).
  const Tensor x = Tensor::from_vector<double>({3, 2, 1}, {1, 10, 2, 20, 3, 30});
  const Tensor w = Tensor::from_vector<double>({1, 1, 1}, {1});
  const Tensor r = Tensor::from_vector<double>({1, 1, 1}, {0.5});
  const Tensor lens = Tensor::from_vector<int32_t>({2}, {2, 3});
  const Tensor h0 = Tensor::from_vector<double>({1, 2, 1}, {4, 8});
  std::vector<Tensor> out = run_node(identity_rnn("reverse"), 14, {x, w, r, Tensor{}, lens, h0});
  // Entry 0 runs t = 1 then t = 0: h = 2 + 0.5*4 = 4, then 1 + 0.5*4 = 3; Y at t = 2 is zero.
  // Entry 1 runs t = 2, 1, 0: 30 + 4 = 34, 20 + 17 = 37, 10 + 18.5 = 28.5.
  const std::vector<double> y(out[0].span<double>().begin(), out[0].span<double>().end());
  EXPECT_EQ(y, (std::vector<double>{3, 28.5, 4, 37, 0, 34}));  // [S, D=1, B, 1]
  const std::vector<double> yh(out[1].span<double>().begin(), out[1].span<double>().end());
  EXPECT_EQ(yh, (std::vector<double>{3, 28.5}));
}

TEST(Recurrent, ForwardLayout1) {
  // layout 1: X [B=1, S=3, 1], Y [B, S, D, H], Y_h [B, D, H].
  const Tensor x = Tensor::from_vector<float>({1, 3, 1}, {1, 2, 3});
  const Tensor w = Tensor::from_vector<float>({1, 1, 1}, {1});
  const Tensor r = Tensor::from_vector<float>({1, 1, 1}, {0.5});
  Node n = identity_rnn("forward");
  n.attributes["layout"] = int64_t{1};
  n.inputs.resize(3);
  std::vector<Tensor> out = run_node(n, 14, {x, w, r});
  EXPECT_EQ(out[0].shape, (std::vector<int64_t>{1, 3, 1, 1}));
  const std::vector<float> y(out[0].span<float>().begin(), out[0].span<float>().end());
  EXPECT_EQ(y, (std::vector<float>{1, 2.5f, 4.25f}));
  EXPECT_EQ(out[1].shape, (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(out[1].span<float>()[0], 4.25f);
}

TEST(Recurrent, GradientOfIdentityRnnThroughSequenceLens) {
  // With h_t = x_t + 0.5 h_{t-1} and only dY_h = 1: entry 0 (length 2, forward) has Y_h = x1 + 0.5 x0 + 0.25 h0,
  // so dX = [0.5, 1, 0] over time (the padded step gets nothing), d h0 = 0.25, dW = 0.5 x0 + x1 (W scales x).
  const Tensor x = Tensor::from_vector<double>({3, 1, 1}, {1, 2, 3});
  const Tensor w = Tensor::from_vector<double>({1, 1, 1}, {1});
  const Tensor r = Tensor::from_vector<double>({1, 1, 1}, {0.5});
  const Tensor lens = Tensor::from_vector<int64_t>({1}, {2});
  const Tensor h0 = Tensor::from_vector<double>({1, 1, 1}, {4});
  const Tensor dyh = Tensor::from_vector<double>({1, 1, 1}, {1});
  Node g = identity_rnn("forward");
  g.op_type = "RNNGrad";
  g.domain = "onnxtrain";
  g.inputs = {"x0", "x1", "x2", "", "x4", "x5", "", "x7"};
  g.outputs = {"y0", "y1", "y2", "", "", "y5"};
  std::vector<Tensor> out = run_node(g, 1, {x, w, r, Tensor{}, lens, h0, Tensor{}, dyh});
  const std::vector<double> dx(out[0].span<double>().begin(), out[0].span<double>().end());
  EXPECT_EQ(dx, (std::vector<double>{0.5, 1, 0}));
  EXPECT_DOUBLE_EQ(out[1].span<double>()[0], 0.5 * 1 + 2);
  // dR = sum over steps of dpre_t * h_{t-1}: step 1 (dpre 1, h0' = 1 + 2 = 3) + step 0 (dpre 0.5, h = 4) = 5.
  EXPECT_DOUBLE_EQ(out[2].span<double>()[0], 3 + 0.5 * 4);
  EXPECT_DOUBLE_EQ(out[5].span<double>()[0], 0.25);
}

TEST(Recurrent, ErrorsNameTheNodeAndTheProblem) {
  const Tensor x = Tensor::from_vector<float>({1, 1, 1}, {1});
  const Tensor w = Tensor::from_vector<float>({1, 1, 1}, {1});
  Node n = make_node("RNN", 3, {{"hidden_size", int64_t{1}}, {"activations", Strings{"Swish"}}}, "", 2);
  try {
    run_node(n, 14, {x, w, w});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_RNN"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("activation 'Swish' is not supported"), std::string::npos) << e.what();
  }
  Node bad = make_node("LSTM", 3, {{"hidden_size", int64_t{1}}}, "", 1);
  EXPECT_THROW(run_node(bad, 14, {x, w, w}), Error);  // W has 1 row, LSTM needs 4 * hidden_size
}

}  // namespace
}  // namespace onnxtrain::test
