// MatMul (numpy semantics) and Gemm on the CPU. float32 goes through one oneDNN matmul primitive built at
// plan time for the concrete shapes: transposes are memory-descriptor strides, batch broadcasting is dims of
// 1, Gemm's alpha is an output scale and beta*C a sum post-op over C written into the output first. run()
// only swaps data handles and executes. float64 (and float32 shapes oneDNN refuses) use Eigen per batch.
// GCC 12 flags Eigen's AVX-512 packet code with false -Wmaybe-uninitialized warnings at instantiation.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#pragma GCC diagnostic pop
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstring>
#include <optional>
#include <array>

#include "executor/cpu/dnnl_context.h"
#include "executor/cpu/kernel_util.h"
#include "executor/kernel.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

using cpu::required_input;
using cpu::set_output;

using cpu::dnnl_engine;
using cpu::dnnl_stream;

// One (batched) product Y[b] = alpha * op(A)[b] · op(B)[b] + beta * C, all sizes fixed at plan time.
struct Geometry {
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;  // A stored [K, M] / B stored [N, K]
  std::vector<int64_t> out_batch;          // broadcast batch dims of Y
  std::vector<int64_t> a_batch, b_batch;   // batch dims of A and B, left-padded with 1 to out_batch's rank
  std::vector<int64_t> a_off, b_off;       // per output batch, element offset of the A and B matrices
  int64_t batch() const { return static_cast<int64_t>(a_off.size()); }
};

void fill_offsets(Geometry& g) {
  const size_t r = g.out_batch.size();
  int64_t total = 1;
  for (int64_t d : g.out_batch) total *= d;
  auto strides = [r](const std::vector<int64_t>& dims, int64_t mat) {
    std::vector<int64_t> s(r, 0);
    int64_t acc = mat;
    for (size_t i = r; i-- > 0;) {
      s[i] = dims[i] == 1 ? 0 : acc;  // a broadcast dim re-reads the same matrix
      acc *= dims[i];
    }
    return s;
  };
  const std::vector<int64_t> sa = strides(g.a_batch, g.M * g.K), sb = strides(g.b_batch, g.K * g.N);
  g.a_off.assign(static_cast<size_t>(total), 0);
  g.b_off.assign(static_cast<size_t>(total), 0);
  for (int64_t b = 0; b < total; ++b) {
    int64_t rem = b, oa = 0, ob = 0;
    for (size_t i = r; i-- > 0;) {
      const int64_t idx = rem % g.out_batch[i];
      rem /= g.out_batch[i];
      oa += idx * sa[i];
      ob += idx * sb[i];
    }
    g.a_off[static_cast<size_t>(b)] = oa;
    g.b_off[static_cast<size_t>(b)] = ob;
  }
}

// The oneDNN primitive with its memory objects; handles are swapped per run. The C argument array is built
// once: the C++ execute() copies its argument map into a fresh vector on every call.
struct DnnlMatmul {
  dnnl::matmul prim;
  dnnl::memory a, b, y;
  std::array<dnnl_exec_arg_t, 3> args;
};

std::optional<DnnlMatmul> build_dnnl(const Geometry& g, float alpha, float beta_sum) {
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const size_t nb = g.out_batch.size();
  if (nb + 2 > static_cast<size_t>(DNNL_MAX_NDIMS)) return std::nullopt;
  // Contiguous strides for the batch dims of an operand whose matrices hold `mat` elements.
  auto batch_strides = [nb](const std::vector<int64_t>& bd, int64_t mat) {
    dims s(nb);
    int64_t acc = mat;
    for (size_t i = nb; i-- > 0;) {
      s[i] = acc;
      acc *= bd[i];
    }
    return s;
  };
  dims a_dims(g.a_batch.begin(), g.a_batch.end()), b_dims(g.b_batch.begin(), g.b_batch.end());
  dims y_dims(g.out_batch.begin(), g.out_batch.end());
  dims a_str = batch_strides(g.a_batch, g.M * g.K), b_str = batch_strides(g.b_batch, g.K * g.N);
  dims y_str = batch_strides(g.out_batch, g.M * g.N);
  a_dims.insert(a_dims.end(), {g.M, g.K});
  b_dims.insert(b_dims.end(), {g.K, g.N});
  y_dims.insert(y_dims.end(), {g.M, g.N});
  if (g.trans_a) a_str.insert(a_str.end(), {1, g.M});
  else a_str.insert(a_str.end(), {g.K, 1});
  if (g.trans_b) b_str.insert(b_str.end(), {1, g.K});
  else b_str.insert(b_str.end(), {g.N, 1});
  y_str.insert(y_str.end(), {g.N, 1});
  try {
    dnnl::memory::desc a_md(a_dims, dt::f32, a_str), b_md(b_dims, dt::f32, b_str), y_md(y_dims, dt::f32, y_str);
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta_sum != 0.0f) {
      dnnl::post_ops po;
      po.append_sum(beta_sum);
      attr.set_post_ops(po);
    }
    dnnl::matmul::desc desc(a_md, b_md, y_md);
    dnnl::matmul::primitive_desc pd(desc, attr, dnnl_engine());
    DnnlMatmul m{dnnl::matmul(pd), dnnl::memory(a_md, dnnl_engine(), DNNL_MEMORY_NONE),
                 dnnl::memory(b_md, dnnl_engine(), DNNL_MEMORY_NONE),
                 dnnl::memory(y_md, dnnl_engine(), DNNL_MEMORY_NONE), {}};
    // DNNL_MEMORY_NONE leaves the handles null until run() sets them.
    m.args = {dnnl_exec_arg_t{DNNL_ARG_SRC, m.a.get()}, dnnl_exec_arg_t{DNNL_ARG_WEIGHTS, m.b.get()},
              dnnl_exec_arg_t{DNNL_ARG_DST, m.y.get()}};
    return m;
  } catch (const dnnl::error&) {
    return std::nullopt;  // an unsupported layout: the Eigen path computes the same thing
  }
}

constexpr int64_t kDnnlMinMacs = 32 * 32 * 32;

template <class T> using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T> class MatMulKernel final : public Kernel {
 public:
  MatMulKernel(Geometry g, T alpha, T beta, bool has_c, int64_t c_rs, int64_t c_cs)
      : g_(std::move(g)), alpha_(alpha), beta_(beta), has_c_(has_c && beta != T(0)), c_rs_(c_rs), c_cs_(c_cs) {
    if constexpr (std::is_same_v<T, float>) {
      // oneDNN wins on real products, but each execute() also builds an execution context on the heap
      // (about a microsecond): small products stay in Eigen, which needs neither.
      const int64_t macs = g_.batch() * g_.M * g_.N * g_.K;
      if (macs >= kDnnlMinMacs && g_.M > 0 && g_.N > 0 && g_.K > 0) dnnl_ = build_dnnl(g_, alpha, has_c_ ? beta : 0.0f);
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
        for (int64_t i = 0; i < g_.M; ++i)
          for (int64_t j = 0; j < g_.N; ++j) y[bi * mn + i * g_.N + j] = c[i * c_rs_ + j * c_cs_];
    }
    if (g_.K == 0) {
      // An empty sum: alpha * 0 + beta * C.
      for (int64_t i = 0; i < g_.batch() * mn; ++i) y[i] = has_c_ ? beta_ * y[i] : T(0);
      return;
    }
    if (dnnl_) {
      dnnl_->a.set_data_handle(const_cast<T*>(a));
      dnnl_->b.set_data_handle(const_cast<T*>(b));
      dnnl_->y.set_data_handle(y);
      dnnl::stream& s = dnnl_stream();
      if (dnnl_primitive_execute(dnnl_->prim.get(), s.get(), static_cast<int>(dnnl_->args.size()),
                                 dnnl_->args.data()) != dnnl_success)
        throw Error("oneDNN matmul failed for a [" + std::to_string(g_.M) + "," + std::to_string(g_.K) + "] x [" +
                    std::to_string(g_.K) + "," + std::to_string(g_.N) + "] product");
      s.wait();
      return;
    }
    for (int64_t bi = 0; bi < g_.batch(); ++bi) {
      const T* pa = a + g_.a_off[static_cast<size_t>(bi)];
      const T* pb = b + g_.b_off[static_cast<size_t>(bi)];
      Eigen::Map<RowMat<T>> ym(y + bi * mn, g_.M, g_.N);
      // A transposed operand is the plain row-major matrix it is stored as, transposed by Eigen.
      Eigen::Map<const RowMat<T>> am(pa, g_.trans_a ? g_.K : g_.M, g_.trans_a ? g_.M : g_.K);
      Eigen::Map<const RowMat<T>> bm(pb, g_.trans_b ? g_.N : g_.K, g_.trans_b ? g_.K : g_.N);
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
  }

  bool uses_dnnl() const { return dnnl_.has_value(); }

 private:
  Geometry g_;
  T alpha_, beta_;
  bool has_c_;
  int64_t c_rs_, c_cs_;
  std::optional<DnnlMatmul> dnnl_;
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
  const KernelInput& a = required_input(ctx, 0, "A");
  const KernelInput& b = required_input(ctx, 1, "B");
  if (a.dtype != b.dtype) ctx.fail("A is " + dtype_name(a.dtype) + " but B is " + dtype_name(b.dtype));
  if (a.shape.empty() || b.shape.empty()) ctx.fail("MatMul inputs must have rank >= 1");
  // numpy: a 1-D A is a row [1, K], a 1-D B a column [K, 1]; the added dim is dropped from the output.
  std::vector<int64_t> as = a.shape, bs = b.shape;
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  Geometry g;
  g.M = as[as.size() - 2];
  g.K = as.back();
  g.N = bs.back();
  if (bs[bs.size() - 2] != g.K)
    ctx.fail("inner dims differ: A " + shape_string(a.shape) + " and B " + shape_string(b.shape));
  const size_t ra = as.size() - 2, rb = bs.size() - 2, r = std::max(ra, rb);
  g.a_batch.assign(r, 1);
  g.b_batch.assign(r, 1);
  std::copy(as.begin(), as.end() - 2, g.a_batch.begin() + static_cast<ptrdiff_t>(r - ra));
  std::copy(bs.begin(), bs.end() - 2, g.b_batch.begin() + static_cast<ptrdiff_t>(r - rb));
  std::vector<int64_t> out;
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = g.a_batch[i], db = g.b_batch[i];
    if (da != db && da != 1 && db != 1)
      ctx.fail("batch dims of A " + shape_string(a.shape) + " and B " + shape_string(b.shape) + " do not broadcast");
    g.out_batch.push_back(da == 1 ? db : da);
  }
  out = g.out_batch;
  if (a.shape.size() > 1) out.push_back(g.M);
  if (b.shape.size() > 1) out.push_back(g.N);
  set_output(ctx, 0, a.dtype, out);
  fill_offsets(g);
  return make_kernel(ctx, a.dtype, std::move(g), 1.0, 0.0, false, 0, 0);
}

std::unique_ptr<Kernel> make_gemm(PrepareContext& ctx) {
  const KernelInput& a = required_input(ctx, 0, "A");
  const KernelInput& b = required_input(ctx, 1, "B");
  if (a.dtype != b.dtype) ctx.fail("A is " + dtype_name(a.dtype) + " but B is " + dtype_name(b.dtype));
  if (a.shape.size() != 2 || b.shape.size() != 2)
    ctx.fail("A and B must be 2-D, got " + shape_string(a.shape) + " and " + shape_string(b.shape));
  Geometry g;
  g.trans_a = ctx.node.attr_int("transA", 0) != 0;
  g.trans_b = ctx.node.attr_int("transB", 0) != 0;
  g.M = g.trans_a ? a.shape[1] : a.shape[0];
  g.K = g.trans_a ? a.shape[0] : a.shape[1];
  const int64_t kb = g.trans_b ? b.shape[1] : b.shape[0];
  g.N = g.trans_b ? b.shape[0] : b.shape[1];
  if (kb != g.K)
    ctx.fail("inner dims differ: A " + shape_string(a.shape) + (g.trans_a ? " (transposed)" : "") + " and B " +
             shape_string(b.shape) + (g.trans_b ? " (transposed)" : ""));
  const double alpha = ctx.node.attr_float("alpha", 1.0f);
  const double beta = ctx.node.attr_float("beta", 1.0f);
  const bool has_c = ctx.inputs.size() > 2 && ctx.inputs[2].present();
  int64_t c_rs = 0, c_cs = 0;
  if (has_c) {
    const KernelInput& c = ctx.inputs[2];
    if (c.dtype != a.dtype) ctx.fail("C is " + dtype_name(c.dtype) + " but A is " + dtype_name(a.dtype));
    // Unidirectional broadcast of C to [M, N]: a dim of 1 (or a missing one) is read with stride 0.
    if (c.shape.size() > 2) ctx.fail("C must have rank <= 2, got " + shape_string(c.shape));
    std::vector<int64_t> cs(2 - c.shape.size(), 1);
    cs.insert(cs.end(), c.shape.begin(), c.shape.end());
    if ((cs[0] != 1 && cs[0] != g.M) || (cs[1] != 1 && cs[1] != g.N))
      ctx.fail("C " + shape_string(c.shape) + " does not broadcast to [" + std::to_string(g.M) + "," +
               std::to_string(g.N) + "]");
    c_rs = cs[0] == 1 ? 0 : cs[1];
    c_cs = cs[1] == 1 ? 0 : 1;
  }
  g.out_batch = {};
  g.a_batch = {};
  g.b_batch = {};
  fill_offsets(g);
  set_output(ctx, 0, a.dtype, {g.M, g.N});
  return make_kernel(ctx, a.dtype, std::move(g), alpha, beta, has_c, c_rs, c_cs);
}

}  // namespace

void register_cpu_matmul(KernelRegistry& r) {
  const std::vector<DType> floats = {DType::Float32, DType::Float64};
  r.add({"", "MatMul", 1, 1 << 30, Device::CPU, floats, make_matmul});
  r.add({"", "Gemm", 1, 1 << 30, Device::CPU, floats, make_gemm});
}

}  // namespace onnxtrain
