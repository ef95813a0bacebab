#pragma once
// The MPI backend (host buffers), over Debian's OpenMPI or any MPI-3 library. Launch with
//   mpirun -np 2 your_program ...
// Collectives are MPI's non-blocking ones, polled against a deadline, so a rank that died or stopped
// answering turns into an Error on the others instead of a hang.
#include <memory>

#include "distributed/communicator.h"

namespace onnxtrain {

struct MpiOptions {
  // Seconds a collective waits for the other ranks; 0 = comm_timeout()'s default.
  double timeout_seconds = 0;
};

// True when this build has the MPI backend.
bool mpi_available();

// All ranks of the job (a duplicate of MPI_COMM_WORLD, so our error handling does not change the program's
// own MPI use). Initializes MPI on first use unless the program already did, and then finalizes it at exit;
// after a failed collective it ends the job at exit with MPI_Abort instead, since finalizing could wait on a
// dead rank.
std::shared_ptr<Communicator> mpi_world(MpiOptions options = {});

// True when this process was started by an MPI launcher (mpirun/mpiexec of OpenMPI, MPICH or a PMIx one).
bool launched_by_mpi();

// mpi_world() when launched by an MPI launcher, single_process_communicator() otherwise: what a program that
// works both ways (CLI, examples) asks for.
std::shared_ptr<Communicator> communicator_from_environment(MpiOptions options = {});

}  // namespace onnxtrain
