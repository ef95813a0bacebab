// onnxtrain.Communicator and friends: data-parallel training from Python under mpirun (docs/distributed.md).
// The ranks are the job's MPI processes; TrainingSession(..., parallel=communicator) averages gradients over
// them, and DistributedSampler says which samples each rank reads.
#include <pybind11/stl.h>

#include "convert.h"
#include "distributed/mpi.h"
#include "training/sampler.h"

namespace onnxtrain::py_binding {

void bind_communicator(py::module_& m) {
  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator", R"(The ranks of a data-parallel job.

Get one from communicator_from_environment() (MPI under mpirun, this process alone otherwise) and pass it to
TrainingSession(..., parallel=...). Every rank must make the same calls in the same order.)")
      .def_property_readonly("rank", &Communicator::rank, "This process's rank, 0 .. size - 1.")
      .def_property_readonly("size", &Communicator::size, "Number of ranks.")
      .def_property_readonly("backend", &Communicator::backend, "'single', 'mpi' or 'nccl'.")
      .def("barrier", [](Communicator& c) {
             py::gil_scoped_release nogil;
             c.barrier();
           }, "Waits until every rank arrives (or the communicator's timeout passes: OnnxtrainError).")
      .def("allreduce", [](Communicator& c, double value, const std::string& op) {
             const ReduceOp o = reduce_op_from_name(op, "allreduce op");
             py::gil_scoped_release nogil;
             return c.allreduce(value, o);
           }, py::arg("value"), py::arg("op") = "mean", "The sum or mean of one number over the ranks (metrics).")
      .def("abort", [](Communicator& c, int code, const std::string& message) { c.abort(code, message); },
           py::arg("exit_code") = 1, py::arg("message") = "",
           "Ends the whole job now (every rank) after printing message: for a rank that fails while others wait.")
      .def("__repr__", [](Communicator& c) { return "<onnxtrain.Communicator " + c.describe() + ">"; });

  m.def("communicator_from_environment", [](double timeout) {
          MpiOptions o;
          o.timeout_seconds = timeout;
          return communicator_from_environment(o);
        }, py::arg("timeout") = 0.0,
        "MPI's world under mpirun (initialized on first use, finalized at exit), this process alone otherwise. "
        "timeout: seconds a collective waits for the other ranks (0: ONNXTRAIN_COMM_TIMEOUT, else 300).");
  m.def("launched_by_mpi", &launched_by_mpi, "True when an MPI launcher (mpirun, mpiexec) started this process.");

  py::class_<DistributedSampler>(m, "DistributedSampler", R"(One rank's share of each epoch's sample order.

DistributedSampler(n, rank, world_size, shuffle=True, seed=0, drop_last=False): every rank computes the same
permutation of range(n) for the epoch and takes positions rank, rank + world_size, ...; so batch k of b samples
on every rank together is the single process's batch k of world_size * b samples.)")
      .def(py::init([](int64_t n, int rank, int world, bool shuffle, uint64_t seed, bool drop_last) {
             SamplerOptions o;
             o.shuffle = shuffle;
             o.seed = seed;
             o.drop_last = drop_last;
             return DistributedSampler(n, rank, world, o);
           }), py::arg("n"), py::arg("rank") = 0, py::arg("world_size") = 1, py::arg("shuffle") = true,
           py::arg("seed") = 0, py::arg("drop_last") = false)
      .def("set_epoch", &DistributedSampler::set_epoch, py::arg("epoch"), "Selects the epoch's permutation.")
      .def_property_readonly("epoch", &DistributedSampler::epoch)
      .def_property_readonly("num_samples", &DistributedSampler::num_samples, "Samples per rank per epoch.")
      .def("indices", [](const DistributedSampler& s) {
             std::vector<int64_t> v = s.indices();
             return py::array_t<int64_t>(static_cast<py::ssize_t>(v.size()), v.data());
           }, "This rank's sample indices for the current epoch, in reading order (int64 array).");
}

}  // namespace onnxtrain::py_binding
