#include "optimizers/optimizer.h"

#include <algorithm>
#include <cmath>

#include "graph/error.h"
#include "graph/expr.h"

namespace onnxtrain {

const std::vector<std::string>& optimizer_kinds() {
  static const std::vector<std::string> k = {"sgd"};
  return k;
}

OptimizerGraph append_optimizer(Graph& g, const std::map<std::string, std::string>& grads, const OptimizerSpec& spec) {
  const auto& kinds = optimizer_kinds();
  if (std::find(kinds.begin(), kinds.end(), spec.kind) == kinds.end()) {
    std::string all;
    for (const std::string& k : kinds) all += (all.empty() ? "" : ", ") + k;
    fail("optimizer.kind", "unknown optimizer '" + spec.kind + "'; expected one of: " + all);
  }
  if (!(spec.learning_rate > 0) || !std::isfinite(spec.learning_rate))
    fail("optimizer.learning_rate", "expected a positive finite number, got " + std::to_string(spec.learning_rate));
  GraphBuilder b(g, "optim/");
  OptimizerGraph out;
  out.learning_rate = GraphBuilder(g).unique_name("optim.lr");
  g.initializers[out.learning_rate] = TensorData::scalar<float>(static_cast<float>(spec.learning_rate));
  Expr lr = value(b, out.learning_rate, TypeInfo{DType::Float32, Shape{}});
  for (const auto& [w, gname] : grads) {
    Expr wv = value(b, w);
    Expr gv = value(b, gname);
    Expr step_lr = wv.dtype() == DType::Float32 ? lr : cast(lr, wv.dtype());
    Expr nw = wv - step_lr * gv;  // plain SGD: w <- w - lr * g
    out.updates.emplace_back(nw.name, w);
  }
  return out;
}

}  // namespace onnxtrain
