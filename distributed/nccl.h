#pragma once
// The NCCL backend (CUDA buffers). Built when CMake finds CUDA and NCCL; MPI (or any host communicator over
// the same ranks) bootstraps it: rank 0 creates NCCL's unique id and broadcasts it.
//
//   auto world = mpi_world();
//   auto gpu = nccl_communicator(world);   // one GPU per rank
#include <memory>

#include "distributed/communicator.h"

namespace onnxtrain {

struct NcclOptions {
  // CUDA device of this rank; -1 = the node-local rank (OMPI_COMM_WORLD_LOCAL_RANK, else the rank) modulo the
  // number of visible devices.
  int device = -1;
  // Seconds a collective may take before the communicator is aborted; 0 = comm_timeout()'s default.
  double timeout_seconds = 0;
};

// True when this build has the NCCL backend (it may still find no GPU at run time).
bool nccl_available();

// An NCCL communicator over bootstrap's ranks. Collectives run on its own CUDA stream and are waited for with
// the timeout; on a timeout or an asynchronous NCCL error the NCCL communicator is aborted and the call
// throws. Metric reductions (allreduce of a host double) and barriers go through bootstrap. Errors: built
// without NCCL, no CUDA device visible, NCCL failures (each names the call and NCCL's message).
std::shared_ptr<Communicator> nccl_communicator(std::shared_ptr<Communicator> bootstrap, NcclOptions options = {});

}  // namespace onnxtrain
