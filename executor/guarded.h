#pragma once
// The guarded test device (Device::Guarded, "guarded"; docs/gpu.md "The guarded device"). Its buffers are host
// memory that is mapped PROT_NONE except while kernels run (KernelScope, executor/device.h) or an explicit copy
// (copy_bytes) touches them. It runs the CPU kernels, but to every other piece of host code its memory is as
// unreachable as a GPU's: a session, trainer or binding that dereferences a store tensor instead of copying it
// across the session's edge faults with SIGSEGV on a CPU-only machine, where CUDA would fault only on a GPU.
#include <cstddef>

namespace onnxtrain {

// Zeroed, page-aligned memory of at least `bytes`, inaccessible unless a GuardedAccess is alive.
void* guarded_allocate(size_t bytes);
void guarded_free(void* p);

// memmove where either side may be guarded memory (copy_bytes' guarded path): only the buffers involved are
// opened, for the copy's duration.
void guarded_copy(void* dst, const void* src, size_t n);

// The same as a pair of calls (KernelScope uses them; every open needs its close).
void open_guarded_memory();
void close_guarded_memory() noexcept;

// While at least one lives, on any thread, every guarded buffer is readable and writable. Protection is
// process-wide (mprotect), so a thread outside kernels is only caught while no other thread is inside one.
class GuardedAccess {
 public:
  GuardedAccess() { open_guarded_memory(); }
  ~GuardedAccess() { close_guarded_memory(); }
  GuardedAccess(const GuardedAccess&) = delete;
  GuardedAccess& operator=(const GuardedAccess&) = delete;
};

// Live guarded buffers and whether they are open now (for tests).
size_t guarded_buffers();
bool guarded_memory_open();

}  // namespace onnxtrain
