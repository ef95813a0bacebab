#pragma once
// onnxtrain's own float32 convolutions for AVX-512 CPUs: forward, backward data and backward weights, with no heap
// allocation per call.
//
// Why not oneDNN, which they replace for the geometries they take: every oneDNN primitive execute builds its
// argument map on the heap (5 operator new per execute, 17 executes in a W2 step), so a CNN's training step was
// never free of allocations. These kernels run at the speed of oneDNN's jit convolutions on W2's layers
// (docs/performance.md, "Convolutions of our own").
//
// How: the activations are copied into a zero-padded channels-last buffer per image, where every tap of the
// window is a fixed offset, and a register tile of 14 output pixels x 32 output channels sums over the taps and
// channels (the GEMM's 14 x 32 tile, with the im2col matrix never built). Backward data is the same forward
// convolution of the padded dY with the kernel flipped (stride 1), or else a product per output pixel whose columns
// are (tap, input channel) pairs, scattered into the padded dX. Backward weights is a tile of 14 (tap, input
// channel) rows x 32 output channels summing over every output pixel, reading the same padded input and a
// channels-last copy of dY.
//
// A depthwise convolution (groups = input channels = output channels) has one channel per group, which would fill
// one lane of the tiles' 16: its kernels run the vectors along the channels instead, in the same buffers (8 output
// pixels x 16 channels per tile; dW by tiles of 12 taps x 16 channels).
#include <array>
#include <cstdint>
#include <vector>

#include "executor/ops/conv_geometry.h"

namespace onnxtrain::cpu {

using ops::Dims3;
using ops::Geo;
using ops::kMaxSpatial;

class DirectConv {
 public:
  // True when this build has the kernels (AVX-512F) and they take g: no negative pads, a non-empty problem, and
  // 8 output channels per group (fewer would leave most of each vector idle), or a depthwise convolution of 8 or more
  // channels.
  static bool supports_forward(const Geo& g);
  // Backward data takes any such geometry with 8 input channels per group; backward weights needs 8 output channels
  // per group, like the forward pass. supports_backward: the directions a ConvGrad wants (dB
  // always comes along).
  static bool supports_backward_data(const Geo& g);
  static bool supports_backward_weights(const Geo& g);
  static bool supports_backward(const Geo& g, bool dx, bool dw);

  explicit DirectConv(const Geo& g);

  // y = conv(x, w) + b (b may be null); x [N, C, in...], w [M, C/G, k...], y [N, M, out...].
  void forward(const float* x, const float* w, const float* b, float* y);
  // dx = the gradient of conv(x, w) with respect to x, given dy.
  void backward_data(const float* dy, const float* w, float* dx);
  // dw and db (either may be null) from dy and x.
  void backward_weights(const float* dy, const float* x, float* dw, float* db);
  // Any of dx, dw, db (null: not wanted) in one pass over the images; dx needs supports_backward_data.
  void backward(const float* dy, const float* x, const float* w, float* dx, float* dw, float* db);

 private:
  // Backward weights' tiles of dW rows (tap, input channel), within one group: each row's offset in the padded
  // input, and whether they are consecutive (then the tile reads them as one run).
  struct RowTile {
    int64_t group = 0, first = 0;  // the first row: tap * (C / G) + channel
    int rows = 0;
    bool consecutive = false;
    std::array<int64_t, 14> off{};
  };

  Geo g_;
  std::vector<RowTile> row_tiles_;
  std::vector<int64_t> forward_off_, flipped_off_;  // each tap's offset in the padded buffers (x's, dY's)
  std::vector<float> packed_;  // the weights in the tile's panel layout, repacked by every call (they change)
  bool depthwise_ = false;     // one channel per group, as many groups as channels: vectors along the channels
};

}  // namespace onnxtrain::cpu
