#pragma once
// Helpers for the kernel-level tests: build a node by hand, bind its kernel through default_kernels() as a
// plan would, and run it. Nothing here shares code with the kernels, so the references stay independent.
#include <gtest/gtest.h>
#include <omp.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "executor/kernel.h"

namespace onnxtrain::test {

// A node named "n_<op>" with inputs x0.. and outputs y0.. (names the kernels' errors quote).
Node make_node(const std::string& op, size_t n_in, std::map<std::string, Attribute> attrs = {},
               const std::string& domain = "", size_t n_out = 1);

// Binds the registered kernel for the node and runs it; nullptr inputs are absent optionals, inputs listed in
// `known` are plan-time values (axes, shapes). Fresh float outputs are poisoned with NaN so elements a kernel
// leaves unwritten fail. When out_alias is given, output 0 is written into it instead of a fresh tensor.
std::vector<Tensor> run_kernel(const Node& node, int64_t opset, std::vector<const Tensor*> ins,
                               const std::vector<size_t>& known = {}, Tensor* out_alias = nullptr);
// The same with tensors by value; an undefined tensor marks an absent optional input.
std::vector<Tensor> run_node(const Node& node, int64_t opset, const std::vector<Tensor>& inputs,
                             const std::vector<size_t>& known = {});
// Output 0 of a node, for each form. Not overloads: {&a, &b} would also match vector<Tensor>'s iterator-pair
// constructor.
Tensor run1(const Node& node, int64_t opset, std::vector<const Tensor*> ins);
Tensor run_single(const Node& node, int64_t opset, const std::vector<Tensor>& inputs,
                  const std::vector<size_t>& known = {});

// Uniform in [lo, hi), reproducible from the seed.
template <class T> Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed, double lo, double hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  Tensor t = Tensor::empty(dtype_of<T>(), std::move(shape));
  for (T& v : t.span<T>()) v = static_cast<T>(d(rng));
  return t;
}

// A tensor of dtype T holding `v` (hand-worked values), row-major.
template <class T> Tensor tensor(std::vector<int64_t> shape, const std::vector<double>& v) {
  Tensor t = Tensor::empty(dtype_of<T>(), std::move(shape));
  for (size_t i = 0; i < v.size(); ++i) t.span<T>()[i] = static_cast<T>(v[i]);
  return t;
}

// Every element of `got` within `tol` of `want`, naming the first index that is not.
template <class T> void expect_values(const Tensor& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(static_cast<double>(got.span<T>()[i]), want[i], tol) << i;
}

// A test parameterised by the OpenMP thread count: runs on GetParam() threads and restores the count after.
// A derived SetUp that skips does so before calling this one, so TearDown has nothing to restore.
class ThreadsTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    saved_ = omp_get_max_threads();
    omp_set_num_threads(GetParam());
  }
  void TearDown() override {
    if (saved_) omp_set_num_threads(saved_);
  }

 private:
  int saved_ = 0;
};

// "1_threads", "2_threads": the instantiations' names.
inline std::string threads_name(const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param) + "_threads"; }

// Row-major multi-index of flat index i, and back; the references loop over coordinates with these.
std::vector<int64_t> unravel(int64_t i, const std::vector<int64_t>& shape);
int64_t ravel(const std::vector<int64_t>& idx, const std::vector<int64_t>& shape);

}  // namespace onnxtrain::test
