#include "graph/window.h"

#include <algorithm>

namespace onnxtrain {

bool is_auto_pad(std::string_view a) { return a == "NOTSET" || a == "SAME_UPPER" || a == "SAME_LOWER" || a == "VALID"; }

WindowDim forward_window(int64_t in, int64_t ext, int64_t s, int64_t pb, int64_t pe, std::string_view auto_pad,
                         bool ceil_mode) {
  WindowDim w;
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    w.out = (in + s - 1) / s;
    const int64_t total = std::max<int64_t>(0, (w.out - 1) * s + ext - in), small = total / 2;
    w.pad_begin = auto_pad == "SAME_UPPER" ? small : total - small;
    w.pad_end = total - w.pad_begin;
    return w;
  }
  if (auto_pad != "VALID") {
    w.pad_begin = pb;
    w.pad_end = pe;
  }
  const int64_t span = in + w.pad_begin + w.pad_end - ext;
  if (span < 0) return w;  // out = 0: the window does not fit
  if (!ceil_mode || auto_pad == "VALID") {  // VALID's output is floor((in - ext) / s) + 1 in any mode
    w.out = span / s + 1;
  } else {
    w.out = (span + s - 1) / s + 1;
    if ((w.out - 1) * s >= in + w.pad_begin) --w.out;  // the last window must start inside the input or its pad
  }
  return w;
}

WindowDim transposed_window(int64_t in, int64_t ext, int64_t s, int64_t opad, int64_t pb, int64_t pe,
                            std::string_view auto_pad, std::optional<int64_t> output_shape) {
  WindowDim w;
  if (output_shape || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    w.out = output_shape ? *output_shape : in * s;
    const int64_t total = s * (in - 1) + opad + ext - w.out, t = std::max<int64_t>(total, 0);
    w.pad_begin = auto_pad == "SAME_UPPER" ? t / 2 : t - t / 2;
    w.pad_end = total < 0 ? total : t - w.pad_begin;
    return w;
  }
  if (auto_pad != "VALID") {
    w.pad_begin = pb;
    w.pad_end = pe;
  }
  w.out = s * (in - 1) + opad + ext - w.pad_begin - w.pad_end;
  return w;
}

}  // namespace onnxtrain
