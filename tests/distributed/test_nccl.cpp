// The NCCL backend needs a GPU per rank. Without one (this machine), the tests say so and skip; the backend
// still compiles wherever CUDA and NCCL are found, and its errors are checked here.
#include <gtest/gtest.h>

#include <cstring>

#include "common/mlp_model.h"
#include "distributed/mpi.h"
#include "distributed/nccl.h"
#include "graph/error.h"
#include "training/session.h"

namespace onnxtrain {
bool cuda_available();  // executor/cuda
namespace {

TEST(Nccl, BackendOrClearError) {
  if (!nccl_available()) {
    try {
      nccl_communicator(single_process_communicator());
      FAIL() << "a build without NCCL must refuse";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("built without NCCL"), std::string::npos) << e.what();
    }
    GTEST_SKIP() << "built without NCCL: only its error is checked";
  }
  if (!cuda_available()) {
    try {
      nccl_communicator(single_process_communicator());
      FAIL() << "no GPU: must refuse";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no CUDA device is visible"), std::string::npos) << e.what();
    }
    GTEST_SKIP() << "no CUDA device visible: the NCCL backend is compiled but not exercised on this machine";
  }
  // One GPU, one rank: NCCL with a world of 1 still runs real kernels.
  auto c = nccl_communicator(single_process_communicator());
  EXPECT_EQ(c->size(), 1);
  Tensor t = Tensor::empty(DType::Float32, {1024}, Device::CUDA);
  c->allreduce(t.data, 1024, DType::Float32, ReduceOp::Mean);
  c->broadcast(t, 0);
  c->barrier();
  EXPECT_FALSE(c->broken());
}

// A data-parallel session over NCCL with a world of one on cuda:0: the AllReduce kernel runs on device buffers
// and the rank-0 broadcast of the initial state goes through NCCL, and the steps equal a plain cuda:0 session's
// (a mean over one rank changes nothing).
TEST(Nccl, DataParallelSessionOfOneEqualsThePlainSession) {
  if (!nccl_available() || !cuda_available()) GTEST_SKIP() << "needs NCCL and a CUDA device";
  const Model m = test::relu_mlp<float>("mlp", 4, 16, 5, 0.3f, test::Fc2::Gemm);
  TrainingConfig c;
  c.device = "cuda:0";
  c.optimizer.kind = "adam";
  c.optimizer.learning_rate = 0.01;
  TrainingSession plain(m, c);
  c.parallel.communicator = nccl_communicator(single_process_communicator());
  TrainingSession dp(m, c);
  Tensor x = Tensor::empty(DType::Float32, {8, 4}), y = Tensor::empty(DType::Float32, {8, 1});
  for (int i = 0; i < 32; ++i) x.ptr<float>()[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  for (int i = 0; i < 8; ++i) y.ptr<float>()[i] = 0.05f * static_cast<float>(i);
  const Feeds f{{"x", x}, {plain.target_name(), y}};
  for (int step = 0; step < 3; ++step) EXPECT_EQ(dp.train_step(f), plain.train_step(f)) << "step " << step;
  for (const auto& [name, w] : plain.weights()) {
    const Tensor o = dp.get_weight(name);
    EXPECT_EQ(std::memcmp(w.data, o.data, w.nbytes()), 0) << name;
  }
}

}  // namespace
}  // namespace onnxtrain
