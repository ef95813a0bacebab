// MatMul, Gemm, ReduceSum and SumToShape on float16/bfloat16 tensors (mixed precision, docs/gpu.md).
//
// bfloat16 MatMul and Gemm on a CPU with AVX-512 BF16 run natively (bf16_gemm.h): bfloat16 operands, float32
// accumulation, one rounding of the result; operands are read in place with their strides, so the Transposes
// the plan folds into a MatMul (executor/plan_fusion.h) cost no copy.
//
// Everything else (float16, ReduceSum, SumToShape, and bfloat16 on a CPU without AVX-512 BF16) is emulated: the
// operands are widened to float32 (exactly), the float32 kernel computes with float32 accumulation, and the result
// is rounded to the half type once, which is what a tensor-core GEMM with a float32 accumulator (cuBLAS
// CUBLAS_COMPUTE_32F) gives. Reusing the float32 def's factory keeps broadcasting and the GEMM paths in one place;
// it is slower than float32 (the conversions), and says so once. Both paths take MatMul's and Gemm's checks and
// output from the op layer (executor/ops/matmul.h), as the float32 factory and the CUDA twin do.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "executor/cpu/bf16_gemm.h"
#include "executor/cpu/kernel_util.h"
#include "executor/cpu/matmul_operand.h"
#include "executor/half.h"
#include "executor/kernel.h"
#include "executor/ops/matmul.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using cpu::Operand;

template <class ToFloat, class FromFloat> class HalfViaFloatKernel final : public Kernel {
 public:
  // in_shapes[i] is empty-optional for inputs passed through as they are (absent ones, ReduceSum's axes).
  HalfViaFloatKernel(std::unique_ptr<Kernel> inner, std::vector<std::optional<std::vector<int64_t>>> in_shapes,
                     std::vector<int64_t> out_shape)
      : inner_(std::move(inner)), in_shapes_(std::move(in_shapes)), out_shape_(std::move(out_shape)) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    // Buffers are made on first use, so a kernel that is planned and never run allocates nothing.
    if (in32_.empty()) {
      for (const auto& s : in_shapes_) in32_.push_back(s ? Tensor::empty(DType::Float32, *s) : Tensor{});
      out32_ = Tensor::empty(DType::Float32, out_shape_);
    }
    ins_.assign(in.begin(), in.end());  // capacity kept from the first run: no allocation in a steady state
    std::vector<const Tensor*>& ins = ins_;
    const ToFloat widen;
    for (size_t i = 0; i < in.size() && i < in32_.size(); ++i) {
      if (!in[i] || !in_shapes_[i]) continue;
      const uint16_t* x = in[i]->ptr<uint16_t>();
      float* w = in32_[i].ptr<float>();
      for (int64_t j = 0, n = in[i]->numel(); j < n; ++j) w[j] = widen(x[j]);
      ins[i] = &in32_[i];
    }
    Tensor* outs[] = {&out32_};
    inner_->run(ins, outs);
    const FromFloat round;
    const float* y32 = out32_.ptr<float>();
    uint16_t* y = out[0]->ptr<uint16_t>();
    for (int64_t j = 0, n = out[0]->numel(); j < n; ++j) y[j] = round(y32[j]);
  }

 private:
  std::unique_ptr<Kernel> inner_;
  std::vector<std::optional<std::vector<int64_t>>> in_shapes_;
  std::vector<int64_t> out_shape_;
  std::vector<Tensor> in32_;
  Tensor out32_;
  std::vector<const Tensor*> ins_;
};

// ---- Native bfloat16 MatMul and Gemm ----


// Every product of one node, fixed at plan time: sizes, the operands' and C's strides, and per product of the
// batch the (A, B, Y) offsets.
struct Bf16Product {
  int64_t M = 0, N = 0, K = 0;
  cpu::Bf16Matrix a, b, c;  // pointers set per run
  int64_t ldy = 0;
  float alpha = 1.0f, beta = 1.0f;
  std::vector<int64_t> offsets;
};

class Bf16GemmKernel final : public Kernel {
 public:
  explicit Bf16GemmKernel(Bf16Product p) : p_(std::move(p)) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    cpu::Bf16Matrix a = p_.a, b = p_.b, c = p_.c;
    a.p = in[0]->ptr<uint16_t>();
    b.p = in[1]->ptr<uint16_t>();
    c.p = in.size() > 2 && in[2] ? in[2]->ptr<uint16_t>() : nullptr;
    cpu::bf16_gemm(p_.M, p_.N, p_.K, a, b, p_.alpha, c, p_.beta, out[0]->ptr<uint16_t>(), p_.ldy, p_.offsets);
  }

 private:
  Bf16Product p_;
};

// MatMul with numpy semantics: a 1-D operand is a row (A) or column (B) vector, batch dims broadcast. `m` is the
// checked product (cpu::matmul_operands); this lays it out for bf16_gemm.
std::unique_ptr<Kernel> make_bf16_matmul(PrepareContext& ctx, cpu::MatMulOperands m) {
  Operand& a = m.a;
  Operand& b = m.b;
  const bool a_vec = m.g.a_vector, b_vec = m.g.b_vector;
  if (a_vec) a = {{1, a.dims[0]}, {0, a.strides[0]}};
  if (b_vec) b = {{b.dims[0], 1}, {b.strides[0], 0}};
  const size_t na = a.dims.size(), nb = b.dims.size();
  Bf16Product p;
  p.M = m.g.M;
  p.K = m.g.K;
  p.N = m.g.N;
  const std::vector<int64_t>& batch = m.g.out_batch;
  const size_t r = batch.size();
  std::vector<int64_t> as(r, 0), bs(r, 0);
  for (size_t i = 0; i < r; ++i) {
    // A broadcast dim (size 1) re-reads the same matrix.
    if (i + na - 2 >= r && m.g.a_batch[i] != 1) as[i] = a.strides[i + na - 2 - r];
    if (i + nb - 2 >= r && m.g.b_batch[i] != 1) bs[i] = b.strides[i + nb - 2 - r];
  }
  p.a = {nullptr, a.strides[na - 2], a.strides[na - 1]};
  p.b = {nullptr, b.strides[nb - 2], b.strides[nb - 1]};
  // Y's strides as [batch..., M, N] (the dim of a 1-D operand kept), or as written permuted.
  std::vector<int64_t> full = batch;
  full.push_back(p.M);
  full.push_back(p.N);
  std::vector<int64_t> ys = cpu::contiguous_strides(full);
  if (std::optional<cpu::OutputLayout> y = cpu::permuted_output(ctx, m.g, ctx.outputs[0].shape)) {
    ys = y->strides;
    cpu::set_output(ctx, 0, DType::BFloat16, std::move(y->shape));
  }
  p.ldy = ys[r];
  const int64_t count = m.g.batch();
  p.offsets.reserve(static_cast<size_t>(3 * count));
  std::vector<int64_t> idx(r, 0);
  for (int64_t t = 0; t < count; ++t) {
    int64_t oa = 0, ob = 0, oy = 0;
    for (size_t i = 0; i < r; ++i) {
      oa += idx[i] * as[i];
      ob += idx[i] * bs[i];
      oy += idx[i] * ys[i];
    }
    p.offsets.insert(p.offsets.end(), {oa, ob, oy});
    for (size_t i = r; i-- > 0;) {
      if (++idx[i] < batch[i]) break;
      idx[i] = 0;
    }
  }
  return std::make_unique<Bf16GemmKernel>(std::move(p));
}

// Gemm: Y = alpha * op(A) op(B) + beta * C, C broadcast to [M, N]; `g` is the checked product (ops::prepare_gemm).
std::unique_ptr<Kernel> make_bf16_gemm(PrepareContext& ctx, const ops::GemmGeometry& g) {
  const std::vector<int64_t>& sa = ctx.inputs[0].shape;
  const std::vector<int64_t>& sb = ctx.inputs[1].shape;
  Bf16Product p;
  p.M = g.M;
  p.K = g.K;
  p.N = g.N;
  p.a = g.trans_a ? cpu::Bf16Matrix{nullptr, 1, sa[1]} : cpu::Bf16Matrix{nullptr, sa[1], 1};
  p.b = g.trans_b ? cpu::Bf16Matrix{nullptr, 1, sb[1]} : cpu::Bf16Matrix{nullptr, sb[1], 1};
  p.alpha = static_cast<float>(g.alpha);
  p.beta = static_cast<float>(g.beta);
  if (g.has_c) {
    // A dim of 1 is read with stride 0.
    const int64_t cm = g.c_shape[0], cn = g.c_shape[1];
    p.c = {nullptr, cm == 1 ? 0 : cn, cn == 1 ? 0 : 1};
  }
  p.ldy = p.N;
  p.offsets = {0, 0, 0};
  return std::make_unique<Bf16GemmKernel>(std::move(p));
}

// Says once per process that bfloat16 products are emulated here, and why.
void note_emulation() {
  static std::once_flag once;
  std::call_once(once, [] { std::fprintf(stderr, "onnxtrain: %s\n", cpu::bf16_path_description().c_str()); });
}

// The half-precision factory around `f32`, the float32 def's factory for the same op. Inputs of input 0's half
// type are widened; other float inputs are an error; the rest (integer axes) pass through.
KernelFactory half_factory(KernelFactory f32, const std::string& op) {
  return [f32, op](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    const DType half = ctx.inputs.at(0).dtype;
    if (op == "MatMul" || op == "Gemm") {
      // The op layer's checks first (on the half dtypes, so a mismatched input fails as on every other path and
      // the CUDA twin); they leave every input of the product in `half`. The float32 factory below checks the
      // widened node again, which passes.
      std::optional<cpu::MatMulOperands> mm;
      std::optional<ops::GemmGeometry> gemm;
      if (op == "MatMul") mm = cpu::matmul_operands(ctx);
      else gemm = ops::prepare_gemm(ctx);
      if (half == DType::BFloat16 && cpu::bf16_native_enabled())
        return mm ? make_bf16_matmul(ctx, std::move(*mm)) : make_bf16_gemm(ctx, *gemm);
      if (half == DType::BFloat16 && ctx.device != Device::CUDA && !cpu::bf16_native_supported()) note_emulation();
    }
    std::vector<std::optional<std::vector<int64_t>>> shapes;
    for (size_t i = 0; i < ctx.inputs.size(); ++i) {
      KernelInput& in = ctx.inputs[i];
      if (in.dtype != half && is_floating(in.dtype))
        ctx.fail("input " + std::to_string(i) + " is " + dtype_name(in.dtype) + " but input 0 is " + dtype_name(half) +
                 " (they must match)");
      shapes.push_back(in.dtype == half ? std::optional(in.shape) : std::nullopt);
      if (in.dtype == half) in = KernelInput{DType::Float32, in.shape, nullptr};
    }
    std::unique_ptr<Kernel> inner = f32(ctx);
    for (size_t i = 0; i < ctx.inputs.size(); ++i)
      if (shapes[i]) ctx.inputs[i].dtype = half;
    ctx.outputs.at(0).dtype = half;
    // A float32 kernel whose output is its input's bytes (a SumToShape with nothing to sum) is that for the half
    // bytes too: the plan makes it a view rather than a widen, copy and round.
    if (inner->output_is_view_of_input0()) return std::make_unique<cpu::CopyKernel>();
    const std::vector<int64_t>& out = ctx.outputs[0].shape;
    if (half == DType::Float16)
      return std::make_unique<HalfViaFloatKernel<HalfToFloat, FloatToHalf>>(std::move(inner), shapes, out);
    return std::make_unique<HalfViaFloatKernel<BFloat16ToFloat, FloatToBFloat16>>(std::move(inner), shapes, out);
  };
}

}  // namespace

void register_cpu_half_matmul(KernelRegistry& r) {
  // ReduceSum is here because the gradient of a half Gemm's broadcast bias sums the half output gradient.
  for (const char* op : {"MatMul", "Gemm", "ReduceSum"}) {
    std::vector<KernelDef> halves;
    for (const KernelDef& d : r.all())
      if (d.device == Device::CPU && d.domain.empty() && d.op_type == op &&
          std::find(d.dtypes.begin(), d.dtypes.end(), DType::Float32) != d.dtypes.end()) {
        KernelDef h = d;
        h.dtypes = {DType::Float16, DType::BFloat16};
        h.factory = half_factory(d.factory, op);
        halves.push_back(std::move(h));
      }
    if (halves.empty()) throw Error(std::string("half-precision ") + op + " registered before its float32 kernel");
    for (KernelDef& h : halves) r.add(std::move(h));
  }
  // SumToShape sums the half gradient of a broadcast (a half MatMul's batch dims). Its float32 kernel is registered
  // after this file (gather_grad.cpp), so the float32 factory is looked up when a kernel is made.
  KernelDef sum;
  sum.domain = "onnxtrain";
  sum.op_type = "SumToShape";
  sum.dtypes = {DType::Float16, DType::BFloat16};
  sum.factory = [](PrepareContext& ctx) -> std::unique_ptr<Kernel> {
    const KernelDef* d = default_kernels().find("onnxtrain", "SumToShape", ctx.opset, Device::CPU, DType::Float32);
    if (!d) ctx.fail("no float32 SumToShape kernel to widen to");
    return half_factory(d->factory, "SumToShape")(ctx);
  };
  r.add(std::move(sum));
}

}  // namespace onnxtrain
