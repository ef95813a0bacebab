#include "executor/finite.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "executor/device.h"

namespace onnxtrain {

namespace {

// Half-precision formats: an all-ones exponent is Inf or NaN.
bool half_non_finite(uint16_t bits, uint16_t exponent_mask) { return (bits & exponent_mask) == exponent_mask; }

template <class T, class IsBad>
NonFiniteCount scan(const Tensor& t, IsBad bad) {
  NonFiniteCount c;
  const T* p = t.ptr<T>();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i)
    if (bad(p[i])) {
      if (c.count++ == 0) c.first = i;
    }
  return c;
}

// Whether any element has an all-ones exponent (Inf or NaN): a max over the masked bit patterns, which the
// compiler vectorises. The exact scan above branches on every element; the guard runs it on every gradient of
// every step (W1-sk: about 4% of the fit), so it now runs only once this finds something.
template <class T, class Bits>
bool any_all_ones_exponent(const Tensor& t, Bits mask) {
  const T* p = t.ptr<T>();
  const int64_t n = t.numel();
  Bits m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max<Bits>(m, std::bit_cast<Bits>(p[i]) & mask);
  return m == mask;
}

double element_as_double(const Tensor& t, int64_t i) {
  // One element across the edge (copy_bytes), wherever the tensor lives.
  auto at = [&]<class T>(T) {
    T v{};
    copy_bytes(&v, Device::CPU, static_cast<const char*>(t.data) + static_cast<size_t>(i) * sizeof(T), t.device, sizeof(T));
    return v;
  };
  switch (t.dtype) {
    case DType::Float32: return at(float{});
    case DType::Float64: return at(double{});
    default: {
      // Half formats are only ever reported here when non-finite: the sign and the mantissa decide.
      const uint16_t b = at(uint16_t{});
      const uint16_t mant = t.dtype == DType::Float16 ? (b & 0x03FF) : (b & 0x007F);
      if (mant) return std::nan("");
      return (b & 0x8000) ? -INFINITY : INFINITY;
    }
  }
}

}  // namespace

NonFiniteCount count_non_finite(const Tensor& t) {
  if (!t.data || !is_floating(t.dtype)) return {};
  // A device tensor is scanned on the host: exact, and device-neutral. It costs one download per guarded value
  // per step (docs/gpu.md says what this costs on a GPU).
  if (!host_accessible(t.device)) return count_non_finite(t.to(Device::CPU));
  switch (t.dtype) {
    case DType::Float32: if (!any_all_ones_exponent<float, uint32_t>(t, 0x7F800000u)) return {}; break;
    case DType::Float64: if (!any_all_ones_exponent<double, uint64_t>(t, 0x7FF0000000000000ull)) return {}; break;
    default: break;
  }
  switch (t.dtype) {
    case DType::Float32: return scan<float>(t, [](float v) { return !std::isfinite(v); });
    case DType::Float64: return scan<double>(t, [](double v) { return !std::isfinite(v); });
    case DType::Float16: return scan<uint16_t>(t, [](uint16_t b) { return half_non_finite(b, 0x7C00); });
    case DType::BFloat16: return scan<uint16_t>(t, [](uint16_t b) { return half_non_finite(b, 0x7F80); });
    default: return {};
  }
}

std::string describe_non_finite(const Tensor& t, const NonFiniteCount& c) {
  std::string s = std::to_string(c.count) + " of " + std::to_string(t.numel()) + " elements are NaN or Inf";
  if (c.first >= 0) {
    const double v = element_as_double(t, c.first);
    s += " (the first at flat index " + std::to_string(c.first) + " is " +
         (std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf") + ")";
  }
  return s;
}

}  // namespace onnxtrain
