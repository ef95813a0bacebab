// The CLI's YAML config parser (cli/config.cpp): bytes -> YAML -> RunConfig, with `--set key=value` overrides.
// The input is the config text, then optionally NUL-separated overrides ("text\0train.epochs=3\0loss.kind=mse").
// Beyond "succeeds or throws Error", an accepted config must be accepted again from the text it stores, because
// that text is what a checkpoint carries and `onnxtrain resume` parses.
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/config.h"
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace onnxtrain;
  const std::string_view in = fuzz::as_bytes(data, size);
  const size_t nul = in.find('\0');
  const std::string text(in.substr(0, nul));
  std::vector<std::string> overrides;
  for (size_t at = nul; at != std::string_view::npos && at < in.size();) {
    const size_t next = in.find('\0', at + 1);
    overrides.emplace_back(in.substr(at + 1, next == std::string_view::npos ? std::string_view::npos : next - at - 1));
    at = next;
  }
  return fuzz::expect_success_or_error([&] {
    const cli::RunConfig c = cli::parse_config(text, "fuzz/run.yaml", overrides);
    (void)c.locate(text.substr(0, 64));
    try {
      const cli::RunConfig again = cli::parse_config(c.text, "fuzz/run.yaml");
      if (again.text != c.text) std::abort();  // the stored text does not reproduce itself
    } catch (const Error&) {
      std::abort();  // accepted once, rejected when a checkpoint's copy is parsed again
    }
  });
}
