#pragma once
// Paths shared by the test suites.
#include <filesystem>
#include <functional>
#include <string>

// Built with AddressSanitizer (scripts/sanitize.sh: clang 14, -O1): some tests differ there, each saying why.
#if defined(__SANITIZE_ADDRESS__)
#define ONNXTRAIN_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ONNXTRAIN_TEST_UNDER_ASAN 1
#endif
#endif
#ifndef ONNXTRAIN_TEST_UNDER_ASAN
#define ONNXTRAIN_TEST_UNDER_ASAN 0
#endif

namespace onnxtrain::test {

inline constexpr bool kUnderAsan = ONNXTRAIN_TEST_UNDER_ASAN != 0;

// The checkout ($ONNXTRAIN_SOURCE_DIR, else the one the tests were built from) and the project venv's Python
// ($ONNXTRAIN_PYTHON, else the compiled-in one): overridable so that a build copied to another machine (a GPU
// machine, scripts/gpu_check.sh) finds its data and tools there.
std::filesystem::path source_dir();
std::string python();
// The onnx Python package's backend node tests (onnx/backend/test/data/node) from the project venv; empty
// when the venv has no onnx.
std::filesystem::path onnx_node_test_dir();
// A fresh temporary folder for one test.
std::filesystem::path temp_dir(const std::string& name);
// examples/make_mlp.py's ReLU MLP with these layer sizes ("64 256 1"), written to dir/mlp.onnx.
std::filesystem::path make_mlp(const std::filesystem::path& dir, const std::string& sizes);
// The message of the onnxtrain::Error that f throws, or "<no error>".
std::string error_of(const std::function<void()>& f);

}  // namespace onnxtrain::test
