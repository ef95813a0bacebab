#pragma once
// The window geometry of Conv, ConvTranspose and pooling, parsed and validated once for the CPU kernels
// (executor/cpu/conv.cpp) and their CUDA twins (executor/cuda/conv.cu). Every op is canonicalised to three
// spatial dims (1-D and 2-D get leading dims of size 1 with kernel 1, stride 1, no padding).
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "executor/kernel.h"

namespace onnxtrain::ops {

inline constexpr int kMaxSpatial = 3;
using Dims3 = std::array<int64_t, kMaxSpatial>;

// One convolution or pooling window geometry, spatial dims right-aligned into three.
struct Geo {
  int64_t N = 0, C = 0, M = 0, G = 1;  // batch, input channels, output channels, groups
  size_t rank = 0;                     // number of real spatial dims
  Dims3 in{1, 1, 1}, out{1, 1, 1}, k{1, 1, 1}, s{1, 1, 1}, d{1, 1, 1}, pb{0, 0, 0}, pe{0, 0, 0};
  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
  int64_t k_size() const { return k[0] * k[1] * k[2]; }
};

// Attribute list `name` with `n` entries (or `fallback` repeated when absent); fails naming the attribute.
std::vector<int64_t> spatial_attr(const PrepareContext& ctx, const std::string& name, size_t n, int64_t fallback);

// Reads kernel/stride/dilation/pads (and auto_pad) for a forward window op over `x_shape` and fills g's spatial
// dims (`ceil_mode` applies to pooling only).
void window_geometry(const PrepareContext& ctx, const std::vector<int64_t>& x_shape, const std::vector<int64_t>& kernel,
                     bool ceil_mode, Geo& g);

// [N, channels, out...]
std::vector<int64_t> out_shape(const Geo& g, int64_t channels);

// Conv (and ConvGrad) with X at input xi and W at input xi + 1.
Geo conv_geometry(const PrepareContext& ctx, size_t xi);

// ConvTranspose: `in` is X's spatial dims and `out` Y's, M = W.shape[1] * group. right_pad is the end padding
// that gives exactly Y's size (output_padding and output_shape folded in; negative when Y is longer).
Geo conv_transpose_geometry(const PrepareContext& ctx, Dims3& right_pad);

// MaxPool / AveragePool (and their gradients) with X at input xi.
Geo pool_geometry(const PrepareContext& ctx, size_t xi = 0);

// The fused gradients (ConvGrad, AveragePoolGrad): their function bodies read the geometry from explicit
// attributes (as tensors, by Constant value_ints references), so auto_pad must be resolved and `attrs` given.
// Fails naming what is missing.
void require_explicit(const PrepareContext& ctx, std::initializer_list<const char*> attrs);

// Which of a gradient node's (up to three) outputs are named; an omitted optional output is not computed.
std::array<bool, 3> wanted_outputs(const PrepareContext& ctx);

// The divisor of AveragePool's window at output o.
int64_t avg_pool_count(const Geo& g, const Dims3& o, bool include_pad);

}  // namespace onnxtrain::ops
