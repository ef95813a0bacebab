#pragma once
// Paths shared by the test suites.
#include <filesystem>
#include <functional>
#include <string>

namespace onnxtrain::test {

std::filesystem::path source_dir();
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
