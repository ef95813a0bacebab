// Gradient-check cases of the recurrent op family, appended to the table in rule_cases.cpp. Small shapes
// (seq 3, batch 2, input 2, hidden 2) keep the central differences cheap; every case uses all outputs
// (Y, Y_h and, for LSTM, Y_c), so each incoming gradient is checked.
#include "gradients/rule_cases.h"

namespace onnxtrain::test {

namespace {

constexpr int64_t S = 3, N = 2, I = 2, H = 2;

// X, W, R, B, sequence_lens, initial_h[, initial_c, P] for D directions; `with` says which optional inputs
// are given ("B", "h", "c", "P"); sequence_lens is a constant when lens is non-empty.
RuleCase rnn_case(std::string label, const std::string& op, int64_t D, const std::string& with, Attrs attrs,
              std::vector<int32_t> lens = {}, bool layout1 = false) {
  const int64_t G = op == "LSTM" ? 4 : op == "GRU" ? 3 : 1;
  const bool lstm = op == "LSTM";
  RuleCase c;
  c.label = std::move(label);
  c.op = op;
  c.attrs = std::move(attrs);
  c.attrs["hidden_size"] = H;
  if (D == 2) c.attrs["direction"] = std::string("bidirectional");
  if (layout1) c.attrs["layout"] = int64_t{1};
  auto has = [&](char k) { return with.find(k) != std::string::npos; };
  const std::vector<int64_t> state = layout1 ? std::vector<int64_t>{N, D, H} : std::vector<int64_t>{D, N, H};
  const std::vector<int64_t> absent{-1};
  c.input_shapes = {layout1 ? std::vector<int64_t>{N, S, I} : std::vector<int64_t>{S, N, I},
                    {D, G * H, I},
                    {D, G * H, H},
                    has('B') ? std::vector<int64_t>{D, 2 * G * H} : absent,
                    absent,
                    has('h') ? state : absent};
  if (lstm) {
    c.input_shapes.push_back(has('c') ? state : absent);
    c.input_shapes.push_back(has('P') ? std::vector<int64_t>{D, 3 * H} : absent);
  }
  // Trailing absent inputs are dropped (a node lists only up to its last given input).
  while (c.input_shapes.size() > 3 && c.input_shapes.back() == absent) c.input_shapes.pop_back();
  if (!lens.empty()) {
    if (c.input_shapes.size() < 5) c.input_shapes.resize(5, absent);
    c.const_inputs.resize(c.input_shapes.size());
    c.const_inputs[4] = TensorData::from<int32_t>({N}, std::span<const int32_t>(lens));
    c.input_shapes[4] = {N};
  }
  c.num_outputs = lstm ? 3 : 2;
  c.opset = 14;
  return c;
}

std::vector<std::string> strings(std::initializer_list<const char*> v) { return {v.begin(), v.end()}; }

}  // namespace

void add_recurrent_cases(std::vector<RuleCase>& v) {
  const std::string rev = "reverse";
  for (const char* op : {"LSTM", "GRU", "RNN"}) {
    const std::string o = op;
    const std::string all = o == "LSTM" ? "BhcP" : "Bh";
    v.push_back(rnn_case(o + "_forward", o, 1, "", {}));
    v.push_back(rnn_case(o + "_reverse_with_B_and_initial_state", o, 1, o == "LSTM" ? "Bhc" : "Bh",
                     {{"direction", rev}}));
    v.push_back(rnn_case(o + "_bidirectional_all_inputs", o, 2, all, {}));
    v.push_back(rnn_case(o + "_forward_sequence_lens", o, 1, all, {}, {3, 1}));
    v.push_back(rnn_case(o + "_reverse_sequence_lens", o, 1, "h", {{"direction", rev}}, {2, 3}));
    v.push_back(rnn_case(o + "_bidirectional_sequence_lens_zero_length", o, 2, all, {}, {0, 2}));
    v.push_back(rnn_case(o + "_layout1_bidirectional", o, 2, all, {}, {3, 2}, true));
    // clip 0.4 clips some pre-activations of these inputs: there the gradient is zero.
    v.push_back(rnn_case(o + "_clip", o, 1, "B", {{"clip", 0.4f}}));
  }
  v.push_back(rnn_case("LSTM_input_forget", "LSTM", 1, "BhcP", {{"input_forget", int64_t{1}}}));
  // Peepholes inside the clipped pre-activations (p_o c_t too), coupled gates, batch-major.
  v.push_back(rnn_case("LSTM_clip_peepholes_input_forget_layout1", "LSTM", 2, "BhcP",
                       {{"clip", 0.4f}, {"input_forget", int64_t{1}}}, {3, 1}, true));
  v.push_back(rnn_case("LSTM_activations", "LSTM", 2, "Bh",
                   {{"activations", strings({"HardSigmoid", "Softsign", "ScaledTanh", "Sigmoid", "Tanh", "Elu"})},
                    {"activation_alpha", std::vector<float>{0.3f, 0.8f, 1.5f}},
                    {"activation_beta", std::vector<float>{0.45f, 1.2f}}}));
  v.push_back(rnn_case("GRU_linear_before_reset", "GRU", 2, "Bh", {{"linear_before_reset", int64_t{1}}}, {3, 2}));
  v.push_back(rnn_case("GRU_linear_before_reset_reverse", "GRU", 1, "", {{"linear_before_reset", int64_t{1}},
                                                                       {"direction", rev}}));
  v.push_back(rnn_case("GRU_activations", "GRU", 1, "Bh", {{"activations", strings({"Softsign", "Affine"})},
                                                       {"activation_alpha", std::vector<float>{0.7f}},
                                                       {"activation_beta", std::vector<float>{0.1f}}}));
  v.push_back(rnn_case("RNN_activations", "RNN", 2, "Bh",
                   {{"activations", strings({"Softplus", "ScaledTanh"})},
                    {"activation_alpha", std::vector<float>{0.9f}},
                    {"activation_beta", std::vector<float>{1.3f}}}));
  // Opset 13 still uses the opset-7 schema of RNN (layout came with 14).
  v.push_back(rnn_case("RNN_opset13_schema7", "RNN", 1, "Bh", {}));
  v.back().opset = 13;
}

}  // namespace onnxtrain::test
