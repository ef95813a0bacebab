#pragma once
// The one exception type for bad user input. Every throw site names what it is about (file, node, op, tensor
// or key) and what was expected, so callers never need to guess.
#include <stdexcept>
#include <string>

namespace onnxtrain {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Builds the message "<where>: <what>" so context reads the same everywhere.
[[noreturn]] inline void fail(const std::string& where, const std::string& what) {
  throw Error(where.empty() ? what : where + ": " + what);
}

}  // namespace onnxtrain
