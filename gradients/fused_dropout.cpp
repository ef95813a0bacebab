// Standard-ONNX body of onnxtrain.DropoutMask(x, counter) -> mask, the draw of LoRA's adapter dropout
// (training/adapters.h add_lora_dropout; native kernels: executor/cpu/dropout.cpp, executor/cuda/dropout.cu):
//   run = splitmix64(splitmix64(seed) ^ counter),  u_i = (splitmix64(run + i) >> 11) * 2^-53,  mask_i = u_i >= ratio
// with i the row-major index into x and ratio the float attribute widened to double. A checkpoint's training
// forward holds these nodes, so the body is what lets another runtime run that checkpoint's training step.
//
// Why the 64-bit words are held as base-256 digits rather than as one uint64 or int64 number:
// - a uint64 body is not portable: onnxruntime's CPU provider has no uint64 Add or Mul;
// - an int64 body would rely on overflow wrapping, which ONNX leaves undefined (and which is undefined behaviour
//   in C++ kernels, our executor's included: UBSan reports it);
// - BitwiseXor needs opset 18, and a model-local function imports its model's opset (onnx.checker and
//   onnxruntime refuse an opset-18 body in an opset-17 model), which a checkpoint keeps as it was.
// So a word is an int64 tensor [m, 8] of digits in [0, 256), the least significant first. Every step is exact
// int64 arithmetic that cannot overflow (sums and products stay below 2^45; a full int64 is only split into
// digits, by Mod, Sub and an exact Div), and the body uses only ops every runtime has from opset 13, plus
// Reshape's allowzero (opset 14) so that an empty x keeps its shape:
// - xor: a 256 x 256 table of a ^ b, computed in the body from the bits of 0..255, indexed by 256 a + b;
// - shift right by s = 8q + r: digit k is floor(d[k+q] / 2^r) + (d[k+q+1] mod 2^r) * 2^(8-r);
// - add and multiply by a constant: digit-wise sums or the schoolbook products (each column below 2^19), then
//   one carry pass mod 2^64 (normalize).
#include <algorithm>
#include <array>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "gradients/fused_body.h"

namespace onnxtrain {

namespace {

using fused_body::add;

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;  // splitmix64's increment and its two multipliers
constexpr uint64_t kMul1 = 0xbf58476d1ce4e5b9ULL;
constexpr uint64_t kMul2 = 0x94d049bb133111ebULL;

std::array<int64_t, 8> digits_of(uint64_t v) {
  std::array<int64_t, 8> d{};
  for (int k = 0; k < 8; ++k) d[k] = static_cast<int64_t>((v >> (8 * k)) & 0xff);
  return d;
}

// Emits the digit arithmetic into one function body; every value gets a fresh name.
class DigitBody {
 public:
  explicit DigitBody(Function& f) : f_(f) {
    scalar("c256", 256);
    scalar("c2p32", int64_t{1} << 32);
    ints("axis1", {1}, {1});
    ints("axis2", {1}, {2});
    ints("start", {1}, {0});  // Slice bounds of digits 0..3 and 4..7
    ints("middle", {1}, {4});
    ints("end", {1}, {8});
    std::vector<int64_t> place;  // 2^(8k): digit k's place value
    for (int k = 0; k < 8; ++k) place.push_back(int64_t{1} << (8 * k));
    ints("place8", {8}, place);
    ints("place4", {4}, std::vector<int64_t>(place.begin(), place.begin() + 4));
    xor_table();
  }

  // The digits of an int64 column [m, 1] (two's complement, so the uint64 with the same bits): floor(v / 2^(8k))
  // mod 256, the floor as (v - v mod 2^(8k)) / 2^(8k) since Div truncates and Mod follows the divisor's sign.
  std::string from_int64(const std::string& column) {
    const std::string low = op("Mod", {column, "place8"});
    const std::string floor = op("Div", {op("Sub", {column, low}), "place8"});
    return op("Mod", {floor, "c256"});
  }

  // Digit-wise sums or products with columns below 2^20, carried into digits mod 2^64: each half of four digits
  // as one number (below 2^45), the low half's carry added to the high half, the high half's own carry dropped.
  std::string normalize(const std::string& columns) {
    const std::string lo = op("Slice", {columns, "start", "middle", "axis1"});
    const std::string hi = op("Slice", {columns, "middle", "end", "axis1"});
    const std::map<std::string, Attribute> keep{{"keepdims", int64_t{1}}};
    const std::string lo_value = op("ReduceSum", {op("Mul", {lo, "place4"}), "axis1"}, keep);
    const std::string hi_value = op("Add", {op("ReduceSum", {op("Mul", {hi, "place4"}), "axis1"}, keep),
                                            op("Div", {lo_value, "c2p32"})});
    return op("Concat", {op("Mod", {op("Div", {lo_value, "place4"}), "c256"}),
                         op("Mod", {op("Div", {hi_value, "place4"}), "c256"})},
              {{"axis", int64_t{1}}});
  }

  std::string add_words(const std::string& a, const std::string& b) { return normalize(op("Add", {a, b})); }

  // a * c mod 2^64: column k of the schoolbook product is sum_{j <= k} a[j] c[k - j] (at most 8 * 255^2 < 2^19).
  std::string mul_const(const std::string& a, uint64_t c) {
    const std::array<int64_t, 8> cd = digits_of(c);
    std::vector<int64_t> table(64, 0);  // [j, k] = c[k - j], zero below the diagonal
    for (int j = 0; j < 8; ++j)
      for (int k = j; k < 8; ++k) table[static_cast<size_t>(8 * j + k)] = cd[static_cast<size_t>(k - j)];
    const std::string c_table = ints(fresh("times"), {8, 8}, table);
    const std::string products = op("Mul", {op("Unsqueeze", {a, "axis2"}), c_table});  // [m, 8, 8]
    return normalize(op("ReduceSum", {products, "axis1"}, {{"keepdims", int64_t{0}}}));
  }

  std::string xor_words(const std::string& a, const std::string& b) {
    const std::string key = op("Add", {op("Mul", {a, "c256"}), b});
    return op("Gather", {"xor_table", key}, {{"axis", int64_t{0}}});
  }

  // a >> s (logical). Digit k reads digits k + q and k + q + 1, which are zero past the last: the gathers clamp
  // the index and a weight of zero drops the digit.
  std::string shift_right(const std::string& a, int s) {
    const int q = s / 8, r = s % 8;
    std::vector<int64_t> lo_index, lo_weight, hi_index, hi_weight;
    for (int k = 0; k < 8; ++k) {
      lo_index.push_back(std::min(k + q, 7));
      lo_weight.push_back(k + q <= 7 ? 1 : 0);
      hi_index.push_back(std::min(k + q + 1, 7));
      hi_weight.push_back(k + q + 1 <= 7 ? int64_t{1} << (8 - r) : 0);
    }
    const std::string stem = fresh("shr" + std::to_string(s));
    const std::map<std::string, Attribute> on_digits{{"axis", int64_t{1}}};
    const std::string lo = op("Gather", {a, ints(stem + "_lo_index", {8}, lo_index)}, on_digits);
    const std::string hi = op("Gather", {a, ints(stem + "_hi_index", {8}, hi_index)}, on_digits);
    const std::string lo_part = op("Mul", {op("Div", {lo, scalar(stem + "_low_unit", int64_t{1} << r)}),
                                           ints(stem + "_lo_weight", {8}, lo_weight)});
    const std::string hi_part =
        op("Mul", {op("Mod", {hi, stem + "_low_unit"}), ints(stem + "_hi_weight", {8}, hi_weight)});
    return op("Add", {lo_part, hi_part});
  }

  std::string splitmix64(const std::string& word) {
    const std::array<int64_t, 8> g = digits_of(kGamma);
    std::string z = add_words(word, ints(fresh("gamma"), {8}, std::vector<int64_t>(g.begin(), g.end())));
    z = mul_const(xor_words(z, shift_right(z, 30)), kMul1);
    z = mul_const(xor_words(z, shift_right(z, 27)), kMul2);
    return xor_words(z, shift_right(z, 31));
  }

  // The value of a word below 2^63 (the final 53 bits), as one int64 column [m].
  std::string value(const std::string& word) {
    return op("ReduceSum", {op("Mul", {word, "place8"}), "axis1"}, {{"keepdims", int64_t{0}}});
  }

  std::string op(const std::string& type, std::vector<std::string> in, std::map<std::string, Attribute> attrs = {}) {
    return add(f_, type, std::move(in), fresh(type), std::move(attrs));
  }

  std::string fresh(const std::string& stem) { return stem + "_" + std::to_string(next_++); }

  std::string scalar(const std::string& name, int64_t v) {
    return add(f_, "Constant", {}, name, {{"value", TensorData::scalar<int64_t>(v)}});
  }

  std::string ints(const std::string& name, std::vector<int64_t> dims, const std::vector<int64_t>& v) {
    return add(f_, "Constant", {}, name, {{"value", TensorData::from<int64_t>(std::move(dims), std::span(v))}});
  }

 private:
  // xor_table[256 a + b] = a ^ b = sum over bits k of ((bit_k(a) + bit_k(b)) mod 2) 2^k, for a, b < 256.
  void xor_table() {
    std::vector<int64_t> bytes(256), bits(8);
    for (int v = 0; v < 256; ++v) bytes[static_cast<size_t>(v)] = v;
    for (int k = 0; k < 8; ++k) bits[static_cast<size_t>(k)] = int64_t{1} << k;
    ints("bytes", {256, 1}, bytes);
    ints("bit_values", {8}, bits);
    scalar("c2", 2);
    const std::string bit = op("Mod", {op("Div", {"bytes", "bit_values"}), "c2"});  // [256, 8]
    const std::string a_bits = op("Unsqueeze", {bit, "axis1"});                       // [256, 1, 8]
    const std::string b_bits = op("Unsqueeze", {bit, ints("axis0", {1}, {0})});      // [1, 256, 8]
    const std::string differ = op("Mod", {op("Add", {a_bits, b_bits}), "c2"});       // [256, 256, 8]
    const std::string table =
        op("ReduceSum", {op("Mul", {differ, "bit_values"}), "axis2"}, {{"keepdims", int64_t{0}}});  // [256, 256]
    add(f_, "Reshape", {table, ints("flat", {1}, {-1})}, "xor_table");
  }

  Function& f_;
  int next_ = 0;
};

}  // namespace

Function dropout_mask_function() {
  Function f = fused_body::function(
      "DropoutMask", {"x", "counter"}, {"mask"},
      "LoRA adapter dropout's mask (bool, x's shape) for the int64 scalar counter (the training step), with "
      "attributes seed (int) and ratio (float): run = splitmix64(splitmix64(seed) ^ counter), element i "
      "(row-major) is kept when (splitmix64(run + i) >> 11) * 2^-53 >= ratio. 64-bit words are computed as "
      "base-256 digits in int64, exactly; needs opset 14 (Reshape's allowzero).",
      {"ratio", "seed"});
  DigitBody d(f);
  // seed and ratio come from the calling node by reference (add_lora_dropout always sets both: a body has no
  // attribute defaults).
  fused_body::caller_attribute(f, "seed", "seed", fused_body::kInt);
  fused_body::caller_attribute(f, "ratio", "ratio", fused_body::kFloat);
  const std::string column = d.ints("column", {2}, {1, 1});
  const std::string key = d.splitmix64(d.from_int64(d.op("Reshape", {"seed", column})));
  const std::string run = d.splitmix64(d.xor_words(key, d.from_int64(d.op("Reshape", {"counter", column}))));

  // One row of digits per element of x: run + i for i = 0 .. size(x) - 1.
  const std::string index = d.op("Range", {d.scalar("zero", 0), d.op("Size", {"x"}), d.scalar("one", 1)});
  const std::string indices = d.op("Unsqueeze", {index, "axis1"});
  const std::string drawn = d.splitmix64(d.add_words(d.from_int64(indices), run));

  // u = (drawn >> 11) * 2^-53, in double as the kernel computes it (exact: below 2^53, times a power of two).
  const std::map<std::string, Attribute> to_double{{"to", int64_t{static_cast<int64_t>(DType::Float64)}}};
  const std::string top53 = d.op("Cast", {d.value(d.shift_right(drawn, 11))}, to_double);
  add(f, "Constant", {}, "two_pow_minus53", {{"value", TensorData::scalar<double>(0x1.0p-53)}});
  const std::string u = d.op("Mul", {top53, "two_pow_minus53"});
  const std::string keep = d.op("GreaterOrEqual", {u, d.op("Cast", {"ratio"}, to_double)});
  add(f, "Reshape", {keep, d.op("Shape", {"x"})}, "mask", {{"allowzero", int64_t{1}}});
  return f;
}

}  // namespace onnxtrain
