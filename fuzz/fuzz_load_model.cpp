// Bytes -> IR: protobuf parse, conversion, the ONNX checker and our validation, shape inference (ONNX's part in a
// child process: a crash or hang there must come back as an Error).
#include "fuzz/fuzz_common.h"
#include "graph/model_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace onnxtrain;
  return fuzz::expect_success_or_error([&] {
    Model m = load_model_from_bytes(fuzz::as_bytes(data, size), "<fuzz>");
    // A loaded model must survive the way back out, since checkpoints and exports serialize it.
    (void)serialize_model(m);
  });
}
