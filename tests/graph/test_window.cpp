// graph/window.h: ONNX's window arithmetic, against sizes worked out by hand from the operator specs
// (Conv/MaxPool: auto_pad and ceil_mode; ConvTranspose: output_padding, output_shape and SAME_*).
#include <gtest/gtest.h>

#include "graph/window.h"

namespace onnxtrain {
namespace {

void expect(const WindowDim& w, int64_t out, int64_t pb, int64_t pe) {
  EXPECT_EQ(w.out, out);
  EXPECT_EQ(w.pad_begin, pb);
  EXPECT_EQ(w.pad_end, pe);
}

TEST(Window, SamePadsToCeilOfInputOverStrideWithTheOddUnitPlacedByTheMode) {
  // in 5, kernel 3, stride 2: out = ceil(5/2) = 3, total pad = (3-1)*2 + 3 - 5 = 2.
  expect(forward_window(5, 3, 2, 0, 0, "SAME_UPPER"), 3, 1, 1);
  // in 4: out 2, total pad (2-1)*2 + 3 - 4 = 1, at the end for SAME_UPPER, at the start for SAME_LOWER.
  expect(forward_window(4, 3, 2, 0, 0, "SAME_UPPER"), 2, 0, 1);
  expect(forward_window(4, 3, 2, 0, 0, "SAME_LOWER"), 2, 1, 0);
  // Explicit pads are ignored under SAME_* and VALID.
  expect(forward_window(4, 3, 2, 7, 7, "SAME_LOWER"), 2, 1, 0);
  expect(forward_window(5, 3, 2, 7, 7, "VALID"), 2, 0, 0);
}

TEST(Window, ExplicitPadsAndCeilMode) {
  expect(forward_window(5, 3, 1, 1, 1, "NOTSET"), 5, 1, 1);
  // in 5, kernel 2, stride 2: floor((5-2)/2)+1 = 2 windows, ceil gives 3 (the last starts at 4, inside).
  expect(forward_window(5, 2, 2, 0, 0, "NOTSET"), 2, 0, 0);
  expect(forward_window(5, 2, 2, 0, 0, "NOTSET", true), 3, 0, 0);
  // in 4 with end pad 1: ceil((4+1-2)/2)+1 = 3, but that window would start at 4, in the end pad only: 2.
  expect(forward_window(4, 2, 2, 0, 1, "NOTSET", true), 2, 0, 1);
  // VALID ignores ceil_mode: floor((5-2)/2)+1.
  expect(forward_window(5, 2, 2, 0, 0, "VALID", true), 2, 0, 0);
}

TEST(Window, AWindowLargerThanTheInputGivesNoOutput) {
  // in 2, extent 3: nothing fits, whatever the stride (C++ division would round (2-3)/2 up to 0, giving 1).
  EXPECT_LE(forward_window(2, 3, 2, 0, 0, "VALID").out, 0);
  EXPECT_LE(forward_window(2, 3, 2, 0, 0, "NOTSET").out, 0);
  EXPECT_EQ(forward_window(2, 3, 2, 0, 1, "NOTSET").out, 1);
}

TEST(Window, TransposedOutputFromPadsOutputPaddingOrTheRequestedShape) {
  // in 3, kernel 3, stride 2, output_padding 1: 2*(3-1) + 1 + 3 = 8, less the pads.
  expect(transposed_window(3, 3, 2, 1, 0, 0, "NOTSET", std::nullopt), 8, 0, 0);
  expect(transposed_window(3, 3, 2, 1, 1, 2, "NOTSET", std::nullopt), 5, 1, 2);
  expect(transposed_window(3, 3, 2, 1, 1, 2, "VALID", std::nullopt), 8, 0, 0);
  // SAME_*: out = in * stride = 6, total pad 2*2 + 0 + 3 - 6 = 1.
  expect(transposed_window(3, 3, 2, 0, 0, 0, "SAME_UPPER", std::nullopt), 6, 0, 1);
  expect(transposed_window(3, 3, 2, 0, 0, 0, "SAME_LOWER", std::nullopt), 6, 1, 0);
  // output_shape 7: total pad 2*2 + 3 - 7 = 0; output_shape 5: total 2, split as SAME_LOWER.
  expect(transposed_window(3, 3, 2, 0, 9, 9, "NOTSET", 7), 7, 0, 0);
  expect(transposed_window(3, 3, 2, 0, 9, 9, "NOTSET", 5), 5, 1, 1);
  // Longer than the full result (8 with output_padding 1): the tail beyond it is a negative end pad.
  expect(transposed_window(3, 3, 2, 1, 0, 0, "NOTSET", 10), 10, 0, -2);
}

TEST(Window, AutoPadValues) {
  for (const char* a : {"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"}) EXPECT_TRUE(is_auto_pad(a)) << a;
  EXPECT_FALSE(is_auto_pad("SAME"));
  EXPECT_FALSE(is_auto_pad(""));
}

}  // namespace
}  // namespace onnxtrain
