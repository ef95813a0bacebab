// The NCCL backend needs a GPU per rank. Without one (this machine), the tests say so and skip; the backend
// still compiles wherever CUDA and NCCL are found, and its errors are checked here.
#include <gtest/gtest.h>

#include "distributed/mpi.h"
#include "distributed/nccl.h"
#include "graph/error.h"

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

}  // namespace
}  // namespace onnxtrain
