// The fused elementwise kernel (executor/cpu/fused_elementwise.h). run() splits the output across threads like
// every elementwise kernel, and each thread walks its range in tiles of kTile elements: scalar inputs are
// splatted once into a tile buffer, broadcast ones (bias rows, per-row statistics) are gathered per tile, and
// each instruction is one tight loop over the tile (vectorised by the compiler, with intrinsics for sqrt, or
// the same Eigen packet expression the unfused kernel uses for the transcendental ops). Temporaries live in
// stack tile buffers; values the plan still needs are written straight to their outputs.
// GCC 12 warns falsely inside its own AVX-512 intrinsics when Eigen vectorises (as in unary.cpp).
#include "executor/cpu/fused_elementwise.h"

#include "executor/cpu/eigen_map.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include <numbers>

#include "executor/broadcast.h"
#include "executor/cpu/kernel_util.h"
#include "executor/cpu/vector_sqrt.h"
#include "executor/functors.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

constexpr int64_t kTile = 256;

bool default_domain(const Node& n) { return n.domain.empty() || n.domain == "ai.onnx"; }

template <class Op, class T> void unary_loop(T* __restrict d, const T* __restrict a, int64_t n) {
  const Op op;
  for (int64_t k = 0; k < n; ++k) d[k] = op(a[k]);
}
template <class Op, class T> void binary_loop(T* __restrict d, const T* __restrict a, const T* __restrict b, int64_t n) {
  const Op op;
  for (int64_t k = 0; k < n; ++k) d[k] = op(a[k], b[k]);
}
template <class E, class T> void eigen_unary(T* d, const T* a, int64_t n) {
  Eigen::Map<cpu::EigenArray<T>>(d, n) = E::eval(Eigen::Map<const cpu::EigenArray<T>>(a, n));
}

using EigenGeluGrad = cpu::EigenFormula<GeluErfGradFn>;  // the formulas of executor/functors.h
using EigenGeluTanhGrad = cpu::EigenFormula<GeluTanhGradFn>;
template <class E, class T> void eigen_binary(T* d, const T* a, const T* b, int64_t n) {
  using M = Eigen::Map<const cpu::EigenArray<T>>;
  Eigen::Map<cpu::EigenArray<T>>(d, n) = E::eval(M(a, n), M(b, n));
}

template <class T> void apply(EwOp op, T* d, const T* a, const T* b, int64_t n) {
  switch (op) {
    case EwOp::Add: return binary_loop<AddOp>(d, a, b, n);
    case EwOp::Sub: return binary_loop<SubOp>(d, a, b, n);
    case EwOp::Mul: return binary_loop<MulOp>(d, a, b, n);
    case EwOp::Div: return binary_loop<DivOp>(d, a, b, n);
    case EwOp::Max: return binary_loop<MaxOp>(d, a, b, n);
    case EwOp::Min: return binary_loop<MinOp>(d, a, b, n);
    case EwOp::ReluGrad: return binary_loop<ReluGradOp>(d, a, b, n);
    case EwOp::SigmoidGrad: return binary_loop<SigmoidGradOp>(d, a, b, n);
    case EwOp::TanhGrad: return binary_loop<TanhGradOp>(d, a, b, n);
    case EwOp::GeluGrad: return eigen_binary<EigenGeluGrad>(d, a, b, n);
    case EwOp::GeluTanhGrad: return eigen_binary<EigenGeluTanhGrad>(d, a, b, n);
    case EwOp::Neg: return unary_loop<NegOp>(d, a, n);
    case EwOp::Abs: return unary_loop<AbsOp>(d, a, n);
    case EwOp::Relu: return unary_loop<ReluOp>(d, a, n);
    case EwOp::Sqrt: return cpu::sqrt_span(a, d, n);
    case EwOp::Reciprocal: return unary_loop<ReciprocalOp>(d, a, n);
    case EwOp::Exp: return eigen_unary<cpu::EigenExp>(d, a, n);
    case EwOp::Log: return eigen_unary<cpu::EigenLog>(d, a, n);
    case EwOp::Tanh: return eigen_unary<cpu::EigenTanh>(d, a, n);
    case EwOp::Sigmoid: return eigen_unary<cpu::EigenSigmoid>(d, a, n);
    case EwOp::Erf: return eigen_unary<cpu::EigenErf>(d, a, n);
    case EwOp::Broadcast: return (void)std::copy(a, a + n, d);
  }
}

bool costly(EwOp op) {
  switch (op) {
    case EwOp::GeluGrad: case EwOp::GeluTanhGrad: case EwOp::Exp: case EwOp::Log: case EwOp::Tanh:
    case EwOp::Sigmoid: case EwOp::Erf:
      return true;
    default:
      return false;
  }
}

// Where a value lives during a tile.
struct Place {
  enum class Kind : uint8_t { Input, Slot, Output } kind;
  int32_t index;  // input number, slot number or output number
};

struct Layout {
  std::vector<Place> places;  // per value id
  size_t slots = 0;
};

// Places every value; a temporary's slot is reused once its last reader has run.
Layout lay_out_unbounded(const EwProgram& p) {
  const size_t n_in = p.inputs.size(), n_val = n_in + p.code.size();
  auto bad = [&](const std::string& why) { fail("fused elementwise kernel " + ew_describe(p), why); };
  std::vector<int32_t> output_of(n_val, -1);
  for (size_t k = 0; k < p.outputs.size(); ++k) {
    const int32_t v = p.outputs[k];
    if (v < static_cast<int32_t>(n_in) || v >= static_cast<int32_t>(n_val)) bad("output " + std::to_string(k) + " is not an instruction's result");
    if (output_of[static_cast<size_t>(v)] >= 0) bad("value " + std::to_string(v) + " is written to two outputs");
    output_of[static_cast<size_t>(v)] = static_cast<int32_t>(k);
  }
  std::vector<size_t> last_use(n_val, 0);
  std::vector<bool> read(n_val, false);
  for (size_t i = 0; i < p.code.size(); ++i) {
    const EwInstr& c = p.code[i];
    const int32_t self = static_cast<int32_t>(n_in + i);
    for (int32_t v : {c.a, c.b}) {
      if (v == -1) continue;
      if (v < 0 || v >= self) bad("instruction " + std::to_string(i) + " reads value " + std::to_string(v) + " before it is defined");
      last_use[static_cast<size_t>(v)] = i;
      read[static_cast<size_t>(v)] = true;
    }
    if ((ew_arity(c.op) == 2) != (c.b != -1) || c.a == -1) bad("instruction " + std::to_string(i) + " has the wrong number of operands");
  }
  Layout l;
  l.places.resize(n_val);
  std::vector<size_t> free_slots;
  auto take = [&] {
    if (!free_slots.empty()) {
      size_t s = free_slots.back();
      free_slots.pop_back();
      return s;
    }
    return l.slots++;
  };
  for (size_t i = 0; i < n_in; ++i)
    l.places[i] = p.inputs[i].kind == EwInput::Kind::Full ? Place{Place::Kind::Input, static_cast<int32_t>(i)}
                                                          : Place{Place::Kind::Slot, static_cast<int32_t>(take())};
  for (size_t i = 0; i < p.code.size(); ++i) {
    const size_t v = n_in + i;
    // The destination is taken before the operands are released: a loop never writes the buffer it reads.
    l.places[v] = output_of[v] >= 0 ? Place{Place::Kind::Output, output_of[v]} : Place{Place::Kind::Slot, static_cast<int32_t>(take())};
    for (int32_t o : {p.code[i].a, p.code[i].b})
      if (o >= static_cast<int32_t>(n_in) && last_use[static_cast<size_t>(o)] == i &&
          l.places[static_cast<size_t>(o)].kind == Place::Kind::Slot &&
          (o != p.code[i].b || p.code[i].a != p.code[i].b))  // x*x: release once
        free_slots.push_back(static_cast<size_t>(l.places[static_cast<size_t>(o)].index));
    // A result nobody reads frees its slot at once.
    if (l.places[v].kind == Place::Kind::Slot && !read[v]) free_slots.push_back(static_cast<size_t>(l.places[v].index));
  }
  return l;
}

Layout lay_out(const EwProgram& p) {
  Layout l = lay_out_unbounded(p);
  if (l.slots > kMaxEwSlots)
    fail("fused elementwise kernel " + ew_describe(p),
         "needs " + std::to_string(l.slots) + " tile buffers, more than " + std::to_string(kMaxEwSlots));
  return l;
}

template <class T> class FusedElementwiseKernel final : public Kernel {
 public:
  FusedElementwiseKernel(EwProgram p, Layout l) : p_(std::move(p)), l_(std::move(l)) {
    bool any_costly = false;
    for (const EwInstr& c : p_.code) any_costly = any_costly || costly(c.op);
    // Threads pay off sooner the more work each element takes.
    grain_ = any_costly ? cpu::kCostlyGrain
                        : std::max<int64_t>(cpu::kCostlyGrain, cpu::kCheapGrain / static_cast<int64_t>(std::max<size_t>(1, p_.code.size())));
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const size_t n_in = p_.inputs.size();
    std::array<const T*, 64> ins{};
    std::array<T*, 64> outs{};
    for (size_t i = 0; i < n_in; ++i) ins[i] = in[i]->ptr<T>();
    for (size_t k = 0; k < p_.outputs.size(); ++k) outs[k] = out[k]->ptr<T>();
    parallel_chunks(p_.numel, grain_, [&](int64_t begin, int64_t end) { run_range(ins.data(), outs.data(), begin, end); });
  }

 private:
  void run_range(const T* const* ins, T* const* outs, int64_t begin, int64_t end) const {
    alignas(64) T buf[kMaxEwSlots * kTile];
    auto slot = [&](int32_t s) { return buf + static_cast<size_t>(s) * kTile; };
    const size_t n_in = p_.inputs.size();
    for (size_t i = 0; i < n_in; ++i)
      if (p_.inputs[i].kind == EwInput::Kind::Scalar) std::fill_n(slot(l_.places[i].index), kTile, ins[i][0]);
    std::array<const T*, 128> src{};
    for (int64_t t0 = begin; t0 < end; t0 += kTile) {
      const int64_t n = std::min(kTile, end - t0);
      for (size_t i = 0; i < n_in; ++i) {
        const EwInput& x = p_.inputs[i];
        if (x.kind == EwInput::Kind::Full) {
          src[i] = ins[i] + t0;
        } else if (x.kind == EwInput::Kind::Scalar) {
          src[i] = slot(l_.places[i].index);
        } else if (x.inner == 1) {  // a row: copy it, wrapping around
          T* d = slot(l_.places[i].index);
          int64_t pos = t0 % x.period, k = 0;
          while (k < n) {
            const int64_t run = std::min(n - k, x.period - pos);
            std::memcpy(d + k, ins[i] + pos, static_cast<size_t>(run) * sizeof(T));
            k += run;
            pos = 0;
          }
          src[i] = d;
        } else {  // each value repeated `inner` times
          T* d = slot(l_.places[i].index);
          int64_t q = t0 / x.inner, r = t0 % x.inner, k = 0;
          while (k < n) {
            const int64_t run = std::min(n - k, x.inner - r);
            std::fill_n(d + k, run, ins[i][q % x.period]);
            k += run;
            r = 0;
            ++q;
          }
          src[i] = d;
        }
      }
      for (size_t j = 0; j < p_.code.size(); ++j) {
        const EwInstr& c = p_.code[j];
        const Place& pl = l_.places[n_in + j];
        T* d = pl.kind == Place::Kind::Output ? outs[pl.index] + t0 : slot(pl.index);
        apply<T>(c.op, d, src[static_cast<size_t>(c.a)], c.b >= 0 ? src[static_cast<size_t>(c.b)] : nullptr, n);
        src[n_in + j] = d;
      }
    }
  }

  EwProgram p_;
  Layout l_;
  int64_t grain_;
};

}  // namespace

std::optional<EwOp> elementwise_op_of(const Node& n) {
  if (n.outputs.size() != 1) return std::nullopt;
  const size_t k = n.inputs.size();
  for (const std::string& i : n.inputs)
    if (i.empty()) return std::nullopt;
  if (n.domain == "onnxtrain") {
    if (k != 2) return std::nullopt;
    if (n.op_type == "ReluGrad") return EwOp::ReluGrad;
    if (n.op_type == "SigmoidGrad") return EwOp::SigmoidGrad;
    if (n.op_type == "TanhGrad") return EwOp::TanhGrad;
    if (n.op_type == "GeluGrad") return EwOp::GeluGrad;
    if (n.op_type == "GeluTanhGrad") return EwOp::GeluTanhGrad;
    return std::nullopt;
  }
  if (!default_domain(n)) return std::nullopt;
  static const std::pair<const char*, EwOp> kBinary[] = {{"Add", EwOp::Add}, {"Sub", EwOp::Sub}, {"Mul", EwOp::Mul},
                                                         {"Div", EwOp::Div}, {"Sum", EwOp::Add}, {"Max", EwOp::Max},
                                                         {"Min", EwOp::Min}};
  static const std::pair<const char*, EwOp> kUnary[] = {
      {"Neg", EwOp::Neg},   {"Abs", EwOp::Abs},   {"Relu", EwOp::Relu}, {"Sqrt", EwOp::Sqrt},       {"Reciprocal", EwOp::Reciprocal},
      {"Exp", EwOp::Exp},   {"Log", EwOp::Log},   {"Tanh", EwOp::Tanh}, {"Sigmoid", EwOp::Sigmoid}, {"Erf", EwOp::Erf}};
  if (k == 2)
    for (const auto& [name, op] : kBinary)
      if (n.op_type == name) return op;
  if (k == 1)
    for (const auto& [name, op] : kUnary)
      if (n.op_type == name) return op;
  if (k == 2 && n.op_type == "Expand") return EwOp::Broadcast;
  return std::nullopt;
}

int ew_arity(EwOp op) { return op < EwOp::Neg ? 2 : 1; }

const char* ew_name(EwOp op) {
  static const char* const kNames[] = {"Add",  "Sub", "Mul",  "Div",  "Max",        "Min", "ReluGrad",
                                       "SigmoidGrad", "TanhGrad", "GeluGrad", "GeluTanhGrad", "Neg", "Abs", "Relu",
                                       "Sqrt", "Reciprocal", "Exp", "Log", "Tanh", "Sigmoid", "Erf", "Broadcast"};
  return kNames[static_cast<size_t>(op)];
}

size_t ew_slots_needed(const EwProgram& p) { return lay_out_unbounded(p).slots; }

std::unique_ptr<Kernel> make_fused_elementwise(EwProgram p) {
  if (p.inputs.size() > 64 || p.outputs.size() > 64 || p.inputs.size() + p.code.size() > 128)
    fail("fused elementwise kernel " + ew_describe(p), "more than 64 inputs or outputs, or 128 values");
  for (const EwInput& x : p.inputs)
    if (x.kind == EwInput::Kind::Broadcast && (x.period <= 0 || x.inner <= 0))
      fail("fused elementwise kernel " + ew_describe(p), "a broadcast input needs a positive period and inner size");
  Layout l = lay_out(p);
  if (p.dtype == DType::Float32) return std::make_unique<FusedElementwiseKernel<float>>(std::move(p), std::move(l));
  if (p.dtype == DType::Float64) return std::make_unique<FusedElementwiseKernel<double>>(std::move(p), std::move(l));
  fail("fused elementwise kernel " + ew_describe(p), "dtype " + dtype_name(p.dtype) + " (float32 or float64 only)");
}

std::string ew_describe(const EwProgram& p) {
  const size_t n_in = p.inputs.size();
  auto name = [&](int32_t v) {
    std::string r(v < static_cast<int32_t>(n_in) ? "in" : "v");
    r.append(std::to_string(v));
    return r;
  };
  std::string s("[");
  for (size_t i = 0; i < p.code.size(); ++i) {
    const EwInstr& c = p.code[i];
    if (i) s.append("; ");
    s.append(name(static_cast<int32_t>(n_in + i))).append("=").append(ew_name(c.op)).append("(").append(name(c.a));
    if (c.b >= 0) s.append(", ").append(name(c.b));
    s.append(")");
  }
  return s.append("]");
}

}  // namespace onnxtrain
