#pragma once
// The window arithmetic of ONNX's Conv, ConvTranspose and pooling ops for one spatial dim, written once for the
// gradient rules (gradients/rules/conv.cpp) and the kernels' geometry (executor/ops/conv_geometry.cpp, which
// the CUDA kernels share). Callers validate attributes and name the node in their errors.
#include <cstdint>
#include <optional>
#include <string_view>

namespace onnxtrain {

// NOTSET, SAME_UPPER, SAME_LOWER or VALID.
bool is_auto_pad(std::string_view auto_pad);

struct WindowDim {
  int64_t out = 0;  // the output size; <= 0 when the window does not fit the input
  int64_t pad_begin = 0, pad_end = 0;
};

// Conv and pooling over an input of size `in` with a window of extent `ext` ((kernel - 1) * dilation + 1):
// SAME_* pad so that out = ceil(in / stride), the odd unit at the end for SAME_UPPER and at the start for
// SAME_LOWER; VALID pads nothing; NOTSET takes the explicit pads and, with ceil_mode (pooling), rounds the
// output up as long as the last window starts inside the input or its leading pad.
WindowDim forward_window(int64_t in, int64_t ext, int64_t stride, int64_t pad_begin, int64_t pad_end,
                         std::string_view auto_pad, bool ceil_mode = false);

// ConvTranspose: with output_shape or SAME_*, the total padding that gives the requested output (in * stride
// for SAME_*) split as above (NOTSET and VALID with output_shape split like SAME_LOWER, as the spec's
// reference does); a requested output longer than the full result leaves pad_begin 0 and a negative pad_end
// (the tail holds only the bias). Otherwise out = stride (in - 1) + output_padding + ext - pads, with VALID's
// pads zero.
WindowDim transposed_window(int64_t in, int64_t ext, int64_t stride, int64_t output_padding, int64_t pad_begin,
                            int64_t pad_end, std::string_view auto_pad, std::optional<int64_t> output_shape);

}  // namespace onnxtrain
