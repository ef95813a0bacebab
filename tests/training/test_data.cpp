// Data readers against files numpy writes, the sampler's order, and DataLoader batching.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <set>

#include "common/test_env.h"
#include "graph/error.h"
#include "training/data.h"
#include "training/npy.h"

namespace onnxtrain {
namespace {

void python(const std::string& code) {
  std::string cmd = test::python() + " -c '" + code + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST(DataFiles, NpyAndNpzFromNumpy) {
  auto d = test::temp_dir("data_npz");
  python("import numpy as np, os; os.chdir(\"" + d.string() + "\")\n"
         "a = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 8\n"
         "b = (np.arange(5) * 1000003).astype(np.int64) - 7\n"
         "c = np.array([True, False, True])\n"
         "i = np.arange(6, dtype=np.int32).reshape(3, 2) - 3\n"
         "np.save(\"a.npy\", a); np.save(\"b.npy\", b); np.save(\"c.npy\", c); np.save(\"f.npy\", np.asfortranarray(i))\n"
         "np.savez(\"s.npz\", a=a, b=b, i=i); np.savez_compressed(\"z.npz\", a=a, b=b, i=i)");
  Tensor a = read_npy(d / "a.npy");
  ASSERT_EQ(a.dtype, DType::Float32);
  ASSERT_EQ(a.shape, (std::vector<int64_t>{2, 3, 4}));
  for (int k = 0; k < 24; ++k) EXPECT_EQ(a.ptr<float>()[k], k / 8.0f);
  Tensor b = read_npy(d / "b.npy");
  ASSERT_EQ(b.dtype, DType::Int64);
  for (int k = 0; k < 5; ++k) EXPECT_EQ(b.ptr<int64_t>()[k], k * 1000003LL - 7);
  Tensor c = read_npy(d / "c.npy");
  ASSERT_EQ(c.dtype, DType::Bool);
  EXPECT_TRUE(c.ptr<bool>()[0] && !c.ptr<bool>()[1] && c.ptr<bool>()[2]);
  EXPECT_NE(test::error_of([&] { read_npy(d / "f.npy"); }).find("Fortran"), std::string::npos);
  for (const char* name : {"s.npz", "z.npz"}) {
    Dataset z = read_npz(d / name);
    ASSERT_EQ(z.size(), 3u) << name;
    EXPECT_EQ(std::memcmp(z.at("a").data, a.data, a.nbytes()), 0) << name;
    EXPECT_EQ(std::memcmp(z.at("b").data, b.data, b.nbytes()), 0) << name;
    ASSERT_EQ(z.at("i").dtype, DType::Int32);
    EXPECT_EQ(z.at("i").ptr<int32_t>()[5], 2);
  }
  // Our own writer reads back.
  write_npy(d / "w.npy", a);
  Tensor w = read_npy(d / "w.npy");
  EXPECT_EQ(std::memcmp(w.data, a.data, a.nbytes()), 0);
}

TEST(DataFiles, BadFilesNameTheFile) {
  auto d = test::temp_dir("data_bad");
  std::ofstream(d / "junk.npz") << "not a zip";
  std::ofstream(d / "junk.npy") << "not numpy";
  std::ofstream(d / "x.parquet") << "";
  EXPECT_NE(test::error_of([&] { read_npz(d / "junk.npz"); }).find("junk.npz: not a readable .npz"), std::string::npos);
  EXPECT_NE(test::error_of([&] { read_npy(d / "junk.npy"); }).find("junk.npy: not a .npy file"), std::string::npos);
  EXPECT_NE(test::error_of([&] { read_npy(d / "missing.npy"); }).find("missing.npy: cannot open"), std::string::npos);
  EXPECT_NE(test::error_of([&] { read_data_file(d / "x.parquet"); }).find("expected .npy, .npz or .csv"), std::string::npos);
  // Truncated payload.
  write_npy(d / "t.npy", Tensor::from_vector<float>({4}, {1, 2, 3, 4}));
  std::filesystem::resize_file(d / "t.npy", std::filesystem::file_size(d / "t.npy") - 4);
  EXPECT_NE(test::error_of([&] { read_npy(d / "t.npy"); }).find("truncated"), std::string::npos);
}

TEST(DataFiles, Csv) {
  auto d = test::temp_dir("data_csv");
  std::ofstream(d / "a.csv") << "x1, x2,label\n1.5,2,0\n\n-3e2,4,1\r\n";
  Dataset t = read_csv(d / "a.csv");
  ASSERT_EQ(t.size(), 3u);
  ASSERT_EQ(t.at("x2").shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(t.at("x1").ptr<double>()[1], -300.0);
  EXPECT_EQ(t.at("label").ptr<double>()[1], 1.0);
  std::ofstream(d / "b.csv") << "1;2\n3;4\n";
  Dataset n = read_csv(d / "b.csv", {';', false});
  EXPECT_EQ(n.at("1").ptr<double>()[1], 4.0);
  std::ofstream(d / "c.csv") << "a,b\n1,2\n3,oops\n";
  EXPECT_NE(test::error_of([&] { read_csv(d / "c.csv"); }).find("c.csv:3: column 'b': expected a number, found 'oops'"),
            std::string::npos);
  std::ofstream(d / "e.csv") << "a,b\n1,2,3\n";
  EXPECT_NE(test::error_of([&] { read_csv(d / "e.csv"); }).find("e.csv:2: expected 2 fields, found 3"), std::string::npos);
}

TEST(Sampler, ShuffleIsAPermutationFixedBySeedAndEpoch) {
  RandomSampler s(1000, true, 42), same(1000, true, 42), other(1000, true, 43);
  std::vector<int64_t> e0 = s.indices(0), e1 = s.indices(1);
  EXPECT_EQ(e0, same.indices(0));
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, other.indices(0));
  std::set<int64_t> all(e0.begin(), e0.end());
  EXPECT_EQ(all.size(), 1000u);
  EXPECT_EQ(*all.begin(), 0);
  EXPECT_EQ(*all.rbegin(), 999);
  // Roughly uniform: every position is as likely to hold any sample. The mean index in the first 100 positions
  // over 200 epochs is ~N(499.5, 29^2/200), so a biased shuffle (e.g. j in [0, i) only) shows up.
  double sum = 0;
  for (int e = 0; e < 200; ++e) {
    auto idx = s.indices(e);
    for (int i = 0; i < 100; ++i) sum += idx[i];
  }
  EXPECT_NEAR(sum / 20000, 499.5, 10);
  // Sharded (data-parallel ranks): the two ranks' shares interleave the same permutation.
  RandomSampler r0(1000, true, 42, 0, 2), r1(1000, true, 42, 1, 2);
  std::vector<int64_t> a = r0.indices(1), b = r1.indices(1);
  ASSERT_EQ(a.size(), 500u);
  for (size_t k = 0; k < 500; ++k) EXPECT_TRUE(a[k] == e1[2 * k] && b[k] == e1[2 * k + 1]) << k;
  std::vector<int64_t> seq = RandomSampler(5, false, 1).indices(3);
  EXPECT_EQ(seq, (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(DataLoaderTest, EveryRowOncePerEpochWithAPartialLastBatch) {
  std::vector<float> x(10 * 2);
  std::vector<int64_t> y(10);
  for (int i = 0; i < 10; ++i) x[2 * i] = float(i), x[2 * i + 1] = float(-i), y[i] = i * 10;
  DataLoader dl({{"x", Tensor::from_vector<float>({10, 2}, x)}, {"y", Tensor::from_vector<int64_t>({10}, y)}}, 4,
                std::make_shared<RandomSampler>(10, true, 7));
  ASSERT_EQ(dl.batches_per_epoch(), 3);
  for (int epoch = 0; epoch < 2; ++epoch) {
    dl.start_epoch(epoch);
    std::multiset<int64_t> seen;
    std::vector<int64_t> sizes;
    for (int64_t b = 0; b < dl.batches_per_epoch(); ++b) {
      const Feeds& f = dl.batch(b);
      const Tensor& bx = f.at("x");
      const Tensor& by = f.at("y");
      sizes.push_back(bx.shape[0]);
      ASSERT_EQ(by.shape[0], bx.shape[0]);
      for (int64_t r = 0; r < bx.shape[0]; ++r) {
        const float v = bx.ptr<float>()[2 * r];
        EXPECT_EQ(bx.ptr<float>()[2 * r + 1], -v);             // rows stay whole
        EXPECT_EQ(by.ptr<int64_t>()[r], int64_t(v) * 10);      // and aligned across arrays
        seen.insert(int64_t(v));
      }
    }
    EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2}));
    EXPECT_EQ(seen, (std::multiset<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  }
  DataLoader dropped({{"x", Tensor::from_vector<float>({10, 2}, x)}}, 4, nullptr, true);
  EXPECT_EQ(dropped.batches_per_epoch(), 2);
  std::string err;
  try {
    DataLoader bad({{"x", Tensor::from_vector<float>({10, 2}, x)}, {"y", Tensor::from_vector<int64_t>({3}, {1, 2, 3})}}, 4);
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("has 3 rows but 'x' has 10"), std::string::npos) << err;
}

TEST(DataConvert, BetweenNumericTypes) {
  Tensor d = convert(Tensor::from_vector<double>({3}, {1.75, -2.0, 3.0}), DType::Int64);
  EXPECT_EQ(d.ptr<int64_t>()[0], 1);
  EXPECT_EQ(d.ptr<int64_t>()[1], -2);
  Tensor f = convert(Tensor::from_vector<int64_t>({2}, {5, -6}), DType::Float32);
  EXPECT_EQ(f.ptr<float>()[1], -6.0f);
  Tensor s = slice_rows(Tensor::from_vector<float>({3, 2}, {0, 1, 2, 3, 4, 5}), 1, 3);
  EXPECT_EQ(s.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(s.ptr<float>()[0], 2.0f);
}

}  // namespace
}  // namespace onnxtrain
