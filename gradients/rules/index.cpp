// Gradients of the index-driven ops: GatherElements, GatherND, ScatterElements, ScatterND (kernels:
// executor/cpu/index.cpp, executor/cuda/index.cu). Their gradients are the opposite gather or scatter-add.
#include <map>
#include <string>

#include "gradients/rule.h"
#include "gradients/rules/util.h"

namespace onnxtrain {

namespace {

void gather_elements_rule(RuleContext& c) {
  // Scatter-add, not scatter: an index may repeat.
  if (c.opset() < 16) c.fail("needs opset 16 or newer (ScatterElements with reduction='add'), the model has opset " +
                             std::to_string(c.opset()));
  Expr x = c.X(0);
  c.set_dX(0, apply(c.builder(), "ScatterElements", {zeros_like(x), c.X(1), c.dY(0)}, x.type,
                    {{"axis", c.node().attr_int("axis", 0)}, {"reduction", std::string("add")}}));
}

void need_scatter_add(RuleContext& c, const char* op) {
  if (c.opset() < 16)
    c.fail(std::string("needs opset 16 or newer (") + op + " with reduction='add'), the model has opset " +
           std::to_string(c.opset()));
}

void gather_nd_rule(RuleContext& c) {
  // Scatter-add dY back at the gathered positions (indices may repeat). ScatterND has no batch_dims, so with
  // batch_dims = b the b leading coordinates are prepended to every index tuple (a constant grid, expanded).
  need_scatter_add(c, "ScatterND");
  GraphBuilder& b = c.builder();
  Expr x = c.X(0), idx = c.X(1), dy = c.dY(0);
  const int64_t batch = c.node().attr_int("batch_dims", 0);
  Expr full = idx;
  if (batch > 0) {
    auto xd = rules::static_dims(x.type);
    auto id = rules::static_dims(idx.type);
    if (!xd || !id) c.fail("with batch_dims > 0, needs the shapes of data and indices to be known statically");
    const auto q = static_cast<int64_t>(id->size());
    // grid[b0, .., b_{batch-1}, 1, .., 1, k] = b_k, broadcast over the index dims between.
    std::vector<int64_t> grid_dims((*id).begin(), (*id).begin() + batch);
    for (int64_t i = batch; i < q - 1; ++i) grid_dims.push_back(1);
    grid_dims.push_back(batch);
    int64_t cells = 1;
    for (int64_t i = 0; i < batch; ++i) cells *= (*id)[i];
    std::vector<int64_t> grid;
    for (int64_t cell = 0; cell < cells; ++cell) {
      std::vector<int64_t> coord(batch);
      for (int64_t k = batch - 1, rest = cell; k >= 0; --k) {
        coord[k] = rest % (*id)[k];
        rest /= (*id)[k];
      }
      grid.insert(grid.end(), coord.begin(), coord.end());
    }
    Expr g = constant(b, TensorData::from<int64_t>(grid_dims, std::span<const int64_t>(grid)));
    std::vector<int64_t> target(id->begin(), id->end() - 1);
    target.push_back(batch);
    Shape ts;
    for (int64_t d : target) ts.push_back(Dim::of(d));
    Expr eg = expand(g, int64s(b, target), ts);
    Shape fs = ts;
    fs.back() = Dim::of(batch + id->back());
    full = apply(b, "Concat", {eg, cast(idx, DType::Int64)}, TypeInfo{DType::Int64, fs}, {{"axis", int64_t{-1}}});
  }
  c.set_dX(0, apply(b, "ScatterND", {zeros_like(x), full, dy}, x.type, {{"reduction", std::string("add")}}));
}

// ScatterND and ScatterElements: with reduction 'none', data's gradient is dY with the overwritten positions
// zeroed, and updates' is dY read at those positions (ONNX leaves duplicate indices undefined under 'none';
// like torch.scatter we assume they are unique). With 'add' data passes dY through unchanged.
void scatter_rule(RuleContext& c, const char* gather_op, std::map<std::string, Attribute> attrs) {
  const std::string red = c.node().attr_string("reduction", "none");
  if (red != "none" && red != "add") c.fail("has no gradient for reduction '" + red + "' (only 'none' and 'add')");
  const std::string& op = c.node().op_type;
  GraphBuilder& b = c.builder();
  Expr dy = c.dY(0);
  if (c.needs_dX(0)) {
    if (red == "add")
      c.set_dX(0, dy);
    else
      c.set_dX(0, apply(b, op, {dy, c.X(1), zeros_like(c.X(2))}, dy.type, attrs));
  }
  if (c.needs_dX(2)) c.set_dX(2, apply(b, gather_op, {dy, c.X(1)}, rules::input_type(c, 2), attrs));
}

}  // namespace

void register_index_rules(GradientRegistry& r) {
  r.add("GatherElements", gather_elements_rule);
  r.add("GatherND", gather_nd_rule);
  r.add("ScatterND", [](RuleContext& c) { scatter_rule(c, "GatherND", {}); });
  r.add("ScatterElements", [](RuleContext& c) {
    scatter_rule(c, "GatherElements", {{"axis", c.node().attr_int("axis", 0)}});
  });
}

}  // namespace onnxtrain
