// Issue 27's op layer for the elementwise, unary and activation families: their CUDA factories no longer run the
// CPU factory, so the plan-time part both run (checks, attributes, output dtypes and shapes) is executor/ops/
// elementwise.h, unary.h and activation.h. This checks, on any machine (no GPU: a factory only plans, and these
// kernels' constructors touch no device), that the CPU and CUDA factories of each case agree: the same outputs,
// or the same error word for word.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "executor/device.h"
#include "executor/kernel.h"
#include "graph/error.h"

namespace onnxtrain {
namespace {

struct Case {
  std::string op;
  std::string domain;
  int64_t opset;
  std::vector<KernelInput> inputs;
  std::map<std::string, Attribute> attrs = {};
  size_t outputs = 1;
  // A substring of the error both must raise; empty when both must plan.
  std::string error = {};
};

struct Planned {
  std::vector<KernelOutput> outputs;
  std::optional<std::string> error;
};

KernelInput in(DType t, std::vector<int64_t> shape) { return {t, std::move(shape), nullptr}; }

Planned plan(const Case& c, Device device) {
  Node node;
  node.name = "n";
  node.op_type = c.op;
  node.domain = c.domain;
  // Value names only label the node (appended, not "x" + to_string: GCC 12 warns falsely on that, -Wrestrict).
  for (size_t i = 0; i < c.inputs.size(); ++i) node.inputs.push_back(std::string("x").append(std::to_string(i)));
  for (size_t i = 0; i < c.outputs; ++i) node.outputs.push_back(std::string("y").append(std::to_string(i)));
  node.attributes = c.attrs;
  const KernelDef* def =
      default_kernels().find(c.domain, c.op, c.opset, device, c.inputs.empty() ? DType::Undefined : c.inputs[0].dtype);
  EXPECT_NE(def, nullptr) << c.op << " has no kernel on " << (device == Device::CUDA ? "cuda" : "cpu");
  if (!def) return {};
  PrepareContext ctx{node, c.opset, device, c.inputs, std::vector<KernelOutput>(c.outputs)};
  Planned p;
  try {
    EXPECT_NE(def->factory(ctx), nullptr);
  } catch (const Error& e) {
    p.error = e.what();
  }
  p.outputs = ctx.outputs;
  return p;
}

TEST(OpLayerElementwise, CudaFactoriesPlanAsTheCpuOnes) {
  if (!built_with_cuda()) GTEST_SKIP() << "built without CUDA, so no CUDA factories to compare";
  const DType f = DType::Float32, d = DType::Float64, i64 = DType::Int64, i32 = DType::Int32, b = DType::Bool,
              h = DType::Float16, bf = DType::BFloat16, i8 = DType::Int8;
  const std::vector<Case> cases = {
      // elementwise: broadcasting, dtypes, arity
      {"Add", "", 17, {in(f, {2, 3}), in(f, {3})}},
      {"Add", "", 17, {in(f, {2, 3}), in(f, {4})}, {}, 1, "are not broadcastable"},
      {"Mul", "", 17, {in(f, {2, 3}), in(i64, {3})}, {}, 1, "must have the same dtype"},
      {"Sub", "", 17, {in(f, {2, 3})}, {}, 1, "expected 2 inputs, got 1"},
      {"Div", "", 17, {in(d, {2, 1}), in(d, {1, 5})}, {}, 2, "expected 1 output, got 2"},
      {"Equal", "", 17, {in(i32, {4, 1}), in(i32, {3})}},
      {"And", "", 17, {in(b, {2}), in(b, {2})}},
      {"Mod", "", 17, {in(f, {3}), in(f, {3})}, {{"fmod", int64_t{1}}}},
      {"Pow", "", 17, {in(f, {2, 3}), in(i32, {1})}},
      {"Pow", "", 17, {in(f, {2, 3}), in(i8, {1})}, {}, 1, "unsupported dtypes float32 ^ int8"},
      {"Where", "", 17, {in(b, {2, 1}), in(f, {3}), in(f, {2, 3})}},
      {"Where", "", 17, {in(b, {2}), in(f, {2}), in(d, {2})}, {}, 1, "inputs 1 and 2 must have the same dtype"},
      {"Where", "", 17, {in(b, {2}), in(h, {2}), in(h, {2})}, {}, 1, "input 1 has unsupported dtype float16"},
      {"Sum", "", 17, {in(f, {2, 3}), in(f, {3}), in(f, {2, 1})}},
      {"Mean", "", 17, {in(d, {4})}},
      {"Max", "", 17, {in(i64, {2}), in(i32, {2})}, {}, 1, "must have the same dtype"},
      {"Min", "", 17, {in(f, {2}), in(f, {3})}, {}, 1, "are not broadcastable"},
      // unary: the maths functions, Identity, Cast/CastLike, Clip, the fused gradients
      {"Relu", "", 14, {in(i32, {2, 2})}},
      {"Sigmoid", "", 13, {in(f, {5})}},
      {"Sqrt", "", 13, {in(d, {5})}},
      {"Round", "", 11, {in(f, {5})}},
      {"LeakyRelu", "", 16, {in(f, {3})}, {{"alpha", 0.2f}}},
      {"Elu", "", 6, {in(f, {3})}, {}, 2, "expected 1 output, got 2"},
      {"Identity", "", 16, {}, {}, 1, "input 0 is required"},
      {"Identity", "", 16, {in(i8, {2, 2})}},
      {"Cast", "", 19, {in(f, {2})}, {{"to", int64_t{10}}}},               // float16
      {"Cast", "", 19, {in(h, {2})}, {{"to", int64_t{1}}}},                // float32
      {"Cast", "", 19, {in(i64, {2})}, {{"to", int64_t{6}}}},              // int32
      {"Cast", "", 19, {in(f, {2})}, {{"to", int64_t{1}}}},                // the same type
      {"Cast", "", 19, {in(h, {2})}, {{"to", int64_t{7}}}, 1, "float16 and bfloat16 cast only to and from float32"},
      {"Cast", "", 19, {in(f, {2})}, {{"to", int64_t{8}}}, 1, "is not supported (supported: float32"},  // string
      {"Cast", "", 19, {in(f, {2})}, {}, 1, "attribute 'to' is required"},
      {"CastLike", "", 19, {in(f, {2}), in(bf, {1})}},
      {"CastLike", "", 19, {in(i64, {2}), in(h, {1})}, {}, 1, "cast only to and from float32"},
      {"CastLike", "", 19, {in(f, {2})}, {}, 1, "expected 2 inputs (input, target_type)"},
      {"Clip", "", 13, {in(i32, {4}), in(i32, {}), in(i32, {})}},
      {"Clip", "", 13, {in(f, {4}), in(d, {})}, {}, 1, "min must have the input's dtype float32"},
      {"Clip", "", 13, {in(f, {4}), in(f, {}), in(f, {2})}, {}, 1, "max must be a scalar"},
      {"Clip", "", 6, {in(f, {4})}, {{"min", -1.0f}, {"max", 1.0f}}},
      {"Clip", "", 6, {in(i32, {4})}, {}, 1, "input 0 has unsupported dtype int32"},
      {"ReluGrad", "onnxtrain", 1, {in(f, {2, 3}), in(f, {2, 3})}},
      {"TanhGrad", "onnxtrain", 1, {in(f, {2, 3}), in(f, {3})}, {}, 1, "shape"},
      // activation: attributes and their checks, PRelu, Hardmax, the GELU gradients
      {"Selu", "", 6, {in(f, {3})}, {{"alpha", 1.5f}, {"gamma", 1.1f}}},
      {"Selu", "", 6, {in(f, {3}), in(f, {3})}, {}, 1, "expected 1 input, got 2"},
      {"Celu", "", 12, {in(f, {3})}, {{"alpha", 0.5f}}},
      {"Celu", "", 12, {in(f, {3})}, {{"alpha", 0.0f}}, 1, "attribute 'alpha' must not be 0"},
      {"Gelu", "", 20, {in(f, {3})}, {{"approximate", std::string("tanh")}}},
      {"Gelu", "", 20, {in(d, {3})}},
      {"Gelu", "", 20, {in(f, {3})}, {{"approximate", std::string("fast")}}, 1,
       "attribute 'approximate' must be \"none\" or \"tanh\", got \"fast\""},
      {"HardSigmoid", "", 6, {in(f, {3})}, {{"alpha", 0.1f}}},
      {"HardSwish", "", 14, {in(d, {3})}},
      {"Mish", "", 18, {in(f, {3})}},
      {"ThresholdedRelu", "", 10, {in(f, {3})}, {{"alpha", 2.0f}}},
      {"PRelu", "", 16, {in(f, {2, 3, 4}), in(f, {3, 1})}},
      {"PRelu", "", 16, {in(f, {2, 3}), in(f, {2, 3, 1})}, {}, 1, "does not broadcast to X's shape"},
      {"PRelu", "", 16, {in(f, {2, 3}), in(d, {3})}, {}, 1, "slope must have X's dtype"},
      {"Hardmax", "", 13, {in(f, {2, 3, 4})}, {{"axis", int64_t{1}}}},
      {"Hardmax", "", 11, {in(f, {2, 3, 4})}},
      {"Hardmax", "", 13, {in(f, {})}, {}, 1, "input must have rank >= 1"},
      {"Hardmax", "", 13, {in(f, {2, 3})}, {{"axis", int64_t{2}}}, 1, "out of range"},
      {"GeluGrad", "onnxtrain", 1, {in(d, {4}), in(d, {4})}},
      {"GeluTanhGrad", "onnxtrain", 1, {in(f, {4}), in(d, {4})}, {}, 1, "dY and Y must have the same dtype"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op + " opset " + std::to_string(c.opset) + (c.error.empty() ? "" : ", expecting: " + c.error));
    const Planned cpu = plan(c, Device::CPU), cuda = plan(c, Device::CUDA);
    if (c.error.empty()) {
      EXPECT_FALSE(cpu.error) << *cpu.error;
    } else {
      ASSERT_TRUE(cpu.error);
      EXPECT_NE(cpu.error->find(c.error), std::string::npos) << *cpu.error;
    }
    EXPECT_EQ(cuda.error, cpu.error);
    if (cpu.error) continue;
    ASSERT_EQ(cuda.outputs.size(), cpu.outputs.size());
    for (size_t i = 0; i < cpu.outputs.size(); ++i) {
      EXPECT_EQ(cuda.outputs[i].dtype, cpu.outputs[i].dtype) << "output " << i;
      EXPECT_EQ(cuda.outputs[i].shape, cpu.outputs[i].shape) << "output " << i;
    }
  }
}

}  // namespace
}  // namespace onnxtrain
