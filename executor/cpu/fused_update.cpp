// Compiled with -ffp-contract=off (CMakeLists.txt): a*b + c must round twice, as the interpreter's separate
// Mul and Add loops do, or the two paths would differ in the last bit.
#include "executor/cpu/fused_update.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <optional>
#include <vector>

#include "executor/broadcast.h"
#include "executor/cpu/kernel_util.h"

namespace onnxtrain {
namespace {

// The leaves of the update's expression: four arrays of the weight's shape and the scalar hyper-parameters.
enum Leaf : int { P, G, M, V, B1, OMB1, B2, OMB2, BC2, EPS, STEP, WD, DECAY, kLeaves };

struct Pat {
  EwOp op{};
  std::vector<Pat> kids;
  int leaf = -1;
};
Pat leaf(Leaf l) { return {EwOp::Add, {}, l}; }
Pat op(EwOp o, Pat a) { return {o, {std::move(a)}, -1}; }
Pat op(EwOp o, Pat a, Pat b) { return {o, {std::move(a), std::move(b)}, -1}; }

// optimizers/optimizer.cpp, adam/adamw:
//   d = g (+ p * wd for adam with weight decay); base = p (* decay for adamw with weight decay)
//   nm = m * b1 + d * (1 - b1); nv = v * b2 + d * d * (1 - b2)
//   p' = base - step * nm / (sqrt(nv) / bc2 + eps)
struct UpdatePats {
  Pat nm, nv, np;
};
UpdatePats update_pats(bool l2, bool decay) {
  const Pat d = l2 ? op(EwOp::Add, leaf(G), op(EwOp::Mul, leaf(P), leaf(WD))) : leaf(G);
  const Pat base = decay ? op(EwOp::Mul, leaf(P), leaf(DECAY)) : leaf(P);
  Pat nm = op(EwOp::Add, op(EwOp::Mul, leaf(M), leaf(B1)), op(EwOp::Mul, d, leaf(OMB1)));
  Pat nv = op(EwOp::Add, op(EwOp::Mul, leaf(V), leaf(B2)), op(EwOp::Mul, op(EwOp::Mul, d, d), leaf(OMB2)));
  Pat denom = op(EwOp::Add, op(EwOp::Div, op(EwOp::Sqrt, nv), leaf(BC2)), leaf(EPS));
  Pat np = op(EwOp::Sub, base, op(EwOp::Div, op(EwOp::Mul, leaf(STEP), nm), denom));
  return {std::move(nm), std::move(nv), std::move(np)};
}

// Binds pattern leaves to kernel inputs. Backtracks through everything matched so far: m and g are
// interchangeable inside m' alone (m * b1 + g * (1 - b1)), and only v' then tells which is which.
class Matcher {
 public:
  explicit Matcher(const EwProgram& p) : p_(p) { bound_.fill(-1); }

  // Matches `pat` at value `v`, then whatever `then` still has to match; on failure every binding made is undone.
  bool match(const Pat& pat, int32_t v, const std::function<bool()>& then) {
    const int32_t n_in = static_cast<int32_t>(p_.inputs.size());
    if (pat.leaf >= 0) {
      if (v < 0 || v >= n_in) return false;
      // Arrays are read element by element, hyper-parameters once. A one-element update (a bias of size 1) may
      // see its arrays as scalars, which read the same element.
      const EwInput::Kind kind = p_.inputs[static_cast<size_t>(v)].kind;
      const EwInput::Kind want = pat.leaf <= V ? EwInput::Kind::Full : EwInput::Kind::Scalar;
      if (kind != want && !(p_.numel == 1 && kind != EwInput::Kind::Broadcast)) return false;
      // A leaf reads its input wherever it appears; two leaves may share one (equal constants), as they only read.
      int32_t& b = bound_[static_cast<size_t>(pat.leaf)];
      if (b >= 0) return b == v && then();
      b = v;
      if (then()) return true;
      b = -1;
      return false;
    }
    if (v < n_in) return false;
    const EwInstr& c = p_.code[static_cast<size_t>(v - n_in)];
    if (c.op != pat.op) return false;
    if (pat.kids.size() == 1) return match(pat.kids[0], c.a, then);
    if (match(pat.kids[0], c.a, [&] { return match(pat.kids[1], c.b, then); })) return true;
    return (c.op == EwOp::Add || c.op == EwOp::Mul) &&
           match(pat.kids[0], c.b, [&] { return match(pat.kids[1], c.a, then); });
  }
  const std::array<int32_t, kLeaves>& bound() const { return bound_; }

 private:
  const EwProgram& p_;
  std::array<int32_t, kLeaves> bound_;
};

struct Recognised {
  const char* kind;
  bool l2, decay;
  std::array<int32_t, kLeaves> inputs;  // kernel input per leaf (-1: unused)
  std::array<size_t, 3> out;            // kernel output of m', v' and the weight
};

std::optional<Recognised> recognise(const EwProgram& p) {
  if (p.outputs.size() != 3) return std::nullopt;
  for (const auto& [l2, decay] : {std::pair{false, false}, {true, false}, {false, true}}) {
    // 13 instructions for plain adam, two more for the L2 term, one more for the decay.
    if (p.code.size() != 13u + (l2 ? 2u : 0u) + (decay ? 1u : 0u)) continue;
    const UpdatePats pats = update_pats(l2, decay);
    std::array<size_t, 3> order = {0, 1, 2};
    do {
      Matcher m(p);
      const bool all = m.match(pats.nm, p.outputs[order[0]], [&] {
        return m.match(pats.nv, p.outputs[order[1]], [&] { return m.match(pats.np, p.outputs[order[2]], [] { return true; }); });
      });
      if (all)
        return Recognised{l2 ? "adam+l2" : decay ? "adamw" : "adam", l2, decay, m.bound(), order};
    } while (std::next_permutation(order.begin(), order.end()));
  }
  return std::nullopt;
}

template <class T, bool L2, bool Decay>
// __restrict: with seven pointers the compiler's runtime alias checks exceed its limit and it would not vectorise
// at all. The outputs are plan buffers, never an input or the state they will replace; inputs may share memory,
// as they are only read.
void adam_update(const T* __restrict p, const T* __restrict g, const T* __restrict m, const T* __restrict v,
                 T* __restrict nm_out, T* __restrict nv_out, T* __restrict np_out, int64_t begin, int64_t end,
                 const std::array<T, kLeaves>& k) {
  const T b1 = k[B1], omb1 = k[OMB1], b2 = k[B2], omb2 = k[OMB2], bc2 = k[BC2], eps = k[EPS], step = k[STEP],
          wd = k[WD], decay = k[DECAY];
  for (int64_t i = begin; i < end; ++i) {
    T d = g[i];
    if constexpr (L2) d = g[i] + p[i] * wd;
    const T nm = m[i] * b1 + d * omb1;
    const T nv = v[i] * b2 + d * d * omb2;
    T base = p[i];
    if constexpr (Decay) base = p[i] * decay;
    nm_out[i] = nm;
    nv_out[i] = nv;
    np_out[i] = base - step * nm / (std::sqrt(nv) / bc2 + eps);
  }
}

template <class T> class AdamUpdateKernel final : public Kernel {
 public:
  AdamUpdateKernel(Recognised r, int64_t numel) : r_(r), numel_(numel) {}

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    auto arr = [&](int l) { return in[static_cast<size_t>(r_.inputs[static_cast<size_t>(l)])]->template ptr<T>(); };
    std::array<T, kLeaves> k{};
    for (int l = B1; l < kLeaves; ++l)
      if (r_.inputs[static_cast<size_t>(l)] >= 0) k[static_cast<size_t>(l)] = arr(l)[0];
    const T *p = arr(P), *g = arr(G), *m = arr(M), *v = arr(V);
    T* nm = out[r_.out[0]]->template ptr<T>();
    T* nv = out[r_.out[1]]->template ptr<T>();
    T* np = out[r_.out[2]]->template ptr<T>();
    parallel_chunks(numel_, cpu::kCostlyGrain, [&](int64_t begin, int64_t end) {
      if (r_.l2) adam_update<T, true, false>(p, g, m, v, nm, nv, np, begin, end, k);
      else if (r_.decay) adam_update<T, false, true>(p, g, m, v, nm, nv, np, begin, end, k);
      else adam_update<T, false, false>(p, g, m, v, nm, nv, np, begin, end, k);
    });
  }

 private:
  Recognised r_;
  int64_t numel_;
};

}  // namespace

const char* ew_native_update(const EwProgram& p) {
  const auto r = recognise(p);
  return r ? r->kind : nullptr;
}

std::unique_ptr<Kernel> make_native_update(const EwProgram& p) {
  const auto r = recognise(p);
  if (!r) return nullptr;
  if (p.dtype == DType::Float32) return std::make_unique<AdamUpdateKernel<float>>(*r, p.numel);
  if (p.dtype == DType::Float64) return std::make_unique<AdamUpdateKernel<double>>(*r, p.numel);
  return nullptr;
}

}  // namespace onnxtrain
