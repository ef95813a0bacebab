// The checkpoint reader: bytes -> model -> TrainingSession::from_checkpoint (metadata -> config, session
// rebuild, optimizer state copied back in).
#include "fuzz/fuzz_common.h"
#include "graph/model_io.h"
#include "training/session.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace onnxtrain;
  return fuzz::expect_success_or_error([&] {
    Model m = load_model_from_bytes(fuzz::as_bytes(data, size), "<fuzz>");
    (void)TrainingSession::from_checkpoint(m, "<fuzz>");
  });
}
