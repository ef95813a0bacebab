// The gradient builder on loaded graphs: every floating-point output seeded (through a Yield, as
// ForwardBackwardSession does), differentiated with respect to every floating-point initializer, then split at
// the Yield.
#include "fuzz/fuzz_common.h"
#include "gradients/builder.h"
#include "graph/model_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace onnxtrain;
  return fuzz::expect_success_or_error([&] {
    Model m = load_model_from_bytes(fuzz::as_bytes(data, size), "<fuzz>");
    Graph& g = m.graph;
    GradientRequest req;
    req.emit_yield = true;
    for (const auto& [name, t] : g.initializers)
      if (is_floating(t.dtype)) req.wrt.push_back(name);
    for (const ValueInfo& o : g.outputs) {
      const TypeInfo* t = g.type_of(o.name);
      if (t && is_floating(t->dtype)) req.outputs.push_back(o.name);
    }
    if (req.outputs.empty() || req.wrt.empty()) return;
    build_gradients(g, m.opset_imports, req);
    (void)split_at_yield(g);
  });
}
