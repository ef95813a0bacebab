#pragma once
// Fused gradient ops of the onnxtrain domain. Our executor runs native kernels for them; every training
// graph that uses one also carries it as a model-local function whose body is standard ONNX (opset 17), so
// other runtimes can inline it.
//   ReluGrad(dY, Y)    = dY where Y > 0, else 0
//   SigmoidGrad(dY, Y) = dY * Y * (1 - Y)
//   TanhGrad(dY, Y)    = dY * (1 - Y * Y)
//   SoftmaxGrad(dY, Y)    = Y * (dY - sum(dY * Y, axis))     (attribute axis, opset 13 semantics: one axis;
//   LogSoftmaxGrad(dY, Y) = dY - exp(Y) * sum(dY, axis)       the bodies read it by reference, so rules
//                                                              always set it)
//   GeluGrad(dY, X)     = dY * (Phi(X) + X * phi(X))                   (Gelu, approximate='none')
//   GeluTanhGrad(dY, X) = dY * d/dx[X/2 (1 + tanh(k (X + 0.044715 X^3)))]  (Gelu, approximate='tanh')
// Inputs are (dY, Y) (or (dY, X)) of the same floating type and shape; the single output dX has that type
// and shape.
//   MaxPoolGrad(dY, X) -> dX, with MaxPool's attributes (kernel_shape, strides, pads, dilations, ceil_mode,
//   auto_pad): dY added at each window's first maximum. Its body refers to those attributes (ONNX
//   ref_attr_name) and scatters with ScatterElements(reduction='add'), so it needs opset 16.
//   ConvGrad(dY, X, W) -> (dX, dW, dB) and AveragePoolGrad(dY, X) -> dX, with the forward op's attributes
//   (explicit pads, no auto_pad): bodies in gradients/fused_conv.cpp, which document them.
//   LayerNormalizationGrad(dY, X, Scale, Mean, InvStdDev) -> (dX, dScale, dBias), attribute axis: an exception
//   to the (dY, Y) -> dX form. Mean and InvStdDev are LayerNormalization's optional outputs (one per row);
//   Scale has the normalised shape (X's dims from axis on). The body (gradients/fused_norm.cpp) flattens at
//   the referenced axis, so it serves every axis; rules always set axis (a body has no attribute defaults).
//   BatchNormalizationGrad(dY, X, Scale) -> (dX, dScale, dBias), attribute epsilon: training-mode
//   BatchNormalization through Y, X (N, C, ...), Scale [C]. The batch statistics are recomputed from X
//   (opset 14+ BatchNormalization does not output them), in the kernel's two read passes per channel. The
//   body needs opset 15 (CastLike, Shape's start/end); rules always set epsilon.
//   GatherGrad(dY, indices, shape) -> dX, with Gather's axis (required): dY added into zeros of `shape` at the
//   gathered positions (Gather's data gradient; repeated and negative indices allowed). Body needs opset 16.
//   SumToShape(dY, shape) -> dX: dY summed back to `shape` after numpy broadcasting; the engine emits it where
//   symbolic dims leave open whether an input was broadcast. Both bodies: gradients/fused_gather.cpp.
//   MaxRoiPoolGrad(dY, X, rois) -> dX with MaxRoiPool's pooled_shape and spatial_scale (rules always set
//   both): each dY added at its bin's first maximum. Body in gradients/fused_spatial.cpp, valid from opset 13.
//   GridSampleGrad(dY, X, grid) -> (dX, dGrid) with GridSample's attributes plus the ints its body reads
//   (interpolation 0/1/2 = linear/nearest/cubic, padding 0/1/2 = zeros/border/reflection, align_corners; the
//   rule writes them, the kernel checks that they agree with the strings). Body in gradients/fused_spatial.cpp,
//   every rank, mode and padding; needs opset 16, as GridSample.
//   RNNGrad(X, W, R, B, sequence_lens, initial_h, dY, dY_h) -> (dX, dW, dR, dB, -, dinitial_h), attribute
//   hidden_size, RNN's others, and what the rule always writes for the body: layout, reverse (0/1),
//   clip_bound (the clip, or the largest float for none) and the activation functions as ints and floats
//   (activation_kinds, activation_alphas, activation_betas; the kernel checks that they agree with the strings).
//   Body in gradients/fused_recurrent.cpp for everything RNN defines: every direction, sequence_lens or none,
//   layout 0 or 1, clip or none, every activation; B and the initial state required (the rule passes zeros);
//   fused_body_refusal() names what a node lacks. GRUGrad, the same inputs and outputs, likewise
//   (linear_before_reset read by reference), and
//   LSTMGrad(X, W, R, B, sequence_lens, initial_h, initial_c, P, dY, dY_h, dY_c) -> (dX, dW, dR, dB, -,
//   dinitial_h, dinitial_c, dP) (peepholes P required, input_forget 0 or 1 read by reference).
// Not a gradient but in the same domain and list, since the training graphs carry it the same way:
//   DropoutMask(x, counter) -> mask, attributes seed (int) and ratio (float): LoRA adapter dropout's
//   counter-based mask (training/adapters.h). Its body (gradients/fused_dropout.cpp) computes the kernel's bits
//   exactly, in int64 base-256 digits; needs opset 14. add_lora_dropout always sets both attributes.
#include <string>
#include <utility>
#include <vector>

#include "graph/ir.h"

namespace onnxtrain {

inline constexpr const char* kFusedGradDomain = "onnxtrain";

// Function bodies for every fused gradient op, in domain kFusedGradDomain, importing ai.onnx opset 17.
std::vector<Function> fused_grad_functions();
void add_gather_grad_functions(std::vector<Function>& out);  // GatherGrad, SumToShape (fused_gather.cpp)

// The convolution family's bodies (gradients/fused_conv.cpp), part of fused_grad_functions().
std::vector<Function> fused_conv_functions();

// DropoutMask's body (gradients/fused_dropout.cpp), part of fused_grad_functions().
Function dropout_mask_function();

// Why the standard-ONNX function body of fused op node `n` would not compute what its native kernel computes,
// naming the attribute or input at fault; "" when it would (and for ops with no body). The recurrent grads'
// bodies serve everything the ONNX ops define, given the inputs the rules pass and the attributes they write (the
// int reverse = 1 exactly for 'reverse', clip_bound equal to clip, the activation functions coded F per direction;
// gradients/fused_recurrent.cpp); GridSampleGrad's and
// MaxRoiPoolGrad's need the attributes their rules always write. TrainingSession::export_gradient_model refuses
// a gradient graph holding such a node.
std::string fused_body_refusal(const Node& n);

// The forward ops whose gradient rules emit each fused op: (forward ai.onnx op, fused op). docs/ops.md lists
// these; a test checks that every fused op named here has a body and a CPU kernel.
std::vector<std::pair<std::string, std::string>> fused_grad_uses();

}  // namespace onnxtrain
