#pragma once
// The subcommands of `onnxtrain`. Each takes the arguments after its name and returns the exit code:
// 0 success, 1 failure while running (bad model, bad data, diverged), 2 usage or config error, 130 stopped by
// Ctrl-C after saving a checkpoint.
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace onnxtrain::cli {

inline constexpr int kExitFailure = 1, kExitUsage = 2, kExitInterrupted = 130;
// `onnxtrain info`: the model cannot be trained as it is, because an op has no CPU kernel (kExitNotTrainable) or
// an op on a weight's path has no gradient rule (kExitPartlyTrainable: freeze the weights before it). An invalid
// model is kExitUsage.
inline constexpr int kExitNotTrainable = 3, kExitPartlyTrainable = 4;

// Command-line arguments: positionals, "-o X"/"--name X" options and repeated "--set k=v".
struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;
  std::vector<std::string> sets;
  bool help = false;
};
// `valued` lists the options that take a value, `flags` those that do not. Throws UsageError.
Args parse_args(const std::vector<std::string>& argv, const std::vector<std::string>& valued,
                const std::vector<std::string>& flags = {});

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int cmd_train(const std::vector<std::string>& args);
int cmd_resume(const std::vector<std::string>& args);
int cmd_eval(const std::vector<std::string>& args);
int cmd_export(const std::vector<std::string>& args);
int cmd_merge(const std::vector<std::string>& args);
int cmd_info(const std::vector<std::string>& args);
int cmd_config(const std::vector<std::string>& args);
int cmd_ops(const std::vector<std::string>& args);
int cmd_gradient_graph(const std::vector<std::string>& args);

// Usage text of one command (or the overview for ""); nullptr for an unknown command.
const char* usage_of(const std::string& command);

}  // namespace onnxtrain::cli
