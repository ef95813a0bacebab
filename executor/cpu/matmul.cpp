// MatMul (numpy semantics) and Gemm on the CPU. Float32 products call a row-major sgemm taking alpha, beta and
// the transposes directly: our own (cpu/gemm.h), which allocates nothing per call, where the build has AVX-512,
// else oneDNN's dnnl_sgemm (a oneDNN primitive's execute() would build an execution context on the heap, 5
// operator new per call). The whole product in one call when the batch folds into the rows of A, else one call
// per matrix with the batch split across threads. Gemm's beta*C adds onto C broadcast into the output first.
// float64, narrow and tiny products use Eigen.
// GCC 12 flags Eigen's AVX-512 packet code with false -Wmaybe-uninitialized warnings at instantiation.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#pragma GCC diagnostic pop
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <type_traits>

#include "executor/cpu/gemm.h"
#include "executor/cpu/kernel_util.h"
#include "executor/cpu/matmul_operand.h"
#include "executor/kernel.h"
#include "executor/ops/matmul.h"
#include "executor/plan_fusion.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using cpu::Operand;
using cpu::operand;

using cpu::required_input;
using cpu::set_output;

// One (batched) product Y[b] = alpha * op(A)[b] · op(B)[b] + beta * C, all sizes fixed at plan time. A and B
// may be strided views and Y may be written in permuted order (Transposes folded in at plan time,
// executor/plan_fusion.h): each matrix of A and B row-major with row stride ld, or the transpose of one; each of
// Y row-major with row stride ldc.
struct Geometry {
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;  // A stored [K, M] / B stored [N, K]
  int64_t lda = 0, ldb = 0, ldc = 0;       // row stride of the stored matrices
  std::vector<int64_t> out_batch;          // broadcast batch dims of Y
  std::vector<int64_t> a_batch, b_batch;   // batch dims of A and B, left-padded with 1 to out_batch's rank
  std::vector<int64_t> a_bstride, b_bstride;  // element stride of A's and B's batch dims (same padding)
  std::vector<int64_t> y_bstride;          // element stride of Y's batch dims in the output buffer
  std::vector<int64_t> a_off, b_off, y_off;  // per output batch, element offset of the A, B and Y matrices
  int64_t batch() const { return static_cast<int64_t>(a_off.size()); }
};

// An operand as the product reads it: logical dims [..., rows, cols] and the element stride of each dim in
// its buffer.

// How sgemm and Eigen read a [rows, cols] matrix with these strides: (false, ld) row-major with row stride ld,
// (true, ld) the transpose of a row-major [cols, rows] matrix with row stride ld. Strides of size-1 dims are
// free, and ld is kept at least the stored row's length as sgemm requires.
std::optional<std::pair<bool, int64_t>> matrix_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if (cs == 1 || cols <= 1) return std::make_pair(false, rows <= 1 ? std::max<int64_t>(cols, 1) : rs);
  if (rs == 1 || rows <= 1) return std::make_pair(true, cols <= 1 ? std::max<int64_t>(rows, 1) : cs);
  return std::nullopt;
}

// Fills the layout of one operand (rows x cols are M x K for A, K x N for B) and its batch dims and strides,
// left-padded to rank r.
void set_operand(PrepareContext& ctx, const Operand& o, size_t r, bool& trans, int64_t& ld,
                 std::vector<int64_t>& batch, std::vector<int64_t>& bstride, const char* what) {
  const size_t n = o.dims.size();
  const auto layout = matrix_layout(o.dims[n - 2], o.dims[n - 1], o.strides[n - 2], o.strides[n - 1]);
  if (!layout) ctx.fail(std::string(what) + " is read with neither its rows nor its columns contiguous");
  trans = layout->first;
  ld = layout->second;
  batch.assign(r, 1);
  bstride.assign(r, 0);
  for (size_t i = 0; i + 2 < n; ++i) {
    batch[r - (n - 2) + i] = o.dims[i];
    bstride[r - (n - 2) + i] = o.strides[i];
  }
}

void fill_offsets(Geometry& g) {
  const size_t r = g.out_batch.size();
  int64_t total = 1;
  for (int64_t d : g.out_batch) total *= d;
  if (g.ldc == 0) g.ldc = std::max<int64_t>(g.N, 1);
  if (g.y_bstride.empty()) {
    // Y contiguous.
    g.y_bstride.assign(r, 0);
    int64_t acc = g.M * g.N;
    for (size_t i = r; i-- > 0;) {
      g.y_bstride[i] = acc;
      acc *= g.out_batch[i];
    }
  }
  g.a_off.assign(static_cast<size_t>(total), 0);
  g.b_off.assign(static_cast<size_t>(total), 0);
  g.y_off.assign(static_cast<size_t>(total), 0);
  for (int64_t b = 0; b < total; ++b) {
    int64_t rem = b, oa = 0, ob = 0, oy = 0;
    for (size_t i = r; i-- > 0;) {
      const int64_t idx = rem % g.out_batch[i];
      rem /= g.out_batch[i];
      // A broadcast dim (size 1) re-reads the same matrix.
      if (g.a_batch[i] != 1) oa += idx * g.a_bstride[i];
      if (g.b_batch[i] != 1) ob += idx * g.b_bstride[i];
      oy += idx * g.y_bstride[i];
    }
    g.a_off[static_cast<size_t>(b)] = oa;
    g.b_off[static_cast<size_t>(b)] = ob;
    g.y_off[static_cast<size_t>(b)] = oy;
  }
}

// A row-major Y = alpha * op(A) op(B) + beta * Y: onnxtrain's own GEMM where the CPU has AVX-512 (it allocates
// nothing per call; executor/cpu/gemm.h), else dnnl_sgemm.
struct Sgemm {
  char ta, tb;
  int64_t M, N, K, lda, ldb, ldc;
  bool own = cpu::own_sgemm_available();  // decided once, with the plan
  void run(float alpha, const float* a, const float* b, float beta, float* y) const {
    if (own)
      return cpu::own_sgemm(ta == 'T', tb == 'T', M, N, K, alpha, a, lda, b, ldb, beta, y, ldc);
    if (dnnl_sgemm(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, y, ldc) != dnnl_success)
      throw Error("oneDNN sgemm failed for a [" + std::to_string(M) + "," + std::to_string(K) + "] x [" +
                  std::to_string(K) + "," + std::to_string(N) + "] product");
  }
};
// One matrix of the batch, `rows` rows of A.
Sgemm matrix_sgemm(const Geometry& g, int64_t rows) {
  return {g.trans_a ? 'T' : 'N', g.trans_b ? 'T' : 'N', rows, g.N, g.K, g.lda, g.ldb, g.ldc};
}
// The whole product as one sgemm when the batch folds away: a single product, or every untransposed A matrix
// right after the previous one (rows of the same stride) and one B shared by all (a linear layer on
// [batch, tokens, features]).
std::optional<Sgemm> folded_sgemm(const Geometry& g) {
  if (g.batch() == 1) return matrix_sgemm(g, g.M);
  const bool b_shared = std::all_of(g.b_batch.begin(), g.b_batch.end(), [](int64_t d) { return d == 1; });
  if (!b_shared || g.trans_a) return std::nullopt;
  for (int64_t b = 0; b < g.batch(); ++b)
    if (g.a_off[static_cast<size_t>(b)] != b * g.M * g.lda || g.y_off[static_cast<size_t>(b)] != b * g.M * g.ldc)
      return std::nullopt;
  return matrix_sgemm(g, g.M * g.batch());
}

// Below these sizes a product stays in Eigen, which allocates nothing for small blocks: sgemm mallocs a
// workspace per call, which costs more than it saves on tiny products (W4's batch-1 layers), and per matrix of
// a batch it would be one malloc per attention head (W3: ~1000 per step).
constexpr int64_t kSgemmMinMacs = 32 * 32 * 32;
constexpr int64_t kSgemmMinMacsPerMatrix = int64_t{1} << 18;
// Our own GEMM allocates nothing and is 1.4-1.8x Eigen's speed already at W3's attention heads ([64, 32] x
// [32, 64] and the like; bench_gemm), so it takes every product from 16^3 multiply-adds. Fewer than 8 columns
// (W1's last layer, N = 1) would waste most of each vector: Eigen's matrix-vector product is faster there.
constexpr int64_t kOwnSgemmMinMacs = 16 * 16 * 16;
constexpr int64_t kOwnSgemmMinN = 8;

// Products below this many multiply-adds (about 80 µs on one core) run on the calling thread alone. Two threads
// save little there, and on a loaded machine a parallel region waits for a descheduled worker for a whole
// time slice: a 2-thread digits-sized MLP step went from 1 ms to 40-200 ms that way. dnnl_sgemm and Eigen's
// GEMM both size their thread teams from omp_get_max_threads() at the call, so lowering it around the call
// is enough (it is a per-thread setting; nothing else runs on this thread meanwhile).
constexpr int64_t kSerialMacs = int64_t{1} << 21;

class SerialScope {
 public:
  explicit SerialScope(bool serial) : saved_(serial ? omp_get_max_threads() : 1) {
    if (saved_ > 1) omp_set_num_threads(1);
  }
  ~SerialScope() {
    if (saved_ > 1) omp_set_num_threads(saved_);
  }
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;

 private:
  int saved_;
};

template <class T> using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T> class MatMulKernel final : public Kernel {
 public:
  MatMulKernel(Geometry g, T alpha, T beta, bool has_c, int64_t c_rs, int64_t c_cs)
      : g_(std::move(g)), alpha_(alpha), beta_(beta), has_c_(has_c && beta != T(0)), c_rs_(c_rs), c_cs_(c_cs) {
    const int64_t macs = g_.M * g_.N * g_.K;
    serial_ = g_.batch() * macs < kSerialMacs;
    if constexpr (std::is_same_v<T, float>) {
      const bool own = cpu::own_sgemm_available();
      if (!own || g_.N >= kOwnSgemmMinN) {
        if (g_.batch() * macs >= (own ? kOwnSgemmMinMacs : kSgemmMinMacs)) folded_ = folded_sgemm(g_);
        if (!folded_ && macs >= (own ? kOwnSgemmMinMacs : kSgemmMinMacsPerMatrix))
          per_matrix_ = matrix_sgemm(g_, g_.M);
      }
    }
  }

  void run(std::span<const Tensor* const> in, std::span<Tensor* const> out) override {
    const T* a = in[0]->ptr<T>();
    const T* b = in[1]->ptr<T>();
    T* y = out[0]->ptr<T>();
    const int64_t mn = g_.M * g_.N;
    if (mn == 0 || g_.batch() == 0) return;
    if (has_c_) {
      // Y starts as C broadcast to [M, N]; the product then adds onto beta * Y.
      const T* c = in[2]->ptr<T>();
      for (int64_t bi = 0; bi < g_.batch(); ++bi)
        for (int64_t i = 0; i < g_.M; ++i) {
          T* row = y + g_.y_off[static_cast<size_t>(bi)] + i * g_.ldc;
          const T* crow = c + i * c_rs_;
          // A row of C (the usual bias) is copied, a single value per row filled.
          if (c_cs_ == 1) std::copy(crow, crow + g_.N, row);
          else std::fill(row, row + g_.N, crow[0]);  // c_cs_ is 0 or 1 (the Gemm factory below)
        }
    }
    if (g_.K == 0) {
      // An empty sum: alpha * 0 + beta * C.
      for (int64_t bi = 0; bi < g_.batch(); ++bi)
        for (int64_t i = 0; i < g_.M; ++i)
          for (int64_t j = 0; j < g_.N; ++j) {
            T& v = y[g_.y_off[static_cast<size_t>(bi)] + i * g_.ldc + j];
            v = has_c_ ? beta_ * v : T(0);
          }
      return;
    }
    const SerialScope serial(serial_);
    if constexpr (std::is_same_v<T, float>)
      if (folded_) return folded_->run(alpha_, a, b, has_c_ ? beta_ : 0.0f, y);
    // Otherwise one product per matrix, the batch split across threads (inside the parallel region oneDNN and
    // Eigen stay on their thread). oneDNN's batched matmul primitive would do this in one call, but every
    // execute() builds an execution context with 5 operator new.
    cpu::parallel_for(g_.batch(), !serial_ && g_.batch() > 1, [&](int64_t bi) {
      product(a + g_.a_off[static_cast<size_t>(bi)], b + g_.b_off[static_cast<size_t>(bi)], y + g_.y_off[static_cast<size_t>(bi)]);
    });
  }

 private:
  void product(const T* pa, const T* pb, T* py) const {
    if constexpr (std::is_same_v<T, float>)
      if (per_matrix_) return per_matrix_->run(alpha_, pa, pb, has_c_ ? beta_ : 0.0f, py);
    Eigen::Map<RowMat<T>, 0, Eigen::OuterStride<>> ym(py, g_.M, g_.N, Eigen::OuterStride<>(g_.ldc));
    // A transposed operand is the plain row-major matrix it is stored as, transposed by Eigen.
    using Strided = Eigen::Map<const RowMat<T>, 0, Eigen::OuterStride<>>;
    Strided am(pa, g_.trans_a ? g_.K : g_.M, g_.trans_a ? g_.M : g_.K, Eigen::OuterStride<>(g_.lda));
    Strided bm(pb, g_.trans_b ? g_.N : g_.K, g_.trans_b ? g_.K : g_.N, Eigen::OuterStride<>(g_.ldb));
    if (has_c_) ym *= beta_;
    else ym.setZero();
    // Eigen folds alpha into the left operand, and its matrix-vector path then copies that scaled operand
    // into a heap temporary on every call (batch-1 steps); without a scale it reads the maps directly.
    auto add = [&](const auto& lhs, const auto& rhs) {
      if (alpha_ == T(1)) ym.noalias() += lhs * rhs;
      else ym.noalias() += alpha_ * (lhs * rhs);
    };
    if (!g_.trans_a && !g_.trans_b) add(am, bm);
    else if (g_.trans_a && !g_.trans_b) add(am.transpose(), bm);
    else if (!g_.trans_a && g_.trans_b) add(am, bm.transpose());
    else add(am.transpose(), bm.transpose());
  }

  Geometry g_;
  T alpha_, beta_;
  bool has_c_;
  int64_t c_rs_, c_cs_;
  bool serial_ = true;
  std::optional<Sgemm> folded_, per_matrix_;  // float32 only
};

std::unique_ptr<Kernel> make_kernel(PrepareContext& ctx, DType t, Geometry g, double alpha, double beta, bool has_c,
                                    int64_t c_rs, int64_t c_cs) {
  if (t == DType::Float32)
    return std::make_unique<MatMulKernel<float>>(std::move(g), static_cast<float>(alpha), static_cast<float>(beta),
                                                 has_c, c_rs, c_cs);
  if (t == DType::Float64) return std::make_unique<MatMulKernel<double>>(std::move(g), alpha, beta, has_c, c_rs, c_cs);
  ctx.fail("type " + dtype_name(t) + " is not supported (float32 and float64 are)");
}

std::unique_ptr<Kernel> make_matmul(PrepareContext& ctx) {
  // The op layer checks the product on the operands as read (folded Transposes applied) and sets Y; what is left
  // here is how the CPU reads and writes them.
  cpu::MatMulOperands mo = cpu::matmul_operands(ctx);
  Operand& oa = mo.a;
  Operand& ob = mo.b;
  // A 1-D A is read as a row [1, K], a 1-D B as a column [K, 1].
  if (oa.dims.size() == 1) {
    oa.dims.insert(oa.dims.begin(), 1);
    oa.strides.insert(oa.strides.begin(), oa.dims.back());
  }
  if (ob.dims.size() == 1) {
    ob.dims.push_back(1);
    ob.strides.push_back(1);
  }
  Geometry g;
  g.M = mo.g.M;
  g.K = mo.g.K;
  g.N = mo.g.N;
  const size_t r = mo.g.out_batch.size();
  set_operand(ctx, oa, r, g.trans_a, g.lda, g.a_batch, g.a_bstride, "A");
  set_operand(ctx, ob, r, g.trans_b, g.ldb, g.b_batch, g.b_bstride, "B");
  g.out_batch = mo.g.out_batch;
  // Y written as Transpose(Y, perm): Y's row and batch strides in the permuted buffer. The perm keeps Y's last dim
  // last, so each row of a matrix stays contiguous.
  if (std::optional<cpu::OutputLayout> y = cpu::permuted_output(ctx, mo.g, ctx.outputs[0].shape)) {
    const size_t n = y->strides.size();
    g.ldc = g.M <= 1 ? std::max<int64_t>(g.N, 1) : y->strides[n - 2];
    g.y_bstride.assign(y->strides.begin(), y->strides.end() - 2);
    set_output(ctx, 0, ctx.outputs[0].dtype, std::move(y->shape));
  }
  fill_offsets(g);
  return make_kernel(ctx, ctx.inputs[0].dtype, std::move(g), 1.0, 0.0, false, 0, 0);
}

std::unique_ptr<Kernel> make_gemm(PrepareContext& ctx) {
  const ops::GemmGeometry gg = ops::prepare_gemm(ctx);
  Geometry g;
  g.trans_a = gg.trans_a;
  g.trans_b = gg.trans_b;
  g.M = gg.M;
  g.K = gg.K;
  g.N = gg.N;
  // C broadcast to [M, N]: a dim of 1 is read with stride 0.
  int64_t c_rs = 0, c_cs = 0;
  if (gg.has_c) {
    c_rs = gg.c_shape[0] == 1 ? 0 : gg.c_shape[1];
    c_cs = gg.c_shape[1] == 1 ? 0 : 1;
  }
  // The stored matrices are contiguous: A is [M, K] (or [K, M] when transA), B [K, N] (or [N, K]).
  g.lda = g.trans_a ? g.M : g.K;
  g.ldb = g.trans_b ? g.K : g.N;
  g.lda = std::max<int64_t>(g.lda, 1);
  g.ldb = std::max<int64_t>(g.ldb, 1);
  fill_offsets(g);
  return make_kernel(ctx, ctx.inputs[0].dtype, std::move(g), gg.alpha, gg.beta, gg.has_c, c_rs, c_cs);
}

}  // namespace

void register_cpu_matmul(KernelRegistry& r) {
  const std::vector<DType> floats = {DType::Float32, DType::Float64};
  r.add({"", "MatMul", 1, 1 << 30, Device::CPU, floats, make_matmul});
  r.add({"", "Gemm", 1, 1 << 30, Device::CPU, floats, make_gemm});
}

namespace cpu {

Operand operand(PrepareContext& ctx, const KernelInput& x, const char* attr, const char* what) {
  Operand o{x.shape, contiguous_strides(x.shape)};
  if (!ctx.node.has_attr(attr)) return o;
  const std::vector<int64_t> perm = ctx.node.attr_ints(attr);
  std::vector<bool> seen(x.shape.size(), false);
  bool ok = perm.size() == x.shape.size() && perm.size() >= 2;
  for (int64_t p : perm) {
    ok = ok && p >= 0 && p < static_cast<int64_t>(perm.size()) && !seen[static_cast<size_t>(p)];
    if (ok) seen[static_cast<size_t>(p)] = true;
  }
  if (!ok)
    ctx.fail(std::string(attr) + " " + shape_string(perm) + " is not a permutation of " + what + " " +
             shape_string(x.shape));
  const std::vector<int64_t> in_strides = contiguous_strides(x.shape);
  for (size_t k = 0; k < perm.size(); ++k) {
    o.dims[k] = x.shape[static_cast<size_t>(perm[k])];
    o.strides[k] = in_strides[static_cast<size_t>(perm[k])];
  }
  return o;
}

MatMulOperands matmul_operands(PrepareContext& ctx) {
  const KernelInput& a = required_input(ctx, 0, "A");
  const KernelInput& b = required_input(ctx, 1, "B");
  MatMulOperands m{operand(ctx, a, kMatMulPermA, "A"), operand(ctx, b, kMatMulPermB, "B"), {}};
  m.g = ops::prepare_matmul(ctx, m.a.dims, m.b.dims);
  return m;
}

std::optional<OutputLayout> permuted_output(PrepareContext& ctx, const ops::MatMulGeometry& g,
                                            const std::vector<int64_t>& y) {
  if (!ctx.node.has_attr(kMatMulPermY)) return std::nullopt;
  const std::vector<int64_t> perm = ctx.node.attr_ints(kMatMulPermY);
  const size_t r = y.size();
  std::vector<bool> seen(r, false);
  bool ok = !g.a_vector && !g.b_vector && perm.size() == r && r >= 2 && perm[r - 1] == static_cast<int64_t>(r) - 1;
  for (size_t k = 0; ok && k < r; ++k) {
    ok = perm[k] >= 0 && perm[k] < static_cast<int64_t>(r) && !seen[static_cast<size_t>(perm[k])];
    if (ok) seen[static_cast<size_t>(perm[k])] = true;
  }
  if (!ok)
    ctx.fail(std::string(kMatMulPermY) + " " + shape_string(perm) +
             " must permute the output's dims and keep its last dim last; the output is " + shape_string(y));
  OutputLayout l{std::vector<int64_t>(r), std::vector<int64_t>(r)};
  for (size_t k = 0; k < r; ++k) l.shape[k] = y[static_cast<size_t>(perm[k])];
  const std::vector<int64_t> os = contiguous_strides(l.shape);
  for (size_t k = 0; k < r; ++k) l.strides[static_cast<size_t>(perm[k])] = os[k];
  return l;
}

}  // namespace cpu

}  // namespace onnxtrain
