#pragma once
// Device selection and the few device services the executor needs, with one implementation per build:
// executor/cuda/runtime.cpp with CUDA, executor/cuda/no_cuda.cpp without (every entry point then throws one
// clear error naming what is missing). Nothing here includes CUDA headers, so any layer may use it.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "executor/tensor.h"

namespace onnxtrain {

// The one parser for device names everywhere (C++ API, Python, sklearn estimators, CLI config): "cpu",
// "cuda", "cuda:N", or "guarded" (the test device of executor/guarded.h). A CUDA name checks that CUDA is
// compiled in and device N is present, makes it the current device, and otherwise throws an Error that says
// which of the two is missing.
Device parse_device(std::string_view spec);

// The device of a session whose configuration names none: $ONNXTRAIN_DEVICE when set (any name parse_device
// takes), else "cpu". It lets a whole test suite, a script or a CLI run move to "cuda:0" (or the guarded test
// device) without editing each configuration; an explicit device always wins.
std::string default_device_name();

// Built with CUDA and at least one device visible to this process.
bool cuda_available();
// Why CUDA cannot be used ("built without CUDA", "no CUDA device visible: <driver message>"), or "" when it can.
std::string cuda_unavailable_reason();
bool built_with_cuda();

// Copies n bytes between any two devices, ordered on the current stream. A copy from or to the host has
// finished when it returns; a device-to-device copy is only queued. The only way host code reaches device
// memory (executor/transfer.h builds the session edge's helpers on it).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t n);

// Kernels of device d run while one lives (ExecutionPlan::run, plan-time folding): on the guarded device it
// opens the memory; elsewhere it does nothing.
class KernelScope {
 public:
  explicit KernelScope(Device d);
  ~KernelScope();
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  bool opened_ = false;
};

// A CUDA stream owned by a session (empty for the CPU). StreamScope makes it the stream that CUDA kernels of
// this thread launch on; synchronize() waits for everything queued on it.
std::shared_ptr<void> make_stream(Device d);
class StreamScope {
 public:
  explicit StreamScope(void* stream);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  void* previous_;
};
void synchronize(void* stream);

// Bytes held by the caching device allocator: in use and cached for reuse (for tests and docs).
struct DeviceMemoryStats {
  size_t in_use = 0, cached = 0, device_mallocs = 0;
};
DeviceMemoryStats device_memory_stats();

}  // namespace onnxtrain
