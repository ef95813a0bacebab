// The guarded test device (executor/guarded.h): its memory faults when host code touches it outside kernels
// and copies, and a plan on it computes what the CPU plan computes.
#include <gtest/gtest.h>

#include <cstring>

#include "common/test_env.h"
#include "executor/device.h"
#include "executor/executor.h"
#include "executor/guarded.h"
#include "executor/transfer.h"
#include "graph/builder.h"

namespace onnxtrain {
namespace {

TEST(GuardedDevice, HostAccessFaultsOutsideKernelsAndCopies) {
  Tensor t = Tensor::empty(DType::Float32, {4}, Device::Guarded);
  EXPECT_FALSE(guarded_memory_open());
  EXPECT_DEATH(
      {
        volatile float v = t.ptr<float>()[0];
        (void)v;
      },
      "");
  EXPECT_DEATH({ t.ptr<float>()[1] = 1.0f; }, "");
  {
    KernelScope kernels(Device::Guarded);
    EXPECT_TRUE(guarded_memory_open());
    t.ptr<float>()[2] = 2.5f;  // kernels may
    KernelScope nested(Device::Guarded);
  }
  EXPECT_FALSE(guarded_memory_open());
  float back = 0;
  copy_bytes(&back, Device::CPU, t.ptr<float>() + 2, Device::Guarded, sizeof(float));
  EXPECT_EQ(back, 2.5f);
  EXPECT_FALSE(guarded_memory_open());
  // The copy opened only its buffer, and closed it again.
  EXPECT_DEATH(
      {
        volatile float v = t.ptr<float>()[2];
        (void)v;
      },
      "");
}

TEST(GuardedDevice, BuffersAreZeroedAndFreed) {
  const size_t before = guarded_buffers();
  {
    Tensor t = Tensor::empty(DType::Int64, {3}, Device::Guarded);
    EXPECT_EQ(guarded_buffers(), before + 1);
    EXPECT_EQ(read_scalar<int64_t>(Tensor::view(DType::Int64, {1}, t.data, Device::Guarded), "t[0]"), 0);
    Tensor h = t.to(Device::CPU);
    EXPECT_EQ(h.device, Device::CPU);
    EXPECT_EQ(h.ptr<int64_t>()[2], 0);
  }
  EXPECT_EQ(guarded_buffers(), before);
}

TEST(GuardedDevice, ScalarsAndCopiesCrossTheEdge) {
  Tensor lr = Tensor::empty(DType::Float64, {}, Device::Guarded);
  write_scalar<double>(lr, 0.25, "lr");
  EXPECT_EQ(read_scalar<double>(lr, "lr"), 0.25);
  EXPECT_NE(std::string(test::error_of([&] { read_scalar<float>(lr, "lr"); })).find("lr: expected a float32 scalar"),
            std::string::npos);
  Tensor src = Tensor::from_vector<float>({3}, {1, 2, 3});
  Tensor dst = Tensor::empty(DType::Float32, {3}, Device::Guarded);
  copy_into(dst, src, "w");
  Tensor wrong = Tensor::empty(DType::Float32, {2});
  EXPECT_NE(std::string(test::error_of([&] { copy_into(dst, wrong, "weight 'w'"); })).find("weight 'w': expected float32[3], got float32[2]"),
            std::string::npos);
  EXPECT_EQ(dst.to(Device::CPU).ptr<float>()[2], 3.0f);
}

TEST(GuardedDevice, PlanMatchesTheCpuAndTakesHostFeeds) {
  Graph g;
  GraphBuilder b(g);
  b.add_input("x", TypeInfo{DType::Float32, Shape{Dim::of(2), Dim::of(3)}});
  g.initializers["w"] = TensorData::from<float>({3, 2}, std::vector<float>{1, 2, 3, 4, 5, 6});
  const std::string m = b.add("MatMul", {"x", "w"});
  b.add_node("Relu", {m}, 1, {}, {}, {"y"});
  b.add_output("y", TypeInfo{DType::Float32, Shape{Dim::of(2), Dim::of(2)}});
  Tensor x = Tensor::from_vector<float>({2, 3}, {1, -1, 2, -3, 0, 1});
  std::vector<Tensor> want = Executor(g, {{"", 17}}, std::make_shared<TensorStore>()).run({{"x", x}});
  ExecutorOptions eo;
  eo.device = Device::Guarded;
  auto store = std::make_shared<TensorStore>();
  Executor ex(g, {{"", 17}}, store, eo);
  EXPECT_EQ(store->at("w").device, Device::Guarded);
  // The span overload with a host feed: staged onto the device, results on the device.
  const Tensor* feeds[] = {&x};
  std::span<const Tensor* const> out = ex.run(feeds);
  ASSERT_EQ(out[0]->device, Device::Guarded);
  Tensor got = out[0]->to(Device::CPU);
  ASSERT_EQ(got.describe(), want[0].describe());
  EXPECT_EQ(std::memcmp(got.data, want[0].data, got.nbytes()), 0);
  // The map overload returns host copies.
  std::vector<Tensor> again = ex.run({{"x", x}});
  EXPECT_EQ(again[0].device, Device::CPU);
  EXPECT_EQ(std::memcmp(again[0].data, want[0].data, got.nbytes()), 0);
}

TEST(GuardedDevice, ParsedByName) {
  EXPECT_EQ(parse_device("guarded"), Device::Guarded);
  EXPECT_EQ(device_name(Device::Guarded), "guarded");
}

}  // namespace
}  // namespace onnxtrain
