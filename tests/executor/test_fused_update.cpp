// The optimizer's update kernels (onnxtrain.AdamUpdate, AdamL2Update, AdamWUpdate: executor/cpu/fused_update.h)
// against the update as optimizers/ wrote it before issue 27 made it one op: 13 standard ops (two more for the L2
// term, one for the decay) run by the fused elementwise interpreter. Bit for bit, in float32 and float64, whatever the
// instruction and operand order of the program: the kernel evaluates formulas::adam_update in the same order with no
// contraction into FMAs. (The kernel against the op's own function body: tests/training/test_update_formulas.cpp.)
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "executor/cpu/fused_elementwise.h"
#include "executor/kernel.h"
#include "executor/tensor.h"
#include "formulas/optimizer_updates.h"
#include "graph/error.h"

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

std::vector<Tensor> run(const EwProgram& p, const std::vector<Tensor>& in) {
  std::unique_ptr<Kernel> k = make_fused_elementwise(p);
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

// The registered kernel for the variant, on the program's inputs in the op's order (P, G, M, V, the seven scalars,
// then wd or the decay); its outputs reordered as the program's (m', v', p', or p', v', m' when swapped).
std::vector<Tensor> run_kernel(DType t, int64_t n, bool l2, bool decay, bool swapped, const std::vector<Tensor>& in) {
  using formulas::AdamDecay;
  const AdamDecay d = l2 ? AdamDecay::L2 : decay ? AdamDecay::Decoupled : AdamDecay::None;
  Node node;
  node.name = "update";
  node.domain = "onnxtrain";
  node.op_type = formulas::adam_update_op(d, false);
  std::vector<const Tensor*> ins;
  for (int32_t i = 0; i <= kStep; ++i) ins.push_back(&in[static_cast<size_t>(i)]);
  if (l2) ins.push_back(&in[kWd]);
  if (decay) ins.push_back(&in[kDecay]);
  node.inputs.assign(ins.size(), "x");
  node.outputs = {"p", "m", "v"};
  const KernelDef* def = default_kernels().find("onnxtrain", node.op_type, 1, Device::CPU, t);
  EXPECT_NE(def, nullptr) << node.op_type;
  if (!def) return {};
  PrepareContext ctx{node, 1, Device::CPU, {}, std::vector<KernelOutput>(3)};
  for (const Tensor* x : ins) ctx.inputs.push_back({x->dtype, x->shape, nullptr});
  std::unique_ptr<Kernel> k = def->factory(ctx);
  std::vector<Tensor> out;
  for (const KernelOutput& o : ctx.outputs) {
    EXPECT_EQ(o.dtype, t);
    EXPECT_EQ(o.shape, std::vector<int64_t>{n});
    out.push_back(Tensor::empty(t, {n}));
  }
  std::vector<Tensor*> outs{&out[0], &out[1], &out[2]};
  k->run(ins, outs);
  return swapped ? std::vector<Tensor>{out[0], out[2], out[1]} : std::vector<Tensor>{out[1], out[2], out[0]};
}

TEST(FusedUpdate, KernelsMatchTheStandardOpsInterpretedBitForBit) {
  const int64_t n = 70001;  // several threads' chunks and a ragged end
  for (DType t : {DType::Float32, DType::Float64})
    for (auto [l2, decay, kind] : {std::tuple{false, false, "adam"}, {true, false, "adam+l2"}, {false, true, "adamw"}})
      for (bool swapped : {false, true}) {
        const EwProgram p = update(t, n, l2, decay, swapped);
        const std::vector<Tensor> in = t == DType::Float32 ? inputs<float>(n) : inputs<double>(n);
        const std::vector<Tensor> fast = run_kernel(t, n, l2, decay, swapped, in), slow = run(p, in);
        ASSERT_EQ(fast.size(), 3u);
        for (size_t k = 0; k < 3; ++k)
          EXPECT_EQ(std::memcmp(fast[k].data, slow[k].data, fast[k].nbytes()), 0)
              << kind << (swapped ? " swapped" : "") << " output " << k << " " << dtype_name(t);
      }
}

TEST(FusedUpdate, KernelRefusesMismatchedInputs) {
  Node node;
  node.name = "update";
  node.domain = "onnxtrain";
  node.op_type = "AdamUpdate";
  node.inputs.assign(11, "x");
  node.outputs = {"p", "m", "v"};
  const KernelDef* def = default_kernels().find("onnxtrain", "AdamUpdate", 1, Device::CPU, DType::Float32);
  ASSERT_NE(def, nullptr);
  auto prepare = [&](std::vector<KernelInput> in) {
    PrepareContext ctx{node, 1, Device::CPU, std::move(in), std::vector<KernelOutput>(3)};
    return def->factory(ctx);
  };
  std::vector<KernelInput> ok(11, KernelInput{DType::Float32, {}, nullptr});
  for (int i = 0; i < 4; ++i) ok[static_cast<size_t>(i)].shape = {5, 3};
  EXPECT_NE(prepare(ok), nullptr);
  std::vector<KernelInput> shape = ok;
  shape[2].shape = {3, 5};  // M not of P's shape
  EXPECT_THROW(prepare(shape), Error);
  std::vector<KernelInput> array_scalar = ok;
  array_scalar[4].shape = {5, 3};  // beta1 not one element
  EXPECT_THROW(prepare(array_scalar), Error);
  std::vector<KernelInput> dtype = ok;
  dtype[1].dtype = DType::Float64;  // G of another type
  EXPECT_THROW(prepare(dtype), Error);
  std::vector<KernelInput> fewer(ok.begin(), ok.end() - 1);
  EXPECT_THROW(prepare(fewer), Error);
}

}  // namespace
}  // namespace onnxtrain
