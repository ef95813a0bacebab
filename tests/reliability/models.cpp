#include "reliability/models.h"

#include "graph/model_io.h"

namespace onnxtrain::test {

namespace {

Model finish(Model m) {
  m.opset_imports[""] = 17;
  m.graph.name = "g";
  return load_model_from_bytes(serialize_model(m), "test-model");
}

Node node(std::string op, std::vector<std::string> in, std::vector<std::string> out) {
  Node n;
  n.name = op + "_0";
  n.op_type = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

std::vector<float> ramp(int64_t n, float start, float step) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + step * static_cast<float>(i % 7);
  return v;
}

}  // namespace

Model linear_model(int64_t in, int64_t out) {
  Model m;
  m.graph.inputs.push_back({"x", {DType::Float32, Shape{Dim::sym("batch"), Dim::of(in)}}});
  m.graph.outputs.push_back({"y", {DType::Float32, Shape{Dim::sym("batch"), Dim::of(out)}}});
  const std::vector<float> w = ramp(in * out, -0.3f, 0.1f), b = ramp(out, 0.05f, 0.02f);
  m.graph.initializers["fc.weight"] = TensorData::from<float>({out, in}, w);
  m.graph.initializers["fc.bias"] = TensorData::from<float>({out}, b);
  Node n = node("Gemm", {"x", "fc.weight", "fc.bias"}, {"y"});
  n.attributes["transB"] = int64_t{1};
  m.graph.nodes.push_back(n);
  return finish(std::move(m));
}

Model sqrt_model() {
  Model m;
  m.graph.inputs.push_back({"x", {DType::Float32, Shape{Dim::sym("batch"), Dim::of(2)}}});
  m.graph.outputs.push_back({"y", {DType::Float32, Shape{Dim::sym("batch"), Dim::of(2)}}});
  const std::vector<float> w = {0.0f, 1.0f};
  m.graph.initializers["w"] = TensorData::from<float>({2}, w);
  m.graph.nodes.push_back(node("Sqrt", {"w"}, {"s"}));
  m.graph.nodes.push_back(node("Mul", {"x", "s"}, {"y"}));
  return finish(std::move(m));
}

Tensor filled(std::vector<int64_t> shape, float start, float step) {
  Tensor t = Tensor::empty(DType::Float32, std::move(shape));
  const std::vector<float> v = ramp(t.numel(), start, step);
  std::copy(v.begin(), v.end(), t.ptr<float>());
  return t;
}

Tensor labels(const std::vector<int64_t>& v) { return Tensor::from_vector<int64_t>({static_cast<int64_t>(v.size())}, v); }

}  // namespace onnxtrain::test
