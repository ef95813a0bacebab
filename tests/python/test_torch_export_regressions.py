"""Models exported by torch 2.x that once failed (issue 24, point 3), trained through the Yield boundary
(onnxtrain.torch.TrainModule runs ForwardBackwardSession.run_forward/run_backward) against torch autograd.

- CumSum whose axis comes from a Constant node: the Yield split used to treat the Constant's output as a saved
  activation, so the backward plan did not know the axis ("must be known before the step runs").
- nn.Upsample(scale_factor=2) at opset 17 writes Resize's scales as Concat(Constant, Constant) of floats: constant
  folding skipped floating-point values, the Resize rule refused the scales, and the next Conv's gradient lacked
  the spatial dims.
"""
import copy

import pytest
import torch
from torch import nn

import onnxtrain.torch as ott


class CumSumModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        return torch.cumsum(self.fc(x), dim=1).tanh()


class UpsampleConv(nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 3, 3, padding=1)
        self.up = nn.Upsample(scale_factor=2, mode=mode)
        self.conv2 = nn.Conv2d(3, 2, 3, padding=1)

    def forward(self, x):
        return self.conv2(self.up(torch.relu(self.conv1(x))))


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("make,shape", [
    (CumSumModel, (4, 6)),
    (lambda: UpsampleConv("nearest"), (2, 2, 5, 4)),
    (lambda: UpsampleConv("bilinear"), (2, 2, 5, 4)),
], ids=["cumsum_constant_axis", "upsample_nearest", "upsample_bilinear"])
def test_gradients_through_the_yield_boundary_match_torch(make, shape):
    torch.manual_seed(0)
    eager = make().train()
    wrapped = ott.TrainModule(copy.deepcopy(eager))
    x = torch.randn(*shape)
    target = torch.randn_like(eager(x))
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    for m, xi in zip((eager, wrapped), xs):
        ((m(xi) - target) ** 2).mean().backward()
    for (name, p), (_, q) in zip(eager.named_parameters(), wrapped.named_parameters()):
        assert q.grad is not None, name
        assert rel(q.grad, p.grad) < 1e-4, name
    assert rel(xs[1].grad, xs[0].grad) < 1e-4
