"""The binding's DLPack input path and ForwardBackwardSession.bind_weight, which onnxtrain.torch builds on."""
import io
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import onnxtrain as ot


@pytest.fixture(scope="module")
def linear_model():
    torch.manual_seed(0)
    m = nn.Linear(3, 2)
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.randn(4, 3),), f, dynamo=False, input_names=["x"], do_constant_folding=False,
                          training=torch.onnx.TrainingMode.TRAINING)
    return m, f.getvalue()


def test_torch_tensors_are_fed_through_dlpack(linear_model):
    m, model = linear_model
    s = ot.ForwardBackwardSession(model, inputs_requiring_grad=["x"])
    x = torch.randn(4, 3)
    (y,) = s.run_forward({"x": x})
    assert torch.allclose(torch.from_dlpack(y), m(x).detach(), atol=1e-6)
    strided = torch.randn(3, 4).T  # not C-contiguous: copied once, same result
    (y2,) = s.run_forward({"x": strided})
    assert torch.allclose(torch.from_dlpack(y2), m(strided).detach(), atol=1e-6)
    with pytest.raises(TypeError, match="input 'x': expected dtype float32, got float64"):
        s.run_forward({"x": torch.randn(4, 3, dtype=torch.float64)})
    grads = s.run_backward([torch.ones(4, 2)])
    assert torch.allclose(torch.from_dlpack(grads["weight"]), torch.ones(4, 2).T @ strided, atol=1e-6)


def test_bound_weight_is_read_in_place(linear_model):
    m, model = linear_model
    s = ot.ForwardBackwardSession(model, device="cpu")  # bound memory is the torch tensor's: host memory
    w = m.weight.detach().clone()
    s.bind_weight("weight", w)
    x = torch.randn(4, 3)
    with torch.no_grad():
        w.mul_(3.0)  # no set_weight: the session reads w's memory
        ref = x @ w.T + m.bias
    (y,) = s.run_forward({"x": x})
    assert torch.allclose(torch.from_dlpack(y), ref, atol=1e-6)
    s.set_weight("weight", np.zeros((2, 3), np.float32))  # writes through into the bound tensor
    assert torch.count_nonzero(w) == 0


def test_bind_weight_errors(linear_model):
    _, model = linear_model
    s = ot.ForwardBackwardSession(model, trainable=["weight"])
    with pytest.raises(TypeError, match="weight 'weight': binding needs a C-contiguous"):
        s.bind_weight("weight", torch.zeros(3, 2).T)
    with pytest.raises(ot.OnnxtrainError, match=r"weight 'weight': expected float32\[2,3\], got float32\[3,2\]"):
        s.bind_weight("weight", torch.zeros(3, 2))
    with pytest.raises(TypeError, match="weight 'weight': expected dtype float32"):
        s.bind_weight("weight", torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ot.OnnxtrainError, match="weight 'bias': is not a trainable weight"):
        s.bind_weight("bias", torch.zeros(2))
    # A session on another device cannot read host memory in place (on the guarded test device as on a GPU).
    g = ot.ForwardBackwardSession(model, trainable=["weight"], device="guarded")
    with pytest.raises(ot.OnnxtrainError, match="weight 'weight': the session runs on guarded; bound memory must be there"):
        g.bind_weight("weight", torch.zeros(2, 3))
