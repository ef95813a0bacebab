#include "graph/shape_inference.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <set>
#include <string>

#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include "graph/error.h"
#include "graph/isolate.h"
#include "graph/proto.h"

namespace onnxtrain {

namespace {

// Initializers up to this size go to ONNX with their data (shape arguments of Reshape, axes, pads...). Larger
// ones are weights: only their type matters, so they are declared as typed inputs instead of copied.
constexpr int64_t kMaxCopiedInitializer = 1024;

onnx::ModelProto inference_proto(const Model& m) {
  Model shell;
  shell.ir_version = m.ir_version;
  shell.opset_imports = m.opset_imports;
  shell.functions = m.functions;
  onnx::ModelProto p = to_proto(shell);

  Graph light;
  light.name = m.graph.name;
  light.nodes = m.graph.nodes;
  light.inputs = m.graph.inputs;
  light.outputs = m.graph.outputs;
  light.value_info = m.graph.value_info;
  for (const auto& [name, t] : m.graph.initializers) {
    if (t.numel() <= kMaxCopiedInitializer) {
      light.initializers.emplace(name, t);
      continue;
    }
    if (light.find_input(name)) continue;
    Shape s;
    for (int64_t d : t.dims) s.push_back(Dim::of(d));
    light.inputs.push_back(ValueInfo{name, TypeInfo{t.dtype, std::move(s)}});
  }
  graph_to_proto(light, p.mutable_graph());
  return p;
}

bool readable(const onnx::ValueInfoProto& v) {
  if (!v.has_type() || v.type().value_case() != onnx::TypeProto::kTensorType) return false;
  const int32_t et = v.type().tensor_type().elem_type();
  return et > 0 && et != static_cast<int32_t>(DType::String) && et <= static_cast<int32_t>(DType::BFloat16) &&
         et != 14 && et != 15;  // complex64/complex128 have no DType
}

TypeInfo read_type(const onnx::ValueInfoProto& v) {
  // Reuse the proto edge's conversion through a one-value graph rather than duplicating the dim rules.
  onnx::GraphProto g;
  *g.add_value_info() = v;
  Graph ir = graph_from_proto(g);
  return ir.value_info.begin()->second;
}

void read_back(const onnx::GraphProto& gp, Graph& g) {
  for (const auto& v : gp.value_info())
    if (readable(v)) g.value_info[v.name()] = read_type(v);
  for (const auto& v : gp.output())
    if (readable(v)) g.value_info[v.name()] = read_type(v);
  // The proto was built from these very nodes, so they correspond one to one; subgraphs get their types too.
  for (int i = 0; i < gp.node_size() && static_cast<size_t>(i) < g.nodes.size(); ++i) {
    for (const auto& a : gp.node(i).attribute()) {
      if (a.type() != onnx::AttributeProto::GRAPH) continue;
      auto it = g.nodes[i].attributes.find(a.name());
      if (it == g.nodes[i].attributes.end()) continue;
      if (auto* sub = std::get_if<std::shared_ptr<Graph>>(&it->second); sub && *sub) read_back(a.g(), **sub);
    }
  }
}

// Ops ONNX 1.16 leaves untyped: GroupNormalization has a function body but no inference function, so its
// output (X's type and shape) and everything downstream would stay unknown.
void infer_missing(Graph& g) {
  for (const Node& n : g.nodes) {
    if (!(n.domain.empty() || n.domain == "ai.onnx") || n.op_type != "GroupNormalization") continue;
    if (n.outputs.empty() || n.outputs[0].empty() || g.value_info.count(n.outputs[0]) || !n.has_input(0)) continue;
    if (const TypeInfo* t = g.type_of(n.inputs[0])) g.value_info[n.outputs[0]] = *t;
  }
}

// Runs ONNX's inference on p, data propagation first: it resolves Shape -> Gather -> Reshape chains, and if it
// trips on a model, plain inference still gives element types and most shapes. `fresh` rebuilds p, which a
// failed attempt leaves half-inferred. Throws Error with the first attempt's message when both fail.
void run_onnx_inference(onnx::ModelProto& p, const std::function<onnx::ModelProto()>& fresh) {
  std::string first_error;
  for (bool data_propagation : {true, false}) {
    if (!data_propagation) p = fresh();
    onnx::ShapeInferenceOptions opts{/*check_type=*/false, /*error_mode=*/0, data_propagation};
    try {
      onnx::shape_inference::InferShapes(p, onnx::OpSchemaRegistry::Instance(), opts);
      return;
    } catch (const std::exception& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  fail("ONNX shape inference", first_error);
}

// Drops what read_back does not look at (initializers, inputs, node inputs/outputs, non-graph attributes), so
// the child sends back little more than the inferred types.
void slim(onnx::GraphProto& g) {
  g.clear_initializer();
  g.clear_sparse_initializer();
  g.clear_input();
  g.clear_doc_string();
  for (onnx::NodeProto& n : *g.mutable_node()) {
    n.clear_input();
    n.clear_output();
    n.clear_doc_string();
    auto* attrs = n.mutable_attribute();
    int kept = 0;
    for (int i = 0; i < attrs->size(); ++i)
      if (attrs->Get(i).type() == onnx::AttributeProto::GRAPH) attrs->SwapElements(i, kept++);
    attrs->DeleteSubrange(kept, attrs->size() - kept);
    for (onnx::AttributeProto& a : *attrs) slim(*a.mutable_g());
  }
}

// The schema registry is built on first use. Built in the parent, every child inherits it instead of building
// it again (which would also cost each call most of the time the isolation takes).
void warm_up_onnx() {
  static const bool warm = onnx::OpSchemaRegistry::Schema("Relu", 14, "") != nullptr;
  (void)warm;
}

// Test hook (tests/graph/test_isolation.cpp): makes the child that runs the whole graph fail in a way no model
// reliably provokes. Read in the parent, so a child does nothing but act on it.
std::string test_fault() {
  const char* v = std::getenv("ONNXTRAIN_TEST_SHAPE_INFERENCE_FAULT");
  return v ? v : "";
}

void act_on_test_fault(const std::string& fault) {
  if (fault == "segv") ::raise(SIGSEGV);
  if (fault == "abort") std::abort();
  if (fault == "exit") ::_exit(3);
  if (fault == "hang")
    for (;;) ::pause();
}

// The first node whose prefix crashes ONNX's inference in a child, found by bisection: ONNX infers nodes in
// order, so the prefix nodes[0, k) crashes iff it holds the crashing node. The graph's outputs are dropped from
// every prefix (most are not produced yet). Returns -1 when even the whole node list does not crash without
// them (the crash came from the graph's outputs, or does not reproduce).
int crashing_node(onnx::ModelProto& p, const std::function<onnx::ModelProto()>& fresh, double timeout) {
  const int n = p.graph().node_size();
  auto crashes = [&](int k) {
    const ChildResult r = run_in_child(
        [&] {
          // Cut in the child's copy of p: each bisection step forks from the parent's, which stays whole.
          auto prefix = [&](onnx::ModelProto& q) {
            q.mutable_graph()->mutable_node()->DeleteSubrange(k, n - k);
            q.mutable_graph()->clear_output();
          };
          prefix(p);
          run_onnx_inference(p, [&] {
            onnx::ModelProto q = fresh();
            prefix(q);
            return q;
          });
          return std::string();
        },
        timeout, "ONNX shape inference");
    return r.status == ChildResult::Status::Crashed || r.status == ChildResult::Status::TimedOut;
  };
  if (n == 0 || !crashes(n)) return -1;
  int good = 0, bad = n;  // prefix `good` is assumed not to crash (it has no nodes when 0), prefix `bad` does
  while (bad - good > 1) {
    const int mid = good + (bad - good) / 2;
    (crashes(mid) ? bad : good) = mid;
  }
  return bad - 1;
}

void infer_isolated(Model& m, const OnnxIsolation& iso) {
  warm_up_onnx();
  onnx::ModelProto p = inference_proto(m);
  auto fresh = [&] { return inference_proto(m); };
  const std::string fault = test_fault();
  const ChildResult r = run_in_child(
      [&] {
        act_on_test_fault(fault);
        // The child's memory is its own copy of the parent's: inferring into p here leaves the parent's p as
        // it was, for the bisection below.
        run_onnx_inference(p, fresh);
        slim(*p.mutable_graph());
        return p.graph().SerializeAsString();
      },
      iso.timeout_seconds, "ONNX shape inference");
  const std::string graph = "graph '" + m.graph.name + "' (" + std::to_string(m.graph.nodes.size()) + " nodes)";
  switch (r.status) {
    case ChildResult::Status::Returned: {
      onnx::GraphProto gp;
      if (!gp.ParseFromString(r.payload))
        fail("ONNX shape inference", "the child process's result for " + graph + " did not parse");
      read_back(gp, m.graph);
      infer_missing(m.graph);
      return;
    }
    case ChildResult::Status::Threw:
      fail("", r.payload);  // run_onnx_inference's message, already located
    case ChildResult::Status::TimedOut: {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", iso.timeout_seconds);
      fail("ONNX shape inference", std::string("did not finish within ") + secs + " s on " + graph +
                                       "; the child process running it was killed (ONNXTRAIN_ONNX_TIMEOUT sets the "
                                       "limit, docs/reliability.md)");
    }
    case ChildResult::Status::Crashed: break;
  }
  const int at = crashing_node(p, fresh, iso.timeout_seconds);
  const std::string where = at >= 0 && static_cast<size_t>(at) < m.graph.nodes.size()
                                ? "on " + m.graph.nodes[static_cast<size_t>(at)].describe()
                                : "on " + graph + " (no prefix of its nodes crashes alone)";
  fail("", "ONNX shape inference crashed (" + r.payload + ") " + where +
               "; it ran in a child process, so only the child died. The node's attributes or input types are "
               "malformed, or ONNX's inference has a bug for them");
}

}  // namespace

void infer_shapes(Model& m) {
  const OnnxIsolation iso = onnx_isolation_from_env();
  if (iso.enabled) return infer_isolated(m, iso);
  onnx::ModelProto p = inference_proto(m);
  run_onnx_inference(p, [&] { return inference_proto(m); });
  read_back(p.graph(), m.graph);
  infer_missing(m.graph);
}

}  // namespace onnxtrain
