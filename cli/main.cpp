// The `onnxtrain` command: dispatches to the subcommands (commands.h), each a thin layer over training/.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cli/commands.h"

using namespace onnxtrain::cli;

int main(int argc, char** argv) {
  if (argc < 2) return std::fprintf(stderr, "%s", usage_of("")), kExitUsage;
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") return std::printf("%s", usage_of("")), 0;
  if (cmd == "--version") return std::printf("onnxtrain %s\n", ONNXTRAIN_VERSION), 0;
  static const std::map<std::string, int (*)(const std::vector<std::string>&)> commands = {
      {"train", cmd_train}, {"resume", cmd_resume}, {"eval", cmd_eval},  {"export", cmd_export},
      {"info", cmd_info},   {"config", cmd_config}, {"ops", cmd_ops},    {"gradient-graph", cmd_gradient_graph},
      {"merge", cmd_merge}};
  auto it = commands.find(cmd);
  if (it == commands.end()) {
    std::fprintf(stderr, "onnxtrain: unknown command '%s'\n%s", cmd.c_str(), usage_of(""));
    return kExitUsage;
  }
  try {
    return it->second(std::vector<std::string>(argv + 2, argv + argc));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "onnxtrain %s: %s\n%s", cmd.c_str(), e.what(), usage_of(cmd));
    return kExitUsage;
  } catch (const std::exception& e) {  // never abort on user input
    std::fprintf(stderr, "onnxtrain %s: %s\n", cmd.c_str(), e.what());
    return kExitFailure;
  }
}
