// The C++ examples (examples/cpp/) run on the digits data and fine-tune the head past 90% validation accuracy.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "common/test_env.h"

namespace onnxtrain {
namespace {

std::string run_example(const std::string& name, const std::filesystem::path& data, const std::string& out) {
  std::string cmd = std::string(ONNXTRAIN_EXAMPLES_DIR) + "/" + name + " " + (data / "digits.onnx").string() + " " +
                    (data / "train.npz").string() + " " + (data / "val.npz").string() + " " + out + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << text;
  return text;
}

double last_accuracy(const std::string& out) {
  const size_t at = out.rfind("val accuracy ");
  return at == std::string::npos ? -1 : std::stod(out.substr(at + 13));
}

TEST(Examples, OwnLoopAndTrainerFineTuneDigits) {
  auto dir = test::temp_dir("examples_cpp");
  std::string gen = test::python() + " " + (test::source_dir() / "examples/digits/make_digits.py").string() +
                    " " + (dir / "data").string() + " > /dev/null";
  ASSERT_EQ(std::system(gen.c_str()), 0);
  std::string own = run_example("own_loop", dir / "data", (dir / "own.onnx").string());
  EXPECT_GT(last_accuracy(own), 0.9) << own;
  EXPECT_TRUE(std::filesystem::exists(dir / "own.onnx"));
  std::string tr = run_example("with_trainer", dir / "data", (dir / "trainer").string());
  EXPECT_GT(last_accuracy(tr), 0.9) << tr;
  EXPECT_TRUE(std::filesystem::exists(dir / "trainer/model.onnx"));
  EXPECT_TRUE(std::filesystem::exists(dir / "trainer/metrics.csv"));
  // The same with two replicas (docs/replicas.md).
  std::string rep = run_example("with_trainer", dir / "data", (dir / "replicas").string() + " 2");
  EXPECT_GT(last_accuracy(rep), 0.9) << rep;
  EXPECT_TRUE(std::filesystem::exists(dir / "replicas/model.onnx"));
}

}  // namespace
}  // namespace onnxtrain
