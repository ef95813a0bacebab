// Issue 27's op layer for MatMul and Gemm: their CUDA factories no longer run the CPU factory, and the three CPU
// paths (the float32 factory, the float16/bfloat16 widening wrapper, native bfloat16) no longer check the node
// each in their own words: executor/ops/matmul.h owns the checks, the messages and the output. This checks, on
// any machine (no GPU: a factory only plans, and these kernels' constructors touch no device), that the CPU and
// CUDA factories of each case agree: the same output, or the same error word for word, and that the output is
// the expected one.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "executor/cpu/bf16_gemm.h"
#include "executor/device.h"
#include "executor/kernel.h"
#include "executor/plan_fusion.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

struct Case {
  std::string op;
  std::vector<KernelInput> inputs;
  std::map<std::string, Attribute> attrs = {};
  // The output shape both must plan; ignored when `error` is set.
  std::vector<int64_t> shape = {};
  // A substring of the error both must raise; empty when both must plan.
  std::string error = {};
};

struct Planned {
  std::optional<KernelOutput> output;
  std::optional<std::string> error;
};

KernelInput in(DType t, std::vector<int64_t> shape) { return {t, std::move(shape), nullptr}; }
KernelInput absent() { return {}; }

Planned plan(const std::string& op, const std::vector<KernelInput>& inputs,
             const std::map<std::string, Attribute>& attrs, Device device) {
  Node node;
  node.name = "n";
  node.op_type = op;
  // Value names only label the node (appended, not "x" + to_string: GCC 12 warns falsely on that, -Wrestrict).
  for (size_t i = 0; i < inputs.size(); ++i) node.inputs.push_back(std::string("x").append(std::to_string(i)));
  node.outputs = {"y"};
  node.attributes = attrs;
  const int64_t opset = 13;
  const KernelDef* def = default_kernels().find("", op, opset, device, inputs[0].dtype);
  EXPECT_NE(def, nullptr) << op << " has no kernel on " << (device == Device::CUDA ? "cuda" : "cpu");
  if (!def) return {};
  PrepareContext ctx{node, opset, device, inputs, std::vector<KernelOutput>(1)};
  Planned p;
  try {
    EXPECT_NE(def->factory(ctx), nullptr);
    p.output = ctx.outputs[0];
  } catch (const Error& e) {
    p.error = e.what();
  }
  return p;
}

// Every case on the CPU, with the native bfloat16 path where this CPU has it and with the float32 emulation (the
// two CPU paths of a bfloat16 product), and on CUDA.
void expect_agreement(const std::vector<Case>& cases) {
  const bool cuda = built_with_cuda();
  for (const Case& c : cases) {
    std::string trace = c.op;
    // Appended piece by piece (GCC 12 warns falsely on chains of + here, -Wrestrict).
    for (const KernelInput& i : c.inputs) {
      trace.append(" ");
      if (i.present()) trace.append(dtype_name(i.dtype)).append(shape_string(i.shape));
      else trace.append("(absent)");
    }
    if (!c.error.empty()) trace.append(", expecting: ").append(c.error);
    SCOPED_TRACE(trace);
    const Planned native = plan(c.op, c.inputs, c.attrs, Device::CPU);
    cpu::force_bf16_emulation(true);
    const Planned emulated = plan(c.op, c.inputs, c.attrs, Device::CPU);
    cpu::force_bf16_emulation(false);
    if (c.error.empty()) {
      ASSERT_FALSE(native.error) << *native.error;
      EXPECT_EQ(native.output->dtype, c.inputs[0].dtype);
      EXPECT_EQ(native.output->shape, c.shape);
    } else {
      ASSERT_TRUE(native.error);
      EXPECT_NE(native.error->find(c.error), std::string::npos) << *native.error;
      EXPECT_NE(native.error->find("node 'n' (" + c.op + ")"), std::string::npos) << *native.error;
    }
    const auto same = [&](const Planned& p, const char* what) {
      SCOPED_TRACE(what);
      EXPECT_EQ(p.error, native.error);
      EXPECT_EQ(p.output.has_value(), native.output.has_value());
      if (p.output && native.output) {
        EXPECT_EQ(p.output->dtype, native.output->dtype);
        EXPECT_EQ(p.output->shape, native.output->shape);
      }
    };
    same(emulated, "cpu, bfloat16 emulated");
    if (cuda) same(plan(c.op, c.inputs, c.attrs, Device::CUDA), "cuda");
  }
}

const DType f = DType::Float32, d = DType::Float64, h = DType::Float16, bf = DType::BFloat16;

TEST(OpLayerMatMul, CudaFactoriesPlanAsTheCpuOnes) {
  std::vector<Case> cases;
  for (DType t : {f, d, h, bf}) {
    const std::vector<Case> per_type = {
        {"MatMul", {in(t, {2, 3}), in(t, {3, 4})}, {}, {2, 4}},
        // 1-D operands: a row A, a column B, their added dim dropped from the output
        {"MatMul", {in(t, {3}), in(t, {3, 4})}, {}, {4}},
        {"MatMul", {in(t, {2, 3}), in(t, {3})}, {}, {2}},
        {"MatMul", {in(t, {3}), in(t, {3})}, {}, {}},
        {"MatMul", {in(t, {3}), in(t, {5, 3, 4})}, {}, {5, 4}},
        // batch dims broadcast, on either side, a missing dim counting as 1, a 0 dim staying 0
        {"MatMul", {in(t, {2, 1, 3, 4}), in(t, {5, 4, 6})}, {}, {2, 5, 3, 6}},
        {"MatMul", {in(t, {4, 3}), in(t, {7, 3, 2})}, {}, {7, 4, 2}},
        {"MatMul", {in(t, {0, 2, 3}), in(t, {1, 3, 4})}, {}, {0, 2, 4}},
        {"MatMul", {in(t, {1, 2, 0}), in(t, {3, 0, 4})}, {}, {3, 2, 4}},
        // the failures
        {"MatMul", {in(t, {2, 3}), in(t, {4, 2})}, {}, {}, "inner dims differ: A [2,3] and B [4,2]"},
        {"MatMul", {in(t, {3}), in(t, {4})}, {}, {}, "inner dims differ: A [3] and B [4]"},
        {"MatMul", {in(t, {2, 3, 4}), in(t, {3, 4, 2})}, {}, {},
         "batch dims of A [2,3,4] and B [3,4,2] do not broadcast"},
        {"MatMul", {in(t, {2, 1, 3}), in(t, {4, 3, 2})}, {}, {},
         "batch dims of A [2,1,3] and B [4,3,2] do not broadcast"},
        {"MatMul", {in(t, {}), in(t, {3})}, {}, {}, "MatMul inputs must have rank >= 1"},
        {"MatMul", {in(t, {2, 3}), absent()}, {}, {}, "input 1 (B) is required"},
    };
    cases.insert(cases.end(), per_type.begin(), per_type.end());
  }
  // Mixed dtypes fail naming both, whichever path (float32 factory, half wrapper) the first input picks.
  cases.push_back({"MatMul", {in(f, {2, 3}), in(d, {3, 2})}, {}, {}, "A is float32 but B is float64"});
  cases.push_back({"MatMul", {in(h, {2, 3}), in(f, {3, 2})}, {}, {}, "A is float16 but B is float32"});
  cases.push_back({"MatMul", {in(bf, {2, 3}), in(h, {3, 2})}, {}, {}, "A is bfloat16 but B is float16"});
  expect_agreement(cases);
}

TEST(OpLayerGemm, CudaFactoriesPlanAsTheCpuOnes) {
  std::vector<Case> cases;
  using Attrs = std::map<std::string, Attribute>;
  const Attrs ta{{"transA", int64_t{1}}}, tb{{"transB", int64_t{1}}}, both{{"transA", int64_t{1}}, {"transB", int64_t{1}}};
  for (DType t : {f, d, h, bf}) {
    const std::vector<Case> per_type = {
        {"Gemm", {in(t, {2, 3}), in(t, {3, 4})}, {}, {2, 4}},
        {"Gemm", {in(t, {2, 3}), in(t, {3, 4}), absent()}, {}, {2, 4}},
        // transA / transB
        {"Gemm", {in(t, {3, 2}), in(t, {3, 4})}, ta, {2, 4}},
        {"Gemm", {in(t, {2, 3}), in(t, {4, 3})}, tb, {2, 4}},
        {"Gemm", {in(t, {3, 2}), in(t, {4, 3})}, both, {2, 4}},
        // C broadcast to [M, N]: a row, a column, a scalar, a 1-D of N, the full shape
        {"Gemm", {in(t, {2, 3}), in(t, {3, 4}), in(t, {1, 4})}, {}, {2, 4}},
        {"Gemm", {in(t, {2, 3}), in(t, {3, 4}), in(t, {2, 1})}, {}, {2, 4}},
        {"Gemm", {in(t, {2, 3}), in(t, {3, 4}), in(t, {})}, {}, {2, 4}},
        {"Gemm", {in(t, {2, 3}), in(t, {3, 4}), in(t, {4})}, {}, {2, 4}},
        {"Gemm", {in(t, {2, 3}), in(t, {3, 4}), in(t, {2, 4})}, {{"alpha", 0.5f}, {"beta", 2.0f}}, {2, 4}},
        {"Gemm", {in(t, {2, 3}), in(t, {3, 4}), in(t, {2, 4})}, {{"beta", 0.0f}}, {2, 4}},
        {"Gemm", {in(t, {2, 0}), in(t, {0, 4}), in(t, {4})}, {}, {2, 4}},
        // the failures
        {"Gemm", {in(t, {2, 3}), in(t, {3, 4}), in(t, {3})}, {}, {}, "C [3] does not broadcast to [2,4]"},
        {"Gemm", {in(t, {2, 3}), in(t, {3, 4}), in(t, {4, 2})}, {}, {}, "C [4,2] does not broadcast to [2,4]"},
        {"Gemm", {in(t, {2, 3}), in(t, {3, 4}), in(t, {1, 2, 4})}, {}, {}, "C must have rank <= 2, got [1,2,4]"},
        {"Gemm", {in(t, {2, 3, 4}), in(t, {4, 5})}, {}, {}, "A and B must be 2-D, got [2,3,4] and [4,5]"},
        {"Gemm", {in(t, {2, 3}), in(t, {3})}, {}, {}, "A and B must be 2-D, got [2,3] and [3]"},
        {"Gemm", {in(t, {2, 3}), in(t, {4, 5})}, {}, {}, "inner dims differ: A [2,3] and B [4,5]"},
        {"Gemm", {in(t, {2, 3}), in(t, {3, 4})}, ta, {}, "inner dims differ: A [2,3] (transposed) and B [3,4]"},
        {"Gemm", {in(t, {2, 3}), in(t, {3, 4})}, tb, {}, "inner dims differ: A [2,3] and B [3,4] (transposed)"},
        {"Gemm", {in(t, {2, 3}), absent()}, {}, {}, "input 1 (B) is required"},
    };
    cases.insert(cases.end(), per_type.begin(), per_type.end());
  }
  cases.push_back({"Gemm", {in(f, {2, 3}), in(d, {3, 4})}, {}, {}, "A is float32 but B is float64"});
  cases.push_back({"Gemm", {in(bf, {2, 3}), in(bf, {3, 4}), in(f, {4})}, {}, {}, "C is float32 but A is bfloat16"});
  cases.push_back({"Gemm", {in(h, {2, 3}), in(h, {3, 4}), in(d, {4})}, {}, {}, "C is float64 but A is float16"});
  expect_agreement(cases);
}

// On the CPU a MatMul may read its operands through Transposes the plan folded into it (executor/plan_fusion.h):
// the op layer then checks the logical product, so every CPU path plans the shapes, and says the words, of the
// graph as written.
TEST(OpLayerMatMul, FoldedTransposesAreCheckedOnTheLogicalShapes) {
  using Attrs = std::map<std::string, Attribute>;
  const Attrs perm_a{{kMatMulPermA, std::vector<int64_t>{0, 2, 1}}};
  const Attrs perm_ab_y{{kMatMulPermA, std::vector<int64_t>{0, 2, 1}},
                        {kMatMulPermB, std::vector<int64_t>{1, 0}},
                        {kMatMulPermY, std::vector<int64_t>{1, 0, 2}}};
  for (DType t : {f, d, h, bf})
    for (bool emulate : {false, true}) {
      SCOPED_TRACE(dtype_name(t) + (emulate ? " emulated" : ""));
      cpu::force_bf16_emulation(emulate);
      // A stored [2, 4, 3] read as [2, 3, 4].
      Planned p = plan("MatMul", {in(t, {2, 4, 3}), in(t, {4, 5})}, perm_a, Device::CPU);
      ASSERT_FALSE(p.error) << *p.error;
      EXPECT_EQ(p.output->shape, (std::vector<int64_t>{2, 3, 5}));
      // B stored [5, 4] read as [4, 5]; Y [2, 3, 5] written as [3, 2, 5].
      p = plan("MatMul", {in(t, {2, 4, 3}), in(t, {5, 4})}, perm_ab_y, Device::CPU);
      ASSERT_FALSE(p.error) << *p.error;
      EXPECT_EQ(p.output->shape, (std::vector<int64_t>{3, 2, 5}));
      p = plan("MatMul", {in(t, {2, 3, 4}), in(t, {4, 5})}, perm_a, Device::CPU);
      ASSERT_TRUE(p.error);
      EXPECT_NE(p.error->find("inner dims differ: A [2,4,3] and B [4,5]"), std::string::npos) << *p.error;
      cpu::force_bf16_emulation(false);
    }
}

}  // namespace
}  // namespace onnxtrain
