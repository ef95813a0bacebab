// Optimizer updates recognised in fused elementwise programs (executor/cpu/fused_update.h): adam, adam with an
// L2 term and adamw run as one hand-written loop whose results equal the fused interpreter's bit for bit, in
// float32 and float64, whatever the instruction and operand order; anything else stays with the interpreter.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "executor/cpu/fused_elementwise.h"
#include "executor/cpu/fused_update.h"
#include "executor/tensor.h"

namespace onnxtrain {
namespace {

// Inputs 0-3: p, g, m, v (arrays); then the scalars b1, 1-b1, b2, 1-b2, sqrt(bc2), eps, step, wd, decay.
constexpr int32_t kP = 0, kG = 1, kM = 2, kV = 3, kB1 = 4, kOmb1 = 5, kB2 = 6, kOmb2 = 7, kBc2 = 8, kEps = 9,
                  kStep = 10, kWd = 11, kDecay = 12, kInputs = 13;
const double kScalars[] = {0.9, 0.1, 0.999, 0.001, 0.0447, 1e-8, 0.0123, 0.01, 0.9999};

struct Builder {
  EwProgram p;
  int32_t add(EwOp op, int32_t a, int32_t b = -1) {
    p.code.push_back({op, a, b});
    return static_cast<int32_t>(kInputs + p.code.size() - 1);
  }
};

// The update as optimizers/ writes it; `swapped` flips every commutative operand pair and emits v' before m'.
EwProgram update(DType t, int64_t n, bool l2, bool decay, bool swapped) {
  Builder b;
  b.p.dtype = t;
  b.p.numel = n;
  for (int32_t i = 0; i < kInputs; ++i) b.p.inputs.push_back({i <= kV ? EwInput::Kind::Full : EwInput::Kind::Scalar});
  auto mul = [&](int32_t x, int32_t y) { return swapped ? b.add(EwOp::Mul, y, x) : b.add(EwOp::Mul, x, y); };
  auto add = [&](int32_t x, int32_t y) { return swapped ? b.add(EwOp::Add, y, x) : b.add(EwOp::Add, x, y); };
  const int32_t d = l2 ? add(kG, mul(kP, kWd)) : kG;
  const int32_t base = decay ? mul(kP, kDecay) : kP;
  int32_t nm = -1, nv = -1;
  auto emit_m = [&] { nm = add(mul(kM, kB1), mul(d, kOmb1)); };
  auto emit_v = [&] { nv = add(mul(kV, kB2), mul(mul(d, d), kOmb2)); };
  if (swapped) emit_v(), emit_m();
  else emit_m(), emit_v();
  const int32_t denom = add(b.add(EwOp::Div, b.add(EwOp::Sqrt, nv), kBc2), kEps);
  const int32_t np = b.add(EwOp::Sub, base, b.add(EwOp::Div, mul(kStep, nm), denom));
  b.p.outputs = swapped ? std::vector<int32_t>{np, nv, nm} : std::vector<int32_t>{nm, nv, np};
  return b.p;
}

std::vector<Tensor> run(const EwProgram& p, bool native, const std::vector<Tensor>& in) {
  std::unique_ptr<Kernel> k = make_fused_elementwise(p, native);
  std::vector<Tensor> out;
  for (size_t i = 0; i < p.outputs.size(); ++i) out.push_back(Tensor::empty(p.dtype, {p.numel}));
  std::vector<const Tensor*> ins;
  std::vector<Tensor*> outs;
  for (const Tensor& t : in) ins.push_back(&t);
  for (Tensor& t : out) outs.push_back(&t);
  k->run(ins, outs);
  return out;
}

template <class T> std::vector<Tensor> inputs(int64_t n) {
  std::mt19937 rng(11);
  std::normal_distribution<double> nd;
  std::vector<Tensor> in;
  for (int32_t i = 0; i <= kV; ++i) {
    std::vector<T> v(static_cast<size_t>(n));
    for (T& x : v) x = static_cast<T>(i == kV ? std::abs(nd(rng)) * 1e-3 : nd(rng));  // v >= 0 (a second moment)
    in.push_back(Tensor::from_vector<T>({n}, v));
  }
  for (double s : kScalars) in.push_back(Tensor::from_vector<T>({}, {static_cast<T>(s)}));
  return in;
}

TEST(FusedUpdate, AdamVariantsAreRecognisedAndMatchTheInterpreterBitForBit) {
  const int64_t n = 70001;  // several threads' chunks and a ragged end
  for (DType t : {DType::Float32, DType::Float64})
    for (auto [l2, decay, kind] : {std::tuple{false, false, "adam"}, {true, false, "adam+l2"}, {false, true, "adamw"}})
      for (bool swapped : {false, true}) {
        const EwProgram p = update(t, n, l2, decay, swapped);
        const char* got = ew_native_update(p);
        ASSERT_NE(got, nullptr) << kind << (swapped ? " swapped " : " ") << ew_describe(p);
        EXPECT_STREQ(got, kind);
        const std::vector<Tensor> in = t == DType::Float32 ? inputs<float>(n) : inputs<double>(n);
        const std::vector<Tensor> fast = run(p, true, in), slow = run(p, false, in);
        for (size_t k = 0; k < 3; ++k)
          EXPECT_EQ(std::memcmp(fast[k].data, slow[k].data, fast[k].nbytes()), 0)
              << kind << (swapped ? " swapped" : "") << " output " << k << " " << dtype_name(t);
      }
}

TEST(FusedUpdate, OtherProgramsStayWithTheInterpreter) {
  // An update that adds the step instead of subtracting it: same size and shape of program, not adam.
  EwProgram inside = update(DType::Float32, 64, false, false, false);
  for (EwInstr& c : inside.code)
    if (c.op == EwOp::Sub) c.op = EwOp::Add;
  EXPECT_EQ(ew_native_update(inside), nullptr);
  // A hyper-parameter that is an array, not a scalar.
  EwProgram arr = update(DType::Float32, 64, false, false, false);
  arr.inputs[kB1].kind = EwInput::Kind::Full;
  EXPECT_EQ(ew_native_update(arr), nullptr);
  // Only two of the three results written.
  EwProgram two = update(DType::Float32, 64, false, false, false);
  two.outputs.pop_back();
  EXPECT_EQ(ew_native_update(two), nullptr);
}

}  // namespace
}  // namespace onnxtrain
