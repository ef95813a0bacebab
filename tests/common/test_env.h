#pragma once
// Paths shared by the test suites.
#include <filesystem>
#include <string>

namespace onnxtrain::test {

std::filesystem::path source_dir();
// The onnx Python package's backend node tests (onnx/backend/test/data/node) from the project venv; empty
// when the venv has no onnx.
std::filesystem::path onnx_node_test_dir();
// A fresh temporary folder for one test.
std::filesystem::path temp_dir(const std::string& name);

}  // namespace onnxtrain::test
