// Data-parallel training of an MLP regressor: the same program runs alone or under mpirun.
//
//   mpirun -np 2 train_mlp_mpi MODEL.onnx [--epochs 5] [--batch 32] [--lr 0.01] [--samples 4096]
//                                         [--checkpoint PATH] [--timeout SECONDS]
//   (as root, OpenMPI also wants --allow-run-as-root; more ranks than cores need --oversubscribe)
//
// Every rank makes the same synthetic data set (examples/synthetic.h) and reads its own shard of each epoch
// through DistributedSampler; --batch is per rank, so the global batch is ranks x batch. The session averages
// the gradients across ranks before each Adam step; the loss it returns is already the mean over all ranks,
// so rank 0 alone prints it. Only rank 0 writes the checkpoint, which resumes in a single process.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "distributed/mpi.h"
#include "training/sampler.h"
#include "graph/error.h"
#include "training/session.h"
#include "synthetic.h"

using namespace onnxtrain;

namespace {

struct Args {
  std::string model, checkpoint;
  int epochs = 5, batch = 32, samples = 4096;
  double lr = 0.01, timeout = 0;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "train_mlp_mpi: %s\nusage: [mpirun -np N] train_mlp_mpi MODEL.onnx [--epochs N] [--batch B] "
                       "[--lr F] [--samples N] [--checkpoint PATH] [--timeout SECONDS]\n", why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + k).c_str());
      return argv[++i];
    };
    try {
      if (k == "--epochs") a.epochs = std::stoi(next());
      else if (k == "--batch") a.batch = std::stoi(next());
      else if (k == "--samples") a.samples = std::stoi(next());
      else if (k == "--lr") a.lr = std::stod(next());
      else if (k == "--timeout") a.timeout = std::stod(next());
      else if (k == "--checkpoint") a.checkpoint = next();
      else if (!k.empty() && k[0] == '-') usage(("unknown option " + k).c_str());
      else a.model = k;
    } catch (const std::logic_error&) {
      usage(("bad number for " + k).c_str());
    }
  }
  if (a.model.empty()) usage("no model given");
  if (a.epochs < 1 || a.batch < 1 || a.samples < 1 || !(a.lr > 0) || a.timeout < 0) usage("arguments must be positive");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  std::shared_ptr<Communicator> comm;
  try {
    // MPI under mpirun, a single process otherwise.
    comm = communicator_from_environment({a.timeout});
    TrainingConfig cfg;
    cfg.optimizer.kind = "adam";
    cfg.optimizer.learning_rate = a.lr;
    cfg.loss.kind = "mse";
    cfg.parallel.communicator = comm;
    TrainingSession s = TrainingSession::from_file(a.model, cfg);
    const ValueInfo in = s.export_inference().graph.inputs.at(0);
    if (!in.type.shape || in.type.shape->size() != 2 || !(*in.type.shape)[1].known())
      fail(a.model, "expected an input of shape [batch, features]");
    const std::string input = in.name;
    const int64_t features = (*in.type.shape)[1].value;
    auto [x, y] = examples::make_regression(a.samples, features);

    DistributedSampler sampler(a.samples, comm->rank(), comm->size(), SamplerOptions{true, 1, true});
    const int64_t steps = sampler.num_samples() / a.batch;
    if (steps == 0) fail("--batch", "larger than this rank's shard of " + std::to_string(sampler.num_samples()) + " samples");
    if (comm->rank() == 0)
      std::printf("%d rank(s) (%s), %lld steps per epoch of %d x %d samples\n", comm->size(), comm->backend().c_str(),
                  static_cast<long long>(steps), comm->size(), a.batch);
    Tensor bx = Tensor::empty(DType::Float32, {a.batch, features});
    Tensor by = Tensor::empty(DType::Float32, {a.batch, 1});
    for (int e = 1; e <= a.epochs; ++e) {
      sampler.set_epoch(e);
      const std::vector<int64_t> idx = sampler.indices();
      double sum = 0;
      for (int64_t k = 0; k < steps; ++k) {
        for (int64_t i = 0; i < a.batch; ++i) {
          const int64_t row = idx[k * a.batch + i];
          std::memcpy(bx.ptr<float>() + i * features, x.ptr<float>() + row * features, sizeof(float) * features);
          by.ptr<float>()[i] = y.ptr<float>()[row];
        }
        sum += s.train_step({{input, bx}, {s.target_name(), by}});
      }
      if (comm->rank() == 0) std::printf("epoch %2d  loss %.6f\n", e, sum / steps);
    }
    if (!a.checkpoint.empty()) {
      s.save_checkpoint(a.checkpoint);  // rank 0 writes; the others return at once
      if (comm->rank() == 0) std::printf("wrote checkpoint %s\n", a.checkpoint.c_str());
    }
  } catch (const Error& e) {
    // Ending the whole job spares the other ranks from waiting for their timeout.
    if (comm && comm->size() > 1) comm->abort(1, std::string("train_mlp_mpi: ") + e.what());
    std::fprintf(stderr, "train_mlp_mpi: %s\n", e.what());
    return 1;
  }
  return 0;
}
