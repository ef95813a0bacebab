#pragma once
// TrainingConfig: what a training session trains and how (loss, optimizer, schedule, device, parallelism, the
// guards). Every session kind (training/session_interface.h) is built from one; the option schema that the CLI,
// Python and checkpoints read is training/config_schema.h.
#include <string>
#include <vector>

#include "executor/device.h"
#include "losses/loss.h"
#include "losses/penalty.h"
#include "optimizers/optimizer.h"
#include "optimizers/schedule.h"
#include "training/adapters.h"
#include "training/data_parallel.h"
#include "training/mixed_precision.h"
#include "training/recompute.h"

namespace onnxtrain {

struct TrainingConfig {
  std::vector<std::string> trainable;  // initializer names; empty = every floating-point initializer
  // Graph inputs whose gradients run_backward also returns (floating-point inputs of the model).
  std::vector<std::string> inputs_requiring_grad;
  std::string prediction;              // the model output the loss reads; empty = the first output
  LossSpec loss;
  // L1/L2 on every trainable weight, added to the loss (so train_step and gradients() report loss + penalty).
  PenaltySpec penalty;
  OptimizerSpec optimizer;
  // The learning rate per optimizer step, written into "optim.lr" before each update. "constant" (the
  // default) leaves the rate alone, so set_learning_rate() keeps working; any other kind overrides it.
  ScheduleSpec schedule;
  // Where the session runs: "cpu", "cuda" or "cuda:N" (or "guarded", the test device), read by parse_device()
  // (executor/device.h) when the session is built; a CUDA name fails there, saying whether CUDA is not compiled
  // in or no device is visible. Defaults to $ONNXTRAIN_DEVICE, else "cpu" (default_device_name()).
  std::string device = default_device_name();
  // Data-parallel training (docs/distributed.md): with a communicator of more than one rank, rank 0's weights
  // and optimizer state are broadcast at construction, and each step averages the gradients (summed for
  // loss.reduction "sum") and the loss across ranks before the optimizer. Every rank must then call
  // train_step with its own shard of the batch at the same time. Not stored in checkpoints.
  DataParallelSpec parallel;
  // Numerical guard (docs/reliability.md): a NaN or Inf in the loss or a gradient is found on the step it
  // appears and that step's update is never applied. "raise": train_step throws NonFiniteError naming the step
  // and the tensor; "skip": train_step returns NaN and counts the step (skipped_steps()). Data-parallel, the
  // values checked are the ones reduced over the ranks, so every rank takes the same decision.
  std::string on_non_finite = "raise";
  // Mixed precision (docs/trainer.md): MatMul/Gemm/Conv compute on float16 or bfloat16 values, weights stay
  // float32, a dynamic loss scale (torch.amp.GradScaler's rule) guards the backward; a step whose loss or
  // gradients are not finite is skipped and counted (overflow_steps()) instead of following on_non_finite.
  MixedPrecisionSpec mixed_precision;
  // Parameter-efficient fine-tuning (docs/lora.md): with kind "lora" the session rewrites the model with LoRA
  // adapters on the targeted weights (training/adapters.h) and trains the adapters only, plus the weights
  // `trainable` names (a fresh classification head, say); the base weights stay frozen. A model that already
  // carries adapters (a checkpoint, an exported adapted model) keeps them and trains them on.
  AdapterSpec adapter;
  // Activation recomputation (docs/memory.md): the backward pass of train_step and gradients() recomputes the
  // chosen forward activations ("auto", or node globs) from kept boundaries instead of keeping them alive.
  // Losses and gradients are the same bits. run_forward/run_backward recompute too (run_forward keeps fewer values).
  MemorySpec memory;
  // Debugging aid: check every value a step computes, so the error names the node that first produced a
  // NaN/Inf rather than the loss or gradient it reached. Costs a pass over every intermediate.
  bool check_every_value = false;
  // Time every step of the training-step plan (docs/performance.md "Profiling a step"); read with profile().
  bool profile = false;
};

}  // namespace onnxtrain
