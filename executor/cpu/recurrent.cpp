// CPU kernels of the recurrent op family (see register_cpu_recurrent in executor/kernel.h): LSTM, GRU and RNN
// (ai.onnx, opsets 7 and 14: layout), and their fused gradients onnxtrain.LSTMGrad / GRUGrad / RNNGrad, which do
// backpropagation through time (gradients/rules/recurrent.cpp states the design).
//
// One engine serves the three cells. Per direction: the input projections of every step are one GEMM
// (X W^T + Wb over all S*B rows); each step adds H_prev R^T + Rb (one GEMM over the batch) and applies the cell's
// elementwise maths. Rows run in "step" order s = 0..S-1: a batch entry b of length L_b is at time s (forward)
// or L_b-1-s (reverse) while s < L_b, and past its length its state is carried unchanged and Y is zero there. So
// Y_h (and Y_c) is the state after the last step for every row (initial_h for a row of length 0), which keeps
// the backward pass one uniform recursion: an inactive step passes dH (and dC) through untouched.
//
// The gradient kernels rerun the forward pass keeping, per step, the state before it and the gates'
// pre-activations (before clip), then run the recursion backwards: dW, dX and Wb's gradient come out of one GEMM
// each over all steps at the end; dR and Rb's gradient are accumulated per step. A clipped pre-activation
// (|z| > clip) passes no gradient.
// GCC 12 warns falsely inside its AVX-512 intrinsics when Eigen vectorises (as in unary.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>

#include "executor/cpu/gemm.h"
#include "executor/cpu/kernel_util.h"
#include "executor/kernel.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

enum class Cell { RNN, GRU, LSTM };

// Number of gates (blocks of H rows in W and R) and of activation functions per direction.
int64_t gates_of(Cell c) { return c == Cell::LSTM ? 4 : c == Cell::GRU ? 3 : 1; }
size_t acts_of(Cell c) { return c == Cell::LSTM ? 3 : c == Cell::GRU ? 2 : 1; }

enum class ActKind { Sigmoid, Tanh, Relu, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus };

struct Act {
  ActKind kind = ActKind::Tanh;
  double alpha = 0, beta = 0;
};

template <class T> T act(const Act& a, T x) {
  const T al = T(a.alpha), be = T(a.beta);
  switch (a.kind) {
    case ActKind::Sigmoid: return T(1) / (T(1) + std::exp(-x));
    case ActKind::Tanh: return std::tanh(x);
    case ActKind::Relu: return x > T(0) ? x : T(0);
    case ActKind::Affine: return al * x + be;
    case ActKind::LeakyRelu: return x >= T(0) ? x : al * x;
    case ActKind::ThresholdedRelu: return x > al ? x : T(0);
    case ActKind::ScaledTanh: return al * std::tanh(be * x);
    case ActKind::HardSigmoid: return std::max(T(0), std::min(T(1), al * x + be));
    case ActKind::Elu: return x >= T(0) ? x : al * (std::exp(x) - T(1));
    case ActKind::Softsign: return x / (T(1) + std::abs(x));
    case ActKind::Softplus: return x > T(20) ? x : std::log1p(std::exp(x));
  }
  return x;
}

// The derivative at pre-activation x (kinks take the right-hand slope's convention of the forward ops' rules).
template <class T> T dact(const Act& a, T x) {
  const T al = T(a.alpha), be = T(a.beta);
  switch (a.kind) {
    case ActKind::Sigmoid: {
      const T s = T(1) / (T(1) + std::exp(-x));
      return s * (T(1) - s);
    }
    case ActKind::Tanh: {
      const T t = std::tanh(x);
      return T(1) - t * t;
    }
    case ActKind::Relu: return x > T(0) ? T(1) : T(0);
    case ActKind::Affine: return al;
    case ActKind::LeakyRelu: return x >= T(0) ? T(1) : al;
    case ActKind::ThresholdedRelu: return x > al ? T(1) : T(0);
    case ActKind::ScaledTanh: {
      const T t = std::tanh(be * x);
      return al * be * (T(1) - t * t);
    }
    case ActKind::HardSigmoid: {
      const T v = al * x + be;
      return v > T(0) && v < T(1) ? al : T(0);
    }
    case ActKind::Elu: return x >= T(0) ? T(1) : al * std::exp(x);
    case ActKind::Softsign: {
      const T d = T(1) + std::abs(x);
      return T(1) / (d * d);
    }
    case ActKind::Softplus: return T(1) / (T(1) + std::exp(-x));
  }
  return T(1);
}

// y = f(clip(x)) over n values (clip = +inf: none); Sigmoid and Tanh vectorised by Eigen.
template <class T> void activate(const Act& f, const T* x, T* y, int64_t n, T clip) {
  using A = Eigen::Array<T, Eigen::Dynamic, 1>;
  Eigen::Map<const A> xs(x, n);
  Eigen::Map<A> ys(y, n);
  if (f.kind == ActKind::Sigmoid) ys = xs.max(-clip).min(clip).logistic();
  else if (f.kind == ActKind::Tanh) ys = xs.max(-clip).min(clip).tanh();
  else
    for (int64_t i = 0; i < n; ++i) y[i] = act(f, std::max(-clip, std::min(clip, x[i])));
}

// The derivative of y = f(clip(x)) from x and y: zero where |x| > clip (the clipped value does not move).
template <class T> void derivative(const Act& f, const T* x, const T* y, T* out, int64_t n, T clip) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = std::abs(x[i]) > clip               ? T(0)
             : f.kind == ActKind::Sigmoid        ? y[i] * (T(1) - y[i])
             : f.kind == ActKind::Tanh           ? T(1) - y[i] * y[i]
                                                 : dact(f, x[i]);
}

// The cell's attributes and dims, resolved at plan time.
struct Spec {
  Cell cell = Cell::RNN;
  int64_t G = 1, H = 0, D = 1, S = 0, B = 0, I = 0;
  int64_t layout = 0;
  bool reverse_first = false;  // direction="reverse": the only direction runs backwards in time
  double clip = std::numeric_limits<double>::infinity();
  bool lbr = false;           // GRU linear_before_reset
  bool input_forget = false;  // LSTM
  std::vector<Act> acts;      // acts_of(cell) per direction
  bool reversed(int64_t d) const { return d == 1 || reverse_first; }
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

template <class V> const V* attr_list(const Node& n, const char* name) {
  auto it = n.attributes.find(name);
  return it == n.attributes.end() ? nullptr : std::get_if<V>(&it->second);
}

// Reads the attributes and the dims of X, W, R. `in` are the forward inputs (X, W, R, B, sequence_lens,
// initial_h[, initial_c, P]).
Spec make_spec(const PrepareContext& ctx, Cell cell, std::span<const KernelInput> in) {
  Spec s;
  s.cell = cell;
  s.G = gates_of(cell);
  const Node& n = ctx.node;
  const std::string dir = n.attr_string("direction", "forward");
  if (dir == "bidirectional") s.D = 2;
  else if (dir == "reverse") s.reverse_first = true;
  else if (dir != "forward") ctx.fail("direction '" + dir + "' is not one of forward, reverse, bidirectional");
  // layout exists from opset 14; the fused gradient ops (domain onnxtrain, opset 1) carry the forward node's.
  s.layout = n.attr_int("layout", 0);
  if (s.layout != 0 && s.layout != 1) ctx.fail("layout must be 0 or 1");
  if (n.has_attr("clip")) {
    s.clip = n.attr_float("clip", 0);
    if (!(s.clip > 0)) ctx.fail("clip must be positive");
  }
  s.lbr = cell == Cell::GRU && n.attr_int("linear_before_reset", 0) != 0;
  s.input_forget = cell == Cell::LSTM && n.attr_int("input_forget", 0) != 0;

  if (in.size() < 3 || !in[0].present() || !in[1].present() || !in[2].present())
    ctx.fail("inputs X, W and R are required");
  const auto &x = in[0].shape, &w = in[1].shape, &r = in[2].shape;
  if (x.size() != 3 || w.size() != 3 || r.size() != 3) ctx.fail("X, W and R must have rank 3");
  for (size_t i = 1; i < 3; ++i)
    if (in[i].dtype != in[0].dtype) ctx.fail("X, W and R must have the same dtype");
  s.S = s.layout ? x[1] : x[0];
  s.B = s.layout ? x[0] : x[1];
  s.I = x[2];
  if (w[0] != s.D) ctx.fail("W's first dim must be num_directions = " + std::to_string(s.D));
  if (w[1] % s.G) ctx.fail("W's second dim must be a multiple of " + std::to_string(s.G));
  s.H = w[1] / s.G;
  if (n.has_attr("hidden_size") && n.attr_int("hidden_size", 0) != s.H)
    ctx.fail("hidden_size does not match W's shape");
  if (w[2] != s.I) ctx.fail("W's last dim must be X's input size " + std::to_string(s.I));
  if (r != std::vector<int64_t>{s.D, s.G * s.H, s.H}) ctx.fail("R must be [num_directions, gates*hidden, hidden]");
  auto check = [&](size_t i, std::vector<int64_t> want, const char* what) {
    if (i < in.size() && in[i].present()) {
      if (in[i].shape != want) ctx.fail(std::string(what) + " has the wrong shape");
      if (in[i].dtype != in[0].dtype) ctx.fail(std::string(what) + " must have X's dtype");
    }
  };
  check(3, {s.D, 2 * s.G * s.H}, "B");
  if (in.size() > 4 && in[4].present()) {
    if (in[4].dtype != DType::Int32 && in[4].dtype != DType::Int64) ctx.fail("sequence_lens must be int32");
    if (in[4].shape != std::vector<int64_t>{s.B}) ctx.fail("sequence_lens must be [batch_size]");
  }
  const std::vector<int64_t> state = s.layout ? std::vector<int64_t>{s.B, s.D, s.H} : std::vector<int64_t>{s.D, s.B, s.H};
  check(5, state, "initial_h");
  if (cell == Cell::LSTM) {
    check(6, state, "initial_c");
    check(7, {s.D, 3 * s.H}, "P");
  }

  // Activations: acts_of(cell) per direction, default Sigmoid/Tanh/Tanh (LSTM), Sigmoid/Tanh (GRU), Tanh (RNN);
  // alpha and beta are consumed in order by the functions that take them.
  const size_t na = acts_of(cell);
  std::vector<std::string> names;
  if (auto* v = attr_list<std::vector<std::string>>(n, "activations")) names = *v;
  if (names.empty()) {
    std::vector<std::string> def = cell == Cell::LSTM  ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
                                   : cell == Cell::GRU ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                       : std::vector<std::string>{"Tanh"};
    for (int64_t d = 0; d < s.D; ++d) names.insert(names.end(), def.begin(), def.end());
  }
  if (names.size() == na && s.D == 2) {
    const std::vector<std::string> one = names;  // not names' own range, which the insertion may free
    names.insert(names.end(), one.begin(), one.end());
  }
  if (names.size() != na * static_cast<size_t>(s.D))
    ctx.fail("activations must list " + std::to_string(na * s.D) + " functions");
  std::vector<float> alphas, betas;
  if (auto* v = attr_list<std::vector<float>>(n, "activation_alpha")) alphas = *v;
  if (auto* v = attr_list<std::vector<float>>(n, "activation_beta")) betas = *v;
  size_t ai = 0, bi = 0;
  for (const std::string& name : names) {
    const std::string l = lower(name);
    Act a;
    double da = 0, db = 0;
    bool ua = false, ub = false;
    if (l == "sigmoid") a.kind = ActKind::Sigmoid;
    else if (l == "tanh") a.kind = ActKind::Tanh;
    else if (l == "relu") a.kind = ActKind::Relu;
    else if (l == "affine") a.kind = ActKind::Affine, da = 1, ua = ub = true;
    else if (l == "leakyrelu") a.kind = ActKind::LeakyRelu, da = 0.01, ua = true;
    else if (l == "thresholdedrelu") a.kind = ActKind::ThresholdedRelu, da = 1, ua = true;
    else if (l == "scaledtanh") a.kind = ActKind::ScaledTanh, da = 1, db = 1, ua = ub = true;
    else if (l == "hardsigmoid") a.kind = ActKind::HardSigmoid, da = 0.2, db = 0.5, ua = ub = true;
    else if (l == "elu") a.kind = ActKind::Elu, da = 1, ua = true;
    else if (l == "softsign") a.kind = ActKind::Softsign;
    else if (l == "softplus") a.kind = ActKind::Softplus;
    else ctx.fail("activation '" + name + "' is not supported");
    // The defaults as a float attribute holds them, as given values are (and as the grad ops' bodies read them).
    a.alpha = ua && ai < alphas.size() ? alphas[ai++] : static_cast<float>(da);
    a.beta = ub && bi < betas.size() ? betas[bi++] : static_cast<float>(db);
    s.acts.push_back(a);
  }
  // The grad ops also carry the functions as the ints and floats their function bodies read (the rule writes them
  // beside the strings, gradients/rules/recurrent.cpp): they must say what the strings say.
  if (auto* kinds = attr_list<std::vector<int64_t>>(n, "activation_kinds")) {
    const auto* al = attr_list<std::vector<float>>(n, "activation_alphas");
    const auto* be = attr_list<std::vector<float>>(n, "activation_betas");
    const size_t k = s.acts.size();
    bool agree = al && be && kinds->size() == k && al->size() == k && be->size() == k;
    for (size_t i = 0; agree && i < k; ++i)
      agree = (*kinds)[i] == static_cast<int64_t>(s.acts[i].kind) && (*al)[i] == static_cast<float>(s.acts[i].alpha) &&
              (*be)[i] == static_cast<float>(s.acts[i].beta);
    if (!agree)
      ctx.fail("activation_kinds, activation_alphas and activation_betas do not agree with activations, "
               "activation_alpha and activation_beta");
  }
  return s;
}

template <class T> using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Row-major C[M, N] = op(A)[M, K] op(B)[K, N] + beta C, op the transpose when ta / tb (A stored [K, M]). float32
// takes onnxtrain's own threaded GEMM (executor/cpu/gemm.h) where the build has it; otherwise Eigen.
template <class T> void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* a, int64_t lda, const T* b,
                             int64_t ldb, T beta, T* c, int64_t ldc) {
  if (M == 0 || N == 0) return;
  using St = Eigen::OuterStride<>;
  Eigen::Map<Mat<T>, 0, St> C(c, M, N, St(ldc));
  if (K == 0) {
    if (beta == T(0)) C.setZero();
    else C *= beta;
    return;
  }
  if constexpr (std::is_same_v<T, float>)
    if (cpu::own_sgemm_available()) return cpu::own_sgemm(ta, tb, M, N, K, 1.0f, a, lda, b, ldb, beta, c, ldc);
  Eigen::Map<const Mat<T>, 0, St> A(a, ta ? K : M, ta ? M : K, St(lda)), Bm(b, tb ? N : K, tb ? K : N, St(ldb));
  if (beta == T(0)) C.setZero();
  else if (beta != T(1)) C *= beta;
  if (!ta && !tb) C.noalias() += A * Bm;
  else if (!ta) C.noalias() += A * Bm.transpose();
  else if (!tb) C.noalias() += A.transpose() * Bm;
  else C.noalias() += A.transpose() * Bm.transpose();
}

// The per-step products (batch x gates*hidden x hidden) are small and strictly sequential: an OpenMP team per
// step spent most of a step in barriers (on a loaded 2-core machine, 4x the single-thread time), so the step loops
// run them on one thread; the products over all steps at once (X W^T, dX, dW) keep every thread.
struct OneThread {
  int saved = omp_get_max_threads();
  OneThread() { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(saved); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;
};

// The forward pass of one direction and what its gradient needs. All buffers are in step order.
template <class T> struct Trace {
  std::vector<T> h;    // [S+1, B, H]: h[s] is the state before step s, h[S] the final state
  std::vector<T> c;    // LSTM: [S+1, B, H] cell states likewise
  std::vector<T> pre;  // [S, B, G*H] gate pre-activations before clip (GRU's third: the full candidate's)
  std::vector<T> q;    // GRU with linear_before_reset: [S, B, H] = H_prev Rh^T + Rbh
  std::vector<T> val;  // [S, B, G*H] gate values f(clip(pre)) (GRU's r block: r itself)
  std::vector<T> hc;   // LSTM: [S, B, H] h(C_t)
};

// The recurrent engine over one node's inputs, in layout 0.
template <class T> struct Engine {
  const Spec& s;
  std::vector<T> x;        // [S, B, I]
  const T* w = nullptr;    // [D, GH, I]
  const T* r = nullptr;    // [D, GH, H]
  std::vector<T> bias;     // [D, 2GH], zeros when B is absent
  std::vector<int64_t> len;  // [B]
  std::vector<T> h0, c0;   // [D, B, H]
  std::vector<T> p;        // [D, 3H], zeros when absent
  bool has_p = false;

  Engine(const Spec& spec, std::span<const Tensor* const> in) : s(spec) {
    const int64_t S = s.S, B = s.B, I = s.I, H = s.H, D = s.D, GH = s.G * s.H;
    x.resize(S * B * I);
    const T* xp = in[0]->ptr<T>();
    if (s.layout == 0) std::copy(xp, xp + S * B * I, x.begin());
    else
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < S; ++t) std::copy_n(xp + (b * S + t) * I, I, x.begin() + (t * B + b) * I);
    w = in[1]->ptr<T>();
    r = in[2]->ptr<T>();
    bias.assign(D * 2 * GH, T(0));
    if (in.size() > 3 && in[3]) std::copy_n(in[3]->ptr<T>(), D * 2 * GH, bias.begin());
    len.assign(B, S);
    if (in.size() > 4 && in[4]) {
      for (int64_t b = 0; b < B; ++b) {
        const int64_t l = in[4]->dtype == DType::Int32 ? in[4]->ptr<int32_t>()[b] : in[4]->ptr<int64_t>()[b];
        if (l < 0 || l > S) throw Error("sequence_lens[" + std::to_string(b) + "] = " + std::to_string(l) +
                                        " is outside [0, " + std::to_string(S) + "]");
        len[b] = l;
      }
    }
    auto state = [&](const Tensor* t, std::vector<T>& out) {
      out.assign(D * B * H, T(0));
      if (!t) return;
      const T* v = t->ptr<T>();
      if (s.layout == 0) std::copy_n(v, D * B * H, out.begin());
      else
        for (int64_t b = 0; b < B; ++b)
          for (int64_t d = 0; d < D; ++d) std::copy_n(v + (b * D + d) * H, H, out.begin() + (d * B + b) * H);
    };
    state(in.size() > 5 ? in[5] : nullptr, h0);
    if (s.cell == Cell::LSTM) {
      state(in.size() > 6 ? in[6] : nullptr, c0);
      p.assign(D * 3 * H, T(0));
      if (in.size() > 7 && in[7]) {
        has_p = true;
        std::copy_n(in[7]->ptr<T>(), D * 3 * H, p.begin());
      }
    }
  }

  int64_t time(int64_t d, int64_t b, int64_t st) const { return s.reversed(d) ? len[b] - 1 - st : st; }
  const Act& a(int64_t d, size_t k) const { return s.acts[d * acts_of(s.cell) + k]; }

  // Runs direction d; y (layout 0 [S, D, B, H], zeroed by the caller) gets the outputs of active steps.
  void forward(int64_t d, Trace<T>& tr, T* y) const {
    const int64_t S = s.S, B = s.B, I = s.I, H = s.H, D = s.D, GH = s.G * s.H;
    const T* wd = w + d * GH * I;
    const T* rd = r + d * GH * H;
    const T* wb = bias.data() + d * 2 * GH;
    const T* rb = wb + GH;
    const T c = T(s.clip), none = std::numeric_limits<T>::infinity();
    Mat<T> xp(S * B, GH);
    gemm<T>(false, true, S * B, GH, I, x.data(), I, wd, I, T(0), xp.data(), GH);
    xp.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(wb, GH);
    tr.h.assign((S + 1) * B * H, T(0));
    std::copy_n(h0.begin() + d * B * H, B * H, tr.h.begin());
    if (s.cell == Cell::LSTM) {
      tr.c.assign((S + 1) * B * H, T(0));
      std::copy_n(c0.begin() + d * B * H, B * H, tr.c.begin());
      tr.hc.assign(S * B * H, T(0));
    }
    tr.pre.assign(S * B * GH, T(0));
    tr.val.assign(S * B * GH, T(0));
    if (s.lbr) tr.q.assign(S * B * H, T(0));
    const T* pi = s.cell == Cell::LSTM ? p.data() + d * 3 * H : nullptr;
    const T* po = pi ? pi + H : nullptr;
    const T* pf = pi ? pi + 2 * H : nullptr;
    Mat<T> rec(B, GH), rhm(B, H), rech(B, H);
    const OneThread one;
    for (int64_t st = 0; st < S; ++st) {
      const T* hp = tr.h.data() + st * B * H;
      T* hn = tr.h.data() + (st + 1) * B * H;
      T* pre = tr.pre.data() + st * B * GH;
      T* val = tr.val.data() + st * B * GH;
      // GRU without linear_before_reset multiplies R's candidate block by r * H_prev instead, below.
      gemm<T>(false, true, B, s.cell == Cell::GRU && !s.lbr ? 2 * H : GH, H, hp, H, rd, H, T(0), rec.data(), GH);
      for (int64_t b = 0; b < B; ++b) {
        if (st >= len[b]) continue;
        const T* xr = xp.data() + (time(d, b, st) * B + b) * GH;
        for (int64_t j = 0; j < (s.cell == Cell::GRU ? 2 * H : GH); ++j) pre[b * GH + j] = xr[j] + rec(b, j) + rb[j];
      }
      if (s.cell == Cell::RNN) {
        for (int64_t b = 0; b < B; ++b) {
          if (st < len[b]) activate(a(d, 0), pre + b * GH, val + b * GH, H, c);
          std::copy_n((st < len[b] ? val + b * GH : hp + b * H), H, hn + b * H);
        }
      } else if (s.cell == Cell::LSTM) {
        const T* cp = tr.c.data() + st * B * H;
        T* cn = tr.c.data() + (st + 1) * B * H;
        for (int64_t b = 0; b < B; ++b) {
          const T* cpb = cp + b * H;
          T* cnb = cn + b * H;
          if (st >= len[b]) {
            std::copy_n(hp + b * H, H, hn + b * H);
            std::copy_n(cpb, H, cnb);
            continue;
          }
          T* g = pre + b * GH;  // gates i, o, f, c
          T* v = val + b * GH;
          for (int64_t j = 0; j < H; ++j) {
            g[j] += pi[j] * cpb[j];
            g[2 * H + j] += pf[j] * cpb[j];
          }
          activate(a(d, 0), g, v, H, c);
          if (s.input_forget)
            for (int64_t j = 0; j < H; ++j) v[2 * H + j] = T(1) - v[j];
          else
            activate(a(d, 0), g + 2 * H, v + 2 * H, H, c);
          activate(a(d, 1), g + 3 * H, v + 3 * H, H, c);
          for (int64_t j = 0; j < H; ++j) {
            cnb[j] = v[2 * H + j] * cpb[j] + v[j] * v[3 * H + j];
            g[H + j] += po[j] * cnb[j];
          }
          activate(a(d, 0), g + H, v + H, H, c);
          T* hcb = tr.hc.data() + (st * B + b) * H;
          activate(a(d, 2), cnb, hcb, H, none);  // h(C) is not clipped
          for (int64_t j = 0; j < H; ++j) hn[b * H + j] = v[H + j] * hcb[j];
        }
      } else {  // GRU: z, r, h
        for (int64_t b = 0; b < B; ++b) {
          if (st >= len[b]) {
            rhm.row(b).setZero();
            continue;
          }
          activate(a(d, 0), pre + b * GH, val + b * GH, 2 * H, c);  // z and r
          for (int64_t j = 0; j < H; ++j) rhm(b, j) = val[b * GH + H + j] * (s.lbr ? T(1) : hp[b * H + j]);
        }
        if (!s.lbr) gemm<T>(false, true, B, H, H, rhm.data(), H, rd + 2 * H * H, H, T(0), rech.data(), H);
        for (int64_t b = 0; b < B; ++b) {
          if (st >= len[b]) {
            std::copy_n(hp + b * H, H, hn + b * H);
            continue;
          }
          const T* xr = xp.data() + (time(d, b, st) * B + b) * GH;
          T* hpre = pre + b * GH + 2 * H;
          for (int64_t j = 0; j < H; ++j) {
            if (s.lbr) {
              const T q = rec(b, 2 * H + j) + rb[2 * H + j];
              tr.q[(st * B + b) * H + j] = q;
              hpre[j] = xr[2 * H + j] + rhm(b, j) * q;
            } else {
              hpre[j] = xr[2 * H + j] + rech(b, j) + rb[2 * H + j];
            }
          }
          const T* v = val + b * GH;
          activate(a(d, 1), hpre, val + b * GH + 2 * H, H, c);
          for (int64_t j = 0; j < H; ++j)
            hn[b * H + j] = (T(1) - v[j]) * v[2 * H + j] + v[j] * hp[b * H + j];
        }
      }
      if (y)
        for (int64_t b = 0; b < B; ++b)
          if (st < len[b]) std::copy_n(hn + b * H, H, y + ((time(d, b, st) * D + d) * B + b) * H);
    }
  }

  // Gradients of direction d, accumulated into dx [S, B, I] and written to dw, dr, dbias [2GH], dh0, dc0 [B, H]
  // and dp [3H] (that direction's slices). dy [S, D, B, H], dyh, dyc [D, B, H] (layout 0) may be null.
  void backward(int64_t d, const Trace<T>& tr, const T* dy, const T* dyh, const T* dyc, T* dx, T* dw, T* dr,
                T* dbias, T* dh0, T* dc0, T* dp) const {
    const int64_t S = s.S, B = s.B, I = s.I, H = s.H, D = s.D, GH = s.G * s.H;
    const T* wd = w + d * GH * I;
    const T* rd = r + d * GH * H;
    const T c = T(s.clip), none = std::numeric_limits<T>::infinity();
    const T* pi = s.cell == Cell::LSTM ? p.data() + d * 3 * H : nullptr;
    const T* po = pi ? pi + H : nullptr;
    const T* pf = pi ? pi + 2 * H : nullptr;
    Mat<T> dxp = Mat<T>::Zero(S * B, GH);  // d pre-activation of each (time, batch) row: the W path
    Mat<T> dgr(B, GH), dhp(B, H), tmp(B, H), rhm(B, H), rslope(B, H);
    std::vector<T> slope(GH), hslope(H);  // one row's activation derivatives (zero where clipped)
    std::fill(dr, dr + GH * H, T(0));
    Eigen::Matrix<T, 1, Eigen::Dynamic> drb = Eigen::Matrix<T, 1, Eigen::Dynamic>::Zero(GH);
    std::fill(dp, dp + 3 * H, T(0));
    std::vector<T> dh(B * H, T(0)), dc(B * H, T(0));
    if (dyh) std::copy_n(dyh + d * B * H, B * H, dh.begin());
    if (dyc && s.cell == Cell::LSTM) std::copy_n(dyc + d * B * H, B * H, dc.begin());
    std::optional<OneThread> one(std::in_place);
    for (int64_t st = S - 1; st >= 0; --st) {
      const T* hp = tr.h.data() + st * B * H;
      const T* pre = tr.pre.data() + st * B * GH;
      const T* val = tr.val.data() + st * B * GH;
      dgr.setZero();
      if (dy)
        for (int64_t b = 0; b < B; ++b)
          if (st < len[b]) {
            const T* g = dy + ((time(d, b, st) * D + d) * B + b) * H;
            for (int64_t j = 0; j < H; ++j) dh[b * H + j] += g[j];
          }
      if (s.cell == Cell::RNN) {
        for (int64_t b = 0; b < B; ++b) {
          if (st >= len[b]) continue;
          derivative(a(d, 0), pre + b * GH, val + b * GH, slope.data(), H, c);
          for (int64_t j = 0; j < H; ++j) dgr(b, j) = dh[b * H + j] * slope[j];
        }
      } else if (s.cell == Cell::LSTM) {
        const T* cp = tr.c.data() + st * B * H;
        const T* cn = tr.c.data() + (st + 1) * B * H;
        for (int64_t b = 0; b < B; ++b) {
          if (st >= len[b]) continue;
          const T *g = pre + b * GH, *v = val + b * GH, *cpb = cp + b * H, *cnb = cn + b * H;
          const T* hcb = tr.hc.data() + (st * B + b) * H;
          derivative(a(d, 0), g, v, slope.data(), 3 * H, c);  // i, o, f
          derivative(a(d, 1), g + 3 * H, v + 3 * H, slope.data() + 3 * H, H, c);
          derivative(a(d, 2), cnb, hcb, hslope.data(), H, none);
          for (int64_t j = 0; j < H; ++j) {
            const int64_t k = b * H + j;
            const T ig = v[j], og = v[H + j], fg = v[2 * H + j], cg = v[3 * H + j];
            const T dO = dh[k] * hcb[j] * slope[H + j];
            const T dC = dc[k] + dh[k] * og * hslope[j] + dO * po[j];
            dp[H + j] += dO * cnb[j];
            T di = dC * cg, df = dC * cpb[j];
            const T dcg = dC * ig * slope[3 * H + j];
            if (s.input_forget) di -= df, df = T(0);  // f = 1 - i
            di *= slope[j];
            df *= slope[2 * H + j];
            dp[j] += di * cpb[j];
            dp[2 * H + j] += df * cpb[j];
            dc[k] = dC * fg + di * pi[j] + df * pf[j];  // dC_prev
            dgr(b, j) = di, dgr(b, H + j) = dO, dgr(b, 2 * H + j) = df, dgr(b, 3 * H + j) = dcg;
          }
        }
      } else {  // GRU
        for (int64_t b = 0; b < B; ++b) {
          if (st >= len[b]) {
            rhm.row(b).setZero();
            continue;
          }
          const T *g = pre + b * GH, *v = val + b * GH;
          derivative(a(d, 0), g, v, slope.data(), 2 * H, c);  // z, r
          derivative(a(d, 1), g + 2 * H, v + 2 * H, slope.data() + 2 * H, H, c);
          for (int64_t j = 0; j < H; ++j) {
            const int64_t k = b * H + j;
            const T z = v[j], hh = v[2 * H + j];
            rhm(b, j) = v[H + j] * (s.lbr ? T(1) : hp[k]);
            rslope(b, j) = slope[H + j];
            dgr(b, j) = dh[k] * (hp[k] - hh) * slope[j];
            dgr(b, 2 * H + j) = dh[k] * (T(1) - z) * slope[2 * H + j];  // d candidate pre; lbr: becomes dq below
          }
        }
        if (s.lbr) {
          for (int64_t b = 0; b < B; ++b) {
            if (st >= len[b]) continue;
            for (int64_t j = 0; j < H; ++j) {
              const T dhh = dgr(b, 2 * H + j);
              dgr(b, H + j) = dhh * tr.q[(st * B + b) * H + j] * rslope(b, j);
              dgr(b, 2 * H + j) = dhh * rhm(b, j);  // dq = dhh * r
              dxp(time(d, b, st) * B + b, 2 * H + j) = dhh;
            }
          }
        } else {
          // d(r * H_prev) = dhh Rh
          gemm<T>(false, false, B, H, H, dgr.data() + 2 * H, GH, rd + 2 * H * H, H, T(0), tmp.data(), H);
          for (int64_t b = 0; b < B; ++b) {
            if (st >= len[b]) continue;
            for (int64_t j = 0; j < H; ++j) dgr(b, H + j) = tmp(b, j) * hp[b * H + j] * rslope(b, j);
          }
        }
      }
      // dH_prev: through R, plus the direct paths; inactive rows pass dH through.
      if (s.cell == Cell::GRU && !s.lbr) {
        gemm<T>(false, false, B, H, 2 * H, dgr.data(), GH, rd, H, T(0), dhp.data(), H);
        gemm<T>(true, false, 2 * H, H, B, dgr.data(), GH, hp, H, T(1), dr, H);
        gemm<T>(true, false, H, H, B, dgr.data() + 2 * H, GH, rhm.data(), H, T(1), dr + 2 * H * H, H);
      } else {
        gemm<T>(false, false, B, H, GH, dgr.data(), GH, rd, H, T(0), dhp.data(), H);
        gemm<T>(true, false, GH, H, B, dgr.data(), GH, hp, H, T(1), dr, H);
      }
      drb += dgr.colwise().sum();
      for (int64_t b = 0; b < B; ++b) {
        if (st >= len[b]) continue;  // dh unchanged
        const T* v = val + b * GH;
        for (int64_t j = 0; j < H; ++j) {
          const int64_t k = b * H + j;
          T u = dhp(b, j);
          if (s.cell == Cell::GRU) {
            u += dh[k] * v[j];                       // through z * H_prev
            if (!s.lbr) u += tmp(b, j) * v[H + j];  // through r * H_prev
          }
          dh[k] = u;
        }
        auto row = dxp.row(time(d, b, st) * B + b);
        if (s.cell == Cell::GRU && s.lbr) row.leftCols(2 * H) = dgr.row(b).leftCols(2 * H);
        else row = dgr.row(b);
      }
    }
    one.reset();
    gemm<T>(false, false, S * B, I, GH, dxp.data(), GH, wd, I, T(1), dx, I);
    gemm<T>(true, false, GH, I, S * B, dxp.data(), GH, x.data(), I, T(0), dw, I);
    Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>(dbias, GH) = dxp.colwise().sum();
    Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>(dbias + GH, GH) = drb;
    std::copy(dh.begin(), dh.end(), dh0);
    if (dc0) std::copy(dc.begin(), dc.end(), dc0);
  }
};

// Layout-0 [D, B, H] state to the node's layout.
template <class T> void put_state(const Spec& s, const T* v, T* out) {
  if (s.layout == 0) return (void)std::copy_n(v, s.D * s.B * s.H, out);
  for (int64_t d = 0; d < s.D; ++d)
    for (int64_t b = 0; b < s.B; ++b) std::copy_n(v + (d * s.B + b) * s.H, s.H, out + (b * s.D + d) * s.H);
}

template <class T> class RecurrentKernel final : public Kernel {
 public:
  explicit RecurrentKernel(Spec s) : s_(std::move(s)) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    Engine<T> e(s_, in);
    const int64_t S = s_.S, B = s_.B, H = s_.H, D = s_.D;
    std::vector<T> y(S * D * B * H, T(0)), yh(D * B * H), yc(D * B * H);
    for (int64_t d = 0; d < D; ++d) {
      Trace<T> tr;
      e.forward(d, tr, y.data());
      std::copy_n(tr.h.begin() + S * B * H, B * H, yh.begin() + d * B * H);
      if (s_.cell == Cell::LSTM) std::copy_n(tr.c.begin() + S * B * H, B * H, yc.begin() + d * B * H);
    }
    if (out.size() > 0 && out[0]) {
      T* o = out[0]->ptr<T>();
      if (s_.layout == 0) std::copy(y.begin(), y.end(), o);
      else  // [S, D, B, H] -> [B, S, D, H]
        for (int64_t t = 0; t < S; ++t)
          for (int64_t d = 0; d < D; ++d)
            for (int64_t b = 0; b < B; ++b)
              std::copy_n(y.begin() + ((t * D + d) * B + b) * H, H, o + ((b * S + t) * D + d) * H);
    }
    if (out.size() > 1 && out[1]) put_state(s_, yh.data(), out[1]->ptr<T>());
    if (out.size() > 2 && out[2]) put_state(s_, yc.data(), out[2]->ptr<T>());
  }

 private:
  Spec s_;
};

std::vector<int64_t> state_shape(const Spec& s) {
  return s.layout ? std::vector<int64_t>{s.B, s.D, s.H} : std::vector<int64_t>{s.D, s.B, s.H};
}

template <Cell C> std::unique_ptr<Kernel> make_forward(PrepareContext& ctx) {
  const size_t max_out = C == Cell::LSTM ? 3 : 2;
  if (ctx.outputs.size() > max_out) ctx.fail("has too many outputs");
  const Spec s = make_spec(ctx, C, ctx.inputs);
  const DType t = ctx.inputs[0].dtype;
  const std::vector<int64_t> y = s.layout ? std::vector<int64_t>{s.B, s.S, s.D, s.H} : std::vector<int64_t>{s.S, s.D, s.B, s.H};
  for (size_t i = 0; i < ctx.outputs.size(); ++i) cpu::set_output(ctx, i, t, i == 0 ? y : state_shape(s));
  if (t == DType::Float32) return std::make_unique<RecurrentKernel<float>>(s);
  if (t == DType::Float64) return std::make_unique<RecurrentKernel<double>>(s);
  cpu::fail_dtype(ctx, 0);
}

// onnxtrain.<Cell>Grad: inputs are the forward op's (LSTM: X, W, R, B, sequence_lens, initial_h, initial_c, P;
// GRU, RNN: up to initial_h) followed by the incoming gradients dY, dY_h (and dY_c), any of them absent (zero);
// output i is the gradient of input i (the sequence_lens slot is empty), in the input's shape.
template <class T> class RecurrentGradKernel final : public Kernel {
 public:
  explicit RecurrentGradKernel(Spec s) : s_(std::move(s)) {}
  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const size_t nf = s_.cell == Cell::LSTM ? 8 : 6;
    Engine<T> e(s_, in.first(std::min(nf, in.size())));
    const int64_t S = s_.S, B = s_.B, I = s_.I, H = s_.H, D = s_.D, GH = s_.G * s_.H;
    auto grad = [&](size_t k) -> const Tensor* { return nf + k < in.size() ? in[nf + k] : nullptr; };
    // Incoming gradients to layout 0.
    std::vector<T> dy, dyh, dyc;
    if (const Tensor* t = grad(0)) {
      dy.resize(S * D * B * H);
      const T* v = t->ptr<T>();
      if (s_.layout == 0) std::copy_n(v, dy.size(), dy.begin());
      else
        for (int64_t ti = 0; ti < S; ++ti)
          for (int64_t d = 0; d < D; ++d)
            for (int64_t b = 0; b < B; ++b)
              std::copy_n(v + ((b * S + ti) * D + d) * H, H, dy.begin() + ((ti * D + d) * B + b) * H);
    }
    auto state_in = [&](const Tensor* t, std::vector<T>& o) {
      if (!t) return;
      o.resize(D * B * H);
      const T* v = t->ptr<T>();
      if (s_.layout == 0) std::copy_n(v, o.size(), o.begin());
      else
        for (int64_t b = 0; b < B; ++b)
          for (int64_t d = 0; d < D; ++d) std::copy_n(v + (b * D + d) * H, H, o.begin() + (d * B + b) * H);
    };
    state_in(grad(1), dyh);
    if (s_.cell == Cell::LSTM) state_in(grad(2), dyc);
    std::vector<T> dx(S * B * I, T(0)), dw(D * GH * I), dr(D * GH * H), db(D * 2 * GH), dh0(D * B * H), dc0(D * B * H),
        dp(D * 3 * H);
    for (int64_t d = 0; d < D; ++d) {
      Trace<T> tr;
      e.forward(d, tr, nullptr);
      e.backward(d, tr, dy.empty() ? nullptr : dy.data(), dyh.empty() ? nullptr : dyh.data(),
                 dyc.empty() ? nullptr : dyc.data(), dx.data(), dw.data() + d * GH * I, dr.data() + d * GH * H,
                 db.data() + d * 2 * GH, dh0.data() + d * B * H, s_.cell == Cell::LSTM ? dc0.data() + d * B * H : nullptr,
                 dp.data() + d * 3 * H);
    }
    auto want = [&](size_t i) { return i < out.size() && out[i] && out[i]->numel() > 0; };
    if (want(0)) {
      T* o = out[0]->ptr<T>();
      if (s_.layout == 0) std::copy(dx.begin(), dx.end(), o);
      else
        for (int64_t b = 0; b < B; ++b)
          for (int64_t t = 0; t < S; ++t) std::copy_n(dx.begin() + (t * B + b) * I, I, o + (b * S + t) * I);
    }
    if (want(1)) std::copy(dw.begin(), dw.end(), out[1]->ptr<T>());
    if (want(2)) std::copy(dr.begin(), dr.end(), out[2]->ptr<T>());
    if (want(3)) std::copy(db.begin(), db.end(), out[3]->ptr<T>());
    if (want(5)) put_state(s_, dh0.data(), out[5]->ptr<T>());
    if (s_.cell == Cell::LSTM && want(6)) put_state(s_, dc0.data(), out[6]->ptr<T>());
    if (s_.cell == Cell::LSTM && want(7)) std::copy(dp.begin(), dp.end(), out[7]->ptr<T>());
  }

 private:
  Spec s_;
};

template <Cell C> std::unique_ptr<Kernel> make_grad(PrepareContext& ctx) {
  const size_t nf = C == Cell::LSTM ? 8 : 6, ng = C == Cell::LSTM ? 3 : 2;
  if (ctx.inputs.size() > nf + ng) ctx.fail("has too many inputs");
  if (ctx.outputs.size() > nf) ctx.fail("has too many outputs");
  const Spec s = make_spec(ctx, C, std::span<const KernelInput>(ctx.inputs).first(std::min(nf, ctx.inputs.size())));
  const DType t = ctx.inputs[0].dtype;
  const std::vector<int64_t> y = s.layout ? std::vector<int64_t>{s.B, s.S, s.D, s.H} : std::vector<int64_t>{s.S, s.D, s.B, s.H};
  for (size_t k = 0; k < ng; ++k) {
    const size_t i = nf + k;
    if (i >= ctx.inputs.size() || !ctx.inputs[i].present()) continue;
    const std::vector<int64_t> want = k == 0 ? y : state_shape(s);
    if (ctx.inputs[i].dtype != t || ctx.inputs[i].shape != want)
      ctx.fail("incoming gradient " + std::to_string(k) + " must have the forward output's dtype and shape");
  }
  for (size_t i = 0; i < ctx.outputs.size(); ++i) {
    if (i == 4 || i >= ctx.inputs.size() || !ctx.inputs[i].present()) cpu::set_output(ctx, i, t, {0});
    else cpu::set_output(ctx, i, t, ctx.inputs[i].shape);
  }
  if (t == DType::Float32) return std::make_unique<RecurrentGradKernel<float>>(s);
  if (t == DType::Float64) return std::make_unique<RecurrentGradKernel<double>>(s);
  cpu::fail_dtype(ctx, 0);
}

}  // namespace

void register_cpu_recurrent(KernelRegistry& r) {
  const std::vector<DType> flt = {DType::Float32, DType::Float64};
  for (const char* op : {"LSTM", "GRU", "RNN"}) {
    const Cell c = op[0] == 'L' ? Cell::LSTM : op[0] == 'G' ? Cell::GRU : Cell::RNN;
    const KernelFactory f = c == Cell::LSTM ? KernelFactory(make_forward<Cell::LSTM>)
                            : c == Cell::GRU ? KernelFactory(make_forward<Cell::GRU>)
                                             : KernelFactory(make_forward<Cell::RNN>);
    cpu::add(r, op, 7, flt, f);
    const KernelFactory g = c == Cell::LSTM ? KernelFactory(make_grad<Cell::LSTM>)
                            : c == Cell::GRU ? KernelFactory(make_grad<Cell::GRU>)
                                             : KernelFactory(make_grad<Cell::RNN>);
    cpu::add(r, "onnxtrain", std::string(op) + "Grad", 1, flt, g);
  }
}

}  // namespace onnxtrain
