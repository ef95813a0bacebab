#pragma once
// Shared by the libFuzzer targets. The contract under test: any input either succeeds or throws
// onnxtrain::Error (a clear message). Every other outcome - a crash, a sanitizer report, a hang, or any other
// exception type escaping - is a bug, so only Error is caught here and libFuzzer reports the rest.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "graph/error.h"

namespace onnxtrain::fuzz {

inline std::string_view as_bytes(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

template <class F>
int expect_success_or_error(F&& f) {
  try {
    f();
  } catch (const Error&) {
  }
  return 0;
}

}  // namespace onnxtrain::fuzz
