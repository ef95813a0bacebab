#pragma once
// The pause of a spin-wait: tells the core a loop is polling, so the sibling hyper-thread and the memory system
// are not flooded while a rank or replica waits microseconds for another (distributed/threads.cpp,
// training/replicas.cpp).
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace onnxtrain {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

}  // namespace onnxtrain
