// Gradient-check cases of the normalization op family (LRN, LpNormalization, MeanVarianceNormalization,
// Det, Shrink, CenterCropPad, Compress), appended to the table in rule_cases.cpp.
#include "gradients/rule_cases.h"

#include <span>

namespace onnxtrain::test {

void add_normalization_cases(std::vector<RuleCase>& v) {
  using I = std::vector<int64_t>;
  // Shrink's kinks (and, with a bias, jumps) sit at +-lambd: each case samples one side of them only.
  v.push_back(signed_(make("Shrink_outside", "Shrink", {{3, 4}}, {{"lambd", 0.5f}, {"bias", 0.3f}}, {{0.6, 2.0}}, 9)));
  v.push_back(make("Shrink_inside", "Shrink", {{3, 4}}, {{"lambd", 0.5f}, {"bias", 0.3f}}, {{-0.45, 0.45}}));
  v.push_back(signed_(make("Shrink_default_soft", "Shrink", {{3, 4}}, {}, {{0.6, 2.0}})));

  // LpNormalization: p = 1 has kinks at 0 (|x|), so its samples keep away from it.
  v.push_back(make("LpNormalization_p2_last", "LpNormalization", {{2, 3, 4}}, {}, {}, 9));
  v.push_back(make("LpNormalization_p2_axis1", "LpNormalization", {{2, 3, 4}}, {{"axis", int64_t{1}}, {"p", int64_t{2}}}));
  v.push_back(signed_(make("LpNormalization_p1_axis0", "LpNormalization", {{3, 4}},
                           {{"axis", int64_t{0}}, {"p", int64_t{1}}}, {{0.2, 1.0}}, 11)));

  // MeanVarianceNormalization: default axes [0, 2, 3] (per channel), and explicit axes.
  v.push_back(make("MeanVarianceNormalization_default", "MeanVarianceNormalization", {{2, 3, 2, 2}}, {}, {}, 9));
  v.push_back(make("MeanVarianceNormalization_last", "MeanVarianceNormalization", {{2, 3, 4}}, {{"axes", I{-1}}}, {}, 13));
  v.push_back(make("MeanVarianceNormalization_axes02", "MeanVarianceNormalization", {{3, 2, 4}}, {{"axes", I{0, 2}}}, {}, 18));

  // LRN: odd and even windows (the even one is asymmetric: one more channel after c than before). Large alpha
  // so the normalisation term matters.
  v.push_back(make("LRN_size3", "LRN", {{2, 5, 2, 2}}, {{"size", int64_t{3}}, {"alpha", 0.5f}, {"beta", 0.75f}, {"bias", 1.0f}},
                   {}, 13));
  v.push_back(make("LRN_size2_opset1", "LRN", {{1, 4, 3}}, {{"size", int64_t{2}}, {"alpha", 1.0f}, {"beta", 0.6f}, {"bias", 2.0f}},
                   {}, 12));
  v.push_back(make("LRN_size5_wider_than_C", "LRN", {{2, 3, 2, 1}}, {{"size", int64_t{5}}, {"alpha", 0.8f}}, {}, 17));

  // Det: entries in [0.5, 2] with random signs keep these small matrices away from singular ones on average;
  // the checker's relative tolerance covers the rest. 1x1, 2x2, batched 3x3 and 4x4.
  v.push_back(signed_(make("Det_1x1", "Det", {{1, 1}}, {}, {{0.5, 2.0}}, 11)));
  v.push_back(signed_(make("Det_2x2", "Det", {{2, 2}}, {}, {{0.5, 2.0}}, 11)));
  v.push_back(signed_(make("Det_batched_3x3", "Det", {{2, 3, 3}}, {}, {{0.5, 2.0}}, 13)));
  v.push_back(signed_(make("Det_4x4", "Det", {{4, 4}}, {}, {{0.5, 2.0}}, 17)));

  // CenterCropPad: crop and pad (odd and even differences) on different axes, all axes and listed ones.
  v.push_back(with_const(make("CenterCropPad_crop_and_pad", "CenterCropPad", {{5, 2, 3}, {3}}, {}, {}, 18), 1,
                         ints({2, 5, 3})));
  v.push_back(with_const(make("CenterCropPad_axes_negative", "CenterCropPad", {{2, 6, 3}, {2}}, {{"axes", I{-1, 1}}}, {}, 18),
                         1, ints({6, 3})));

  // Compress: along an axis (condition shorter than the axis: the rest is dropped), negative axis, flattened.
  // Opset 11: ONNX has no shape inference for Compress-9, and the checker needs the output's shape.
  v.push_back(with_const(make("Compress_axis0", "Compress", {{4, 3}, {3}}, {{"axis", int64_t{0}}}, {}, 11), 1,
                         bools({3}, {true, false, true})));
  v.push_back(with_const(make("Compress_axis_negative", "Compress", {{2, 4, 2}, {4}}, {{"axis", int64_t{-2}}}, {}, 11), 1,
                         bools({4}, {false, true, true, false})));
  v.push_back(with_const(make("Compress_flattened", "Compress", {{2, 3}, {5}}, {}, {}, 11), 1,
                         bools({5}, {true, false, false, true, true})));
}

}  // namespace onnxtrain::test
