"""A torch.nn.Module whose forward and backward run in onnxtrain (docs/torch.md).

    model = onnxtrain.torch.TrainModule(model)     # the one changed line of a PyTorch training script

The first call with a new signature (input shapes, dtypes, which inputs require grad, the train/eval mode of every
submodule, non-tensor arguments) exports the module with ``torch.onnx.export`` and builds a
``ForwardBackwardSession``; later calls with that signature reuse it. The forward runs in onnxtrain; a
``torch.autograd.Function`` hands the output gradients to ``run_backward`` and returns the parameters' and
inputs' gradients to autograd, so they accumulate in ``Parameter.grad`` and any torch optimizer, clipping,
scheduler or DistributedDataParallel hook works unchanged. Tensors cross by DLPack without copies; each
trainable parameter is bound into the session's weight store as a view of its storage, so ``optimizer.step()``
is seen by the next forward with no export and no copy.
"""
from __future__ import annotations

import contextlib
import io
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree

from . import OnnxtrainError, _onnxtrain

__all__ = ["TrainModule", "ExportError"]

_PREFIX = "module."  # the flat wrapper registers the user's module under this name
_FLOAT = (torch.float16, torch.float32, torch.float64, torch.bfloat16)


class ExportError(RuntimeError):
    """The module could not be exported or differentiated; the message names the module and the op."""


def _to_torch(a: np.ndarray) -> torch.Tensor:
    return torch.from_dlpack(a)  # the numpy array owns the native tensor; torch shares it


class _Flat(nn.Module):
    """The user's module called with flat tensor arguments (the rest of args/kwargs are fixed), returning the
    tensor leaves of its output; what torch.onnx.export sees."""

    def __init__(self, module: nn.Module, leaves: list, tensor_at: list[int], spec: pytree.TreeSpec):
        super().__init__()
        self.module = module
        self._leaves, self._tensor_at, self._spec = leaves, tensor_at, spec
        self.out_spec: pytree.TreeSpec | None = None
        self.out_tensor_at: list[int] = []
        self.out_constants: list = []

    def forward(self, *tensors):
        leaves = list(self._leaves)
        for i, t in zip(self._tensor_at, tensors):
            leaves[i] = t
        args, kwargs = pytree.tree_unflatten(leaves, self._spec)
        out_leaves, self.out_spec = pytree.tree_flatten(self.module(*args, **kwargs))
        self.out_tensor_at = [i for i, v in enumerate(out_leaves) if isinstance(v, torch.Tensor)]
        self.out_constants = [None if isinstance(v, torch.Tensor) else v for v in out_leaves]
        return tuple(out_leaves[i] for i in self.out_tensor_at)


@dataclass
class _BatchNormStats:
    module: nn.modules.batchnorm._BatchNorm
    mean_out: int  # indices among the session's outputs
    var_out: int
    count: int  # elements per channel in the batch (the unbiased-variance correction)


@dataclass
class _Compiled:
    """One exported signature: the session and how torch values map onto its names."""
    session: Any
    inputs: list[str | None]  # ONNX input name per tensor leaf (None: the graph does not read it)
    fed: list[tuple[str, str]]  # (ONNX input name, torch name) of buffers and frozen parameters, fed each call
    trainable: list[tuple[str, str]]  # (ONNX initializer, torch parameter name), bound into the weight store
    n_user_outputs: int
    out_spec: Any
    out_tensor_at: list[int]
    out_constants: list
    differentiable: list[bool]
    batch_norms: list[_BatchNormStats]
    bound: dict = field(default_factory=dict)  # torch name -> (parameter, data_ptr) of the bound storage
    copied: set = field(default_factory=set)  # parameters that cannot be bound (strided): set_weight on change
    versions: dict = field(default_factory=dict)
    forward_id: int = 0


class _Apply(torch.autograd.Function):
    @staticmethod
    def forward(ctx, owner, compiled, n_inputs, *tensors):
        outs = owner._run_forward(compiled, tensors[:n_inputs], tensors[n_inputs:])
        ctx.owner, ctx.compiled, ctx.n_inputs = owner, compiled, n_inputs
        ctx.forward_id = compiled.forward_id
        ctx.inputs = tensors[:n_inputs]
        ctx.params = tensors[n_inputs:]
        ctx.versions = [p._version for p in ctx.params]
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*[o for o, d in zip(outs, compiled.differentiable) if not d])
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        c: _Compiled = ctx.compiled
        for (_, name), p, v in zip(c.trainable, ctx.params, ctx.versions):
            if p._version != v:
                raise RuntimeError(f"onnxtrain.torch: parameter '{name}' needed for the gradient was modified in place "
                                   "between forward and backward")
        if c.forward_id != ctx.forward_id:
            # Another forward with this signature ran since (gradient accumulation, two passes before one
            # backward): the session keeps only the last pass's activations, so recompute this one.
            ctx.owner._run_forward(c, ctx.inputs, ctx.params)
        out_grads = [g.detach().contiguous() if g is not None and d else None for g, d in zip(grads, c.differentiable)]
        result = ctx.owner._call(c, "backward", lambda: c.session.run_backward(out_grads))
        input_grads = [None if name is None or name not in result else _to_torch(result[name]) for name in c.inputs]
        input_grads = [g if t.requires_grad else None for g, t in zip(input_grads, ctx.inputs)]
        param_grads = [_to_torch(result[onnx]) for onnx, _ in c.trainable]
        return (None, None, None, *input_grads, *param_grads)


@contextlib.contextmanager
def _untouched(module: nn.Module):
    """Runs the module (to trace it, or probe it) without a trace: its buffers (BatchNorm statistics, counters) and
    torch's random state are restored afterwards."""
    saved = [(b, b.detach().clone()) for b in module.buffers()]
    rng = torch.get_rng_state()
    try:
        yield
    finally:
        with torch.no_grad():
            for b, v in saved:
                b.copy_(v)
        torch.set_rng_state(rng)


def _module_of_node(message: str) -> str | None:
    """torch's exporter names nodes by module scope ('/encoder/layers.0/attn/MatMul'); the module path of the first
    such node name in an error message."""
    m = re.search(r"'(/[^' ]*)/[A-Za-z_]+(?:_\d+)?'", message)
    if not m:
        return None
    path = m.group(1).strip("/").replace("/", ".")
    return path[len(_PREFIX):] if path.startswith(_PREFIX) else path or None


def _name_outputs(g) -> None:
    """Renames the graph's outputs 'output_<i>' (torch numbers them by trace order) so errors read well."""
    inputs = {i.name for i in g.input}
    for i, out in enumerate(g.output):
        old, new = out.name, f"output_{i}"
        if old in inputs or any(o.name == new for o in g.output):
            continue
        for node in g.node:
            node.input[:] = [new if n == old else n for n in node.input]
            node.output[:] = [new if n == old else n for n in node.output]
        for v in g.value_info:
            if v.name == old:
                v.name = new
        out.name = new


class TrainModule(nn.Module):
    """Wraps ``module`` so its forward and backward run in onnxtrain (see the module docstring).

    Args:
        module: the torch.nn.Module to train.
        fallback: if True, a module that cannot be exported or differentiated runs in PyTorch instead, with a
            warning naming the module and the reason; if False (the default) that raises ExportError.
        opset: the ONNX opset to export with.

    Module behaviour is the wrapped module's: ``parameters()``, ``named_parameters()``, ``buffers()``,
    ``state_dict()``/``load_state_dict()`` use its names; attributes not found on the wrapper are looked up on it.
    """

    def __init__(self, module: nn.Module, *, fallback: bool = False, opset: int = 17):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"TrainModule: expected a torch.nn.Module, got {type(module).__name__}")
        self.module = module
        self._fallback = fallback
        self._opset = opset
        self._cache: dict = {}
        self._forward_count = 0
        self.exports = 0  # how many signatures have been exported (tests and curious users read it)

    # --- Module behaviour: the wrapped module's names -------------------------------------------------------
    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("module"), name)

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        if recurse:
            yield from self.module.named_parameters(prefix, recurse, remove_duplicate)

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        if recurse:
            yield from self.module.named_buffers(prefix, recurse, remove_duplicate)

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        return self.module.state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def __repr__(self) -> str:
        return f"TrainModule({self.module!r})"

    # --- Calls -------------------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        leaves, spec = pytree.tree_flatten((args, kwargs))
        tensor_at = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        inputs = [leaves[i] for i in tensor_at]
        key = self._signature(leaves, spec, inputs)
        compiled = self._cache.get(key)
        if compiled is None:
            compiled = self._cache[key] = self._compile(leaves, tensor_at, spec, inputs)
        if compiled == "eager":
            return self.module(*args, **kwargs)
        params = [p for p in self._trainable_params(compiled)]
        needs_grad = torch.is_grad_enabled() and (any(t.requires_grad for t in inputs) or any(p.requires_grad for p in params))
        if needs_grad:
            outs = _Apply.apply(self, compiled, len(inputs), *inputs, *params)
        else:
            outs = self._run_forward(compiled, inputs, params)
        user = list(outs[:compiled.n_user_outputs])
        leaves_out = list(compiled.out_constants)
        for i, t in zip(compiled.out_tensor_at, user):
            leaves_out[i] = t
        return pytree.tree_unflatten(leaves_out, compiled.out_spec)

    def _signature(self, leaves, spec, inputs) -> tuple:
        def leaf_key(v):
            if isinstance(v, torch.Tensor):
                return ("T", tuple(v.shape), v.dtype, v.requires_grad and v.dtype in _FLOAT, v.device.type)
            try:
                hash(v)
                return ("V", type(v).__name__, v)
            except TypeError:
                return ("R", repr(v))

        modes = tuple(m.training for m in self.module.modules())
        frozen = tuple(p.requires_grad for p in self.module.parameters())
        return (str(spec), tuple(leaf_key(v) for v in leaves), modes, frozen)

    def _trainable_params(self, c: _Compiled) -> list[nn.Parameter]:
        params = dict(self.module.named_parameters())
        return [params[name] for _, name in c.trainable]

    def _call(self, c: _Compiled, what: str, fn):
        try:
            return fn()
        except OnnxtrainError as e:
            raise ExportError(f"onnxtrain.torch: {what} of {type(self.module).__name__} failed: {e}") from e

    def _run_forward(self, c: _Compiled, inputs, params) -> list[torch.Tensor]:
        self._bind(c, params)
        feeds = {name: t.detach().contiguous() for name, t in zip(c.inputs, inputs) if name is not None}
        state = dict(self.module.named_parameters())
        state.update(self.module.named_buffers())
        for onnx_name, torch_name in c.fed:
            feeds[onnx_name] = state[torch_name].detach().contiguous()
        outs = self._call(c, "forward", lambda: c.session.run_forward(feeds))
        self._forward_count += 1
        c.forward_id = self._forward_count
        outs = [_to_torch(o) for o in outs]
        if c.batch_norms:
            self._update_running_stats(c, outs)
        return outs

    def _bind(self, c: _Compiled, params) -> None:
        """Points the session's weights at the parameters' storage: once per parameter, again only if a parameter
        was replaced (load_state_dict(assign=True), ``p.data = ...``). A parameter that cannot be viewed (strided)
        is copied in with set_weight whenever its version counter moved."""
        for (onnx_name, torch_name), p in zip(c.trainable, params):
            if torch_name in c.copied:
                if c.versions.get(torch_name) != (id(p), p._version):
                    c.session.set_weight(onnx_name, p.detach().contiguous())
                    c.versions[torch_name] = (id(p), p._version)
                continue
            if c.bound.get(torch_name) == (id(p), p.data_ptr()):
                continue
            try:
                c.session.bind_weight(onnx_name, p.detach())
                c.bound[torch_name] = (id(p), p.data_ptr())
            except TypeError:
                c.copied.add(torch_name)
                c.session.set_weight(onnx_name, p.detach().contiguous())
                c.versions[torch_name] = (id(p), p._version)

    @staticmethod
    @torch.no_grad()
    def _update_running_stats(c: _Compiled, outs) -> None:
        """torch's BatchNorm update from the batch statistics the graph returns (their nodes run with momentum 0,
        so the extra outputs are the batch mean and biased variance): the unbiased variance and momentum=None
        (a cumulative average) as in torch."""
        for bn in c.batch_norms:
            m = bn.module
            if m.num_batches_tracked is not None:
                m.num_batches_tracked.add_(1)
            f = m.momentum if m.momentum is not None else 1.0 / float(m.num_batches_tracked)
            unbiased = bn.count / (bn.count - 1) if bn.count > 1 else 1.0
            m.running_mean.mul_(1 - f).add_(outs[bn.mean_out].to(m.running_mean.dtype), alpha=f)
            m.running_var.mul_(1 - f).add_(outs[bn.var_out].to(m.running_var.dtype), alpha=f * unbiased)

    # --- Export ------------------------------------------------------------------------------------------
    def _compile(self, leaves, tensor_at, spec, inputs):
        name = type(self.module).__name__
        try:
            return self._export(leaves, tensor_at, spec, inputs)
        except ExportError as e:
            if not self._fallback:
                raise
            warnings.warn(f"{e}; running {name} in PyTorch for this signature (fallback=True)", RuntimeWarning,
                          stacklevel=3)
            return "eager"

    def _export(self, leaves, tensor_at, spec, inputs) -> _Compiled:
        import onnx

        module = self.module
        mname = type(module).__name__
        for t in inputs:
            if t.device.type != "cpu":
                raise ExportError(f"onnxtrain.torch: {mname}: inputs must be CPU tensors, got one on {t.device}")
        flat = _Flat(module, leaves, tensor_at, spec)
        input_names = [f"input_{i}" for i in range(len(inputs))]
        f = io.BytesIO()
        try:
            with _untouched(module), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # PRESERVE: every submodule keeps its own mode. No constant folding and initializers kept as inputs:
                # in eval mode torch would otherwise fold BatchNorm into Conv and merge equal-valued initializers.
                torch.onnx.export(flat, tuple(t.detach() for t in inputs), f, dynamo=False,
                                  training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False,
                                  keep_initializers_as_inputs=True, input_names=input_names,
                                  opset_version=self._opset)
        except Exception as e:  # noqa: BLE001  (torch raises many types; the message names the op)
            raise ExportError(f"onnxtrain.torch: exporting {mname} failed: {type(e).__name__}: {e}") from e
        model = onnx.load_from_string(f.getvalue())
        compiled_parts = self._prepare(model, flat, input_names, inputs)
        self.exports += 1
        return compiled_parts

    def _prepare(self, model, flat: _Flat, input_names: list[str], inputs) -> _Compiled:
        import onnx
        from onnx import numpy_helper

        g = model.graph
        mname = type(self.module).__name__
        _name_outputs(g)
        params = dict(self.module.named_parameters())
        buffers = dict(self.module.named_buffers())
        inits = {i.name: i for i in g.initializer}
        torch_name = {n: n[len(_PREFIX):] for n in inits if n.startswith(_PREFIX)}

        # Every parameter its own initializer, under its own name, holding its value.
        trainable, fed = [], []
        seen = set()
        for onnx_name, tname in torch_name.items():
            if tname in params:
                p = params[tname]
                value = numpy_helper.to_array(inits[onnx_name])
                if tuple(value.shape) != tuple(p.shape) or not np.array_equal(value, p.detach().cpu().numpy()):
                    raise ExportError(f"onnxtrain.torch: {mname}: the exported initializer '{tname}' does not hold "
                                      f"parameter '{tname}' (shape {list(value.shape)} vs {list(p.shape)})")
                seen.add(tname)
                (trainable if p.requires_grad else fed).append((onnx_name, tname))
            elif tname in buffers:
                fed.append((onnx_name, tname))
        missing = [n for n, p in params.items() if n not in seen and p.requires_grad]
        if missing:
            self._check_unused(missing, flat, inputs)

        # Buffers and frozen parameters become graph inputs fed from torch every call (never folded as
        # constants); trainable parameters stay initializers, bound to their storage.
        fed_names = {o for o, _ in fed}
        keep_inputs = [i for i in g.input if i.name not in inits or i.name in fed_names]
        del g.input[:]
        g.input.extend(keep_inputs)
        kept = [i for i in g.initializer if i.name not in fed_names]
        del g.initializer[:]
        g.initializer.extend(kept)

        # BatchNorm in training mode: its running-statistics outputs become graph outputs carrying the batch
        # statistics (momentum 0); _update_running_stats applies torch's update rule.
        n_user = len(g.output)
        batch_norms = []
        typed = onnx.shape_inference.infer_shapes(model)
        values = list(typed.graph.value_info) + list(typed.graph.input) + list(typed.graph.output)
        shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}
        shapes_elem = {v.name: v.type.tensor_type.elem_type for v in values}
        for node in g.node:
            if node.op_type != "BatchNormalization" or len(node.output) < 3 or not node.output[1]:
                continue
            mean_name = torch_name.get(node.input[3], "")
            owner = mean_name.rsplit(".", 1)[0] if mean_name.endswith(".running_mean") else None
            bn = self.module.get_submodule(owner) if owner is not None else None
            if not isinstance(bn, nn.modules.batchnorm._BatchNorm):
                raise ExportError(f"onnxtrain.torch: {mname}: BatchNormalization node '{node.name}' reads "
                                  f"'{node.input[3]}', which is no BatchNorm module's running_mean")
            for a in node.attribute:
                if a.name == "momentum":
                    a.f = 0.0
            xs = shapes.get(node.input[0], [])
            if len(xs) < 2 or any(d <= 0 for d in xs):
                raise ExportError(f"onnxtrain.torch: {mname}: BatchNorm '{owner}': the input's shape is unknown")
            count = int(np.prod(xs)) // xs[1]
            elem = shapes_elem.get(node.input[0], onnx.TensorProto.FLOAT)
            for out in node.output[1:3]:
                g.output.append(onnx.helper.make_tensor_value_info(out, elem, [xs[1]]))
            batch_norms.append(_BatchNormStats(bn, len(g.output) - 2, len(g.output) - 1, count))

        graph_inputs = {i.name for i in g.input}
        onnx_inputs = [n if n in graph_inputs else None for n in input_names]
        requiring = [n for n, t in zip(onnx_inputs, inputs) if n and t.requires_grad and t.dtype in _FLOAT]
        out_types = [o.type.tensor_type.elem_type for o in g.output]
        floating = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
        differentiable = [t in floating and i < n_user for i, t in enumerate(out_types)]
        try:
            # The CPU, whatever the default device: parameters are bound in place, and they are CPU tensors (docs/gpu.md).
            session = _onnxtrain.ForwardBackwardSession(model.SerializeToString(), [o for o, _ in trainable], requiring,
                                                        device="cpu")
        except OnnxtrainError as e:
            where = _module_of_node(str(e))
            at = f" (in submodule '{where}')" if where else ""
            message = str(e).replace(f"'{_PREFIX}", "'")  # torch's names, not the flat wrapper's
            raise ExportError(f"onnxtrain.torch: {mname}{at}: {message}") from e
        return _Compiled(session=session, inputs=onnx_inputs, fed=fed, trainable=trainable, n_user_outputs=n_user,
                         out_spec=flat.out_spec, out_tensor_at=flat.out_tensor_at, out_constants=flat.out_constants,
                         differentiable=differentiable, batch_norms=batch_norms)

    def _check_unused(self, missing: list[str], flat: _Flat, inputs) -> None:
        """Parameters absent from the export are fine only if the module does not use them; one that gets a
        gradient in PyTorch was merged into another initializer or folded away."""
        params = dict(self.module.named_parameters())
        with _untouched(self.module), torch.enable_grad():
            outs = [o for o in flat(*[t.detach() for t in inputs]) if o.dtype in _FLOAT]
            total = sum(o.float().sum() for o in outs)
            grads = torch.autograd.grad(total, [params[n] for n in missing], allow_unused=True) if outs else []
        used = [n for n, gr in zip(missing, grads) if gr is not None]
        if used:
            raise ExportError(f"onnxtrain.torch: {type(self.module).__name__}: parameter(s) {', '.join(used)} are used "
                              "by the module but have no initializer of their own in the export (merged or folded)")
