"""onnxtrain: train ONNX models natively (gradients, loss and optimizer as ONNX subgraphs; CPU via oneDNN/Eigen).

The thin binding (docs/python.md):

    import onnxtrain as ot
    s = ot.TrainingSession("mlp.onnx", loss="mse", optimizer="adam", learning_rate=1e-3)
    loss = s.train_step({"x": x, s.target_name: y})     # numpy in, float out; the GIL is released meanwhile
    (pred,) = s.infer({"x": x})
    s.save_checkpoint("ckpt.onnx")
    model = s.export_inference()                          # onnx.ModelProto with the trained weights

scikit-learn estimators live in :mod:`onnxtrain.sklearn`.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Iterable, Mapping, Sequence, Union

import numpy as np

from ._onnxtrain import (  # noqa: F401  (re-exported)
    AdapterSpec,
    MemorySpec,
    Communicator,
    DataParallelSpec,
    Device,
    DistributedSampler,
    ForwardBackwardSession,
    LossSpec,
    MixedPrecisionSpec,
    OnnxtrainError,
    OptimizerSpec,
    ParamGroup,
    PenaltySpec,
    ScheduleSpec,
    TrainingConfig,
    __version__,
    communicator_from_environment,
    config_schema,
    cuda_available,
    cuda_unavailable_reason,
    launched_by_mpi,
    loss_kinds,
    optimizer_kinds,
    schedule_kinds,
)
from . import _onnxtrain

__all__ = [
    "AdapterSpec", "MemorySpec", "Communicator", "DataParallelSpec", "Device", "DistributedSampler", "Elastic", "ForwardBackwardSession", "LossSpec", "MixedPrecisionSpec", "NonFiniteStepWarning", "OnnxtrainError", "OptimizerSpec", "ParamGroup",
    "PenaltySpec", "ScheduleSpec", "TrainingConfig", "TrainingSession", "communicator_from_environment", "config_schema", "cuda_available", "cuda_unavailable_reason", "launched_by_mpi", "loss_kinds", "make_config", "make_adapter", "make_distributed", "make_memory", "make_loss", "merge_lora", "make_mixed_precision",
    "make_optimizer", "make_penalty", "make_schedule", "optimizer_kinds", "schedule_kinds", "__version__",
]

ModelLike = Union[str, "os.PathLike[str]", bytes, Any]  # Any: onnx.ModelProto (anything with SerializeToString)
Feeds = Mapping[str, Any]


class NonFiniteStepWarning(RuntimeWarning):
    """A training step was skipped (``on_non_finite="skip"``): its loss or a gradient was NaN/Inf, so nothing was
    applied. The message names the step and the tensor. Warned for each of the first 10 skipped steps of a
    session, then for every 100th; ``skipped_steps`` counts them all. Silence with
    ``warnings.simplefilter("ignore", onnxtrain.NonFiniteStepWarning)``."""


# The CLI's rate limit (cli/progress.h, report_skipped_step): a run that skips often still shows it, unflooded.
_SKIP_WARN_FIRST, _SKIP_WARN_EVERY = 10, 100


def _skip_is_reported(n: int) -> bool:
    return n <= _SKIP_WARN_FIRST or n % _SKIP_WARN_EVERY == 0


def Elastic(l1: float = 0.0, l2: float = 0.0) -> PenaltySpec:
    """The elastic weight penalty ``l1 * sum|w| + l2 * sum(w**2)`` (no 1/2 on the L2 term)."""
    return PenaltySpec(l1=float(l1), l2=float(l2))


# Optimizer names that are presets of a C++ kind rather than kinds of their own.
_OPTIMIZER_PRESETS = {
    "nesterov": {"kind": "sgd", "nesterov": True, "momentum": 0.9},
    "momentum": {"kind": "sgd", "momentum": 0.9},
}


def _spec(cls, value, what: str, kind_field: str = "kind"):
    if isinstance(value, cls):
        return cls(**value.to_dict())  # a copy: sessions never alias the caller's object
    if isinstance(value, str):
        return cls(**{kind_field: value})
    if isinstance(value, Mapping):
        return cls(**value)
    raise TypeError(f"{what}: expected a name, a dict or {cls.__name__}, got {type(value).__name__}")


def make_loss(loss: Union[str, LossSpec, Mapping[str, Any]], **options: Any) -> LossSpec:
    """A LossSpec from a kind name ('square', 'neg_log', ...), a dict of fields or a LossSpec, plus overrides."""
    spec = _spec(LossSpec, loss, "loss")
    for k, v in options.items():
        setattr(spec, k, v)
    return spec


def make_optimizer(optimizer: Union[str, OptimizerSpec, Mapping[str, Any]], **options: Any) -> OptimizerSpec:
    """An OptimizerSpec from 'sgd', 'nesterov' (sgd, momentum 0.9, nesterov), 'momentum', 'adam', 'adamw',
    'adagrad', a dict or an OptimizerSpec, plus overrides (``learning_rate=...``, ``momentum=...``)."""
    if isinstance(optimizer, str) and optimizer in _OPTIMIZER_PRESETS:
        optimizer = dict(_OPTIMIZER_PRESETS[optimizer])
    spec = _spec(OptimizerSpec, optimizer, "optimizer")
    for k, v in options.items():
        if v is not None:
            setattr(spec, k, v)
    return spec


def make_schedule(schedule: Union[None, str, ScheduleSpec, Mapping[str, Any]], **options: Any) -> ScheduleSpec:
    """A ScheduleSpec ('constant' when None) plus overrides."""
    spec = _spec(ScheduleSpec, "constant" if schedule is None else schedule, "schedule")
    for k, v in options.items():
        setattr(spec, k, v)
    return spec


def make_penalty(penalty: Union[None, PenaltySpec, Mapping[str, float], Sequence[float]]) -> PenaltySpec:
    """None (no penalty), a PenaltySpec / Elastic(l1, l2), a dict {'l1': .., 'l2': ..} or a pair (l1, l2)."""
    if penalty is None:
        return PenaltySpec()
    if isinstance(penalty, PenaltySpec):
        return PenaltySpec(l1=penalty.l1, l2=penalty.l2)
    if isinstance(penalty, Mapping):
        return PenaltySpec(**penalty)
    if isinstance(penalty, (tuple, list)) and len(penalty) == 2:
        return PenaltySpec(l1=float(penalty[0]), l2=float(penalty[1]))
    raise TypeError(f"penalty: expected None, Elastic(l1, l2), a dict or a pair, got {penalty!r}")


def _device(device: Union[str, Device]) -> str:
    """The device name TrainingConfig.device holds; the session checks it (parse_device) when it is built."""
    if isinstance(device, Device):
        return {Device.CPU: "cpu", Device.CUDA: "cuda", Device.GUARDED: "guarded"}[device]
    if not isinstance(device, str):
        raise TypeError(f"device: expected 'cpu', 'cuda', 'cuda:N' or onnxtrain.Device, got {type(device).__name__}")
    return device


def make_mixed_precision(mixed_precision: Union[None, str, MixedPrecisionSpec, Mapping[str, Any]]) -> MixedPrecisionSpec:
    """None (off), 'float16', 'bfloat16', a dict of MixedPrecisionSpec fields or a MixedPrecisionSpec."""
    return _spec(MixedPrecisionSpec, "none" if mixed_precision is None else mixed_precision, "mixed_precision",
                 kind_field="dtype")


def make_adapter(adapter: Union[None, str, AdapterSpec, Mapping[str, Any]]) -> AdapterSpec:
    """None (no adapter), 'lora' (rank 8, alpha 16, every MatMul/Gemm weight), a dict of AdapterSpec fields
    ({'kind': 'lora', 'rank': 4, 'target': ['*attention*weight']}) or an AdapterSpec (docs/lora.md)."""
    return _spec(AdapterSpec, "none" if adapter is None else adapter, "adapter")


def make_memory(memory: Union[None, str, Iterable[str], MemorySpec, Mapping[str, Any]]) -> MemorySpec:
    """Activation recomputation (docs/memory.md): None or 'none' (keep every activation), 'auto' (keep segment
    boundaries, recompute the rest in the backward pass), a list of forward node names or globs to recompute,
    a dict ({'recompute': 'auto'}) or a MemorySpec."""
    if isinstance(memory, MemorySpec):
        return MemorySpec(**memory.to_dict())
    if isinstance(memory, Mapping):
        return make_memory(memory.get("recompute")) if set(memory) <= {"recompute"} else MemorySpec(**memory)
    if memory is None or isinstance(memory, str):
        return MemorySpec(recompute=[] if memory is None else [memory])
    if isinstance(memory, Iterable) and all(isinstance(m, str) for m in memory):
        return MemorySpec(recompute=list(memory))
    raise TypeError(f"memory: expected None, 'none', 'auto', a list of node globs, a dict or MemorySpec, "
                    f"got {type(memory).__name__}")


def make_distributed(distributed: Union[None, DataParallelSpec, Mapping[str, Any]]) -> DataParallelSpec:
    """How a data-parallel session reduces gradients (docs/distributed.md): None (the defaults), a dict of
    DataParallelSpec fields ({'compression': 'bfloat16', 'bucket_bytes': 4 << 20}) or a DataParallelSpec. The
    same options as the CLI's ``distributed:`` section; they apply when the session has ``parallel=...``."""
    if distributed is None:
        return DataParallelSpec()
    if isinstance(distributed, (DataParallelSpec, Mapping)):
        spec = DataParallelSpec(**(distributed.to_dict() if isinstance(distributed, DataParallelSpec) else distributed))
        _check_choice("distributed.compression", spec.compression)
        return spec
    raise TypeError(f"distributed: expected None, a dict or DataParallelSpec, got {type(distributed).__name__}")


def _check_choice(key: str, value: Any) -> None:
    """Raises ValueError unless value is one of the schema's choices for this option (training/config_schema.h),
    naming the option as Python spells it."""
    option = next(o for o in config_schema() if o["key"] == key)
    if value not in option["choices"]:
        quoted = [repr(c) for c in option["choices"]]
        expected = " or ".join(quoted) if len(quoted) == 2 else "one of " + ", ".join(quoted)
        raise ValueError(f"{option['python']}: expected {expected}, got {value!r}")


def merge_lora(model: ModelLike):
    """A model with LoRA adapters (a path, bytes or onnx.ModelProto, e.g. ``TrainingSession.export_inference()``)
    with every adapter folded into its weight (W + A B alpha / rank): an onnx.ModelProto of the base architecture
    with new weights (docs/lora.md)."""
    return _model_proto(_onnxtrain.merge_lora(model))


def make_config(*, trainable: Iterable[str] | None = None, loss: Any = "mse", optimizer: Any = "sgd",
                learning_rate: float | None = None, schedule: Any = None, penalty: Any = None,
                prediction: str | None = None, device: Union[str, Device, None] = None,
                inputs_requiring_grad: Iterable[str] | None = None, mixed_precision: Any = None,
                on_non_finite: str = "raise", check_every_value: bool = False,
                profile: bool = False, adapter: Any = None, memory: Any = None,
                distributed: Any = None) -> TrainingConfig:
    """A TrainingConfig from the same arguments as TrainingSession. Every option, its default and help text:
    ``config_schema()`` (the CLI's keys are the same options)."""
    _check_choice("train.on_non_finite", on_non_finite)
    cfg = TrainingConfig()
    cfg.on_non_finite = on_non_finite
    cfg.check_every_value = bool(check_every_value)
    cfg.profile = bool(profile)
    cfg.trainable = list(trainable or [])
    cfg.inputs_requiring_grad = list(inputs_requiring_grad or [])
    cfg.prediction = prediction or ""
    cfg.loss = make_loss(loss)
    cfg.optimizer = make_optimizer(optimizer, learning_rate=learning_rate)
    cfg.schedule = make_schedule(schedule)
    cfg.penalty = make_penalty(penalty)
    if device is not None:  # else TrainingConfig's default: $ONNXTRAIN_DEVICE, else "cpu"
        cfg.device = _device(device)
    cfg.mixed_precision = make_mixed_precision(mixed_precision)
    cfg.adapter = make_adapter(adapter)
    cfg.memory = make_memory(memory)
    cfg.distributed = make_distributed(distributed)
    return cfg


def _replicas(replicas: Any) -> int:
    if isinstance(replicas, bool) or not isinstance(replicas, (int, np.integer)) or not 1 <= replicas <= 64:
        raise ValueError(f"replicas: expected an integer from 1 to 64, got {replicas!r}")
    return int(replicas)


def _communicator(parallel: Union[None, bool, Communicator]) -> Communicator | None:
    if parallel is None or parallel is False:
        return None
    if parallel is True:
        return communicator_from_environment()
    if isinstance(parallel, Communicator):
        return parallel
    raise TypeError(f"parallel: expected None, True/False or an onnxtrain.Communicator, got {type(parallel).__name__}")


def _model_proto(data: bytes):
    import onnx  # only needed by the calls that return a ModelProto

    return onnx.load_from_string(data)


def _feeds(feeds: Feeds | None, kwargs: Mapping[str, Any]) -> dict:
    d = dict(feeds) if feeds is not None else {}
    d.update(kwargs)
    return d


class TrainingSession:
    """Trains an ONNX model with onnxtrain's native training session.

    Args:
        model: a path, the serialized bytes, or an ``onnx.ModelProto``.
        trainable: initializer names to train; None = every floating-point initializer.
        loss: a loss name (``loss_kinds()``), a dict of LossSpec fields, or a LossSpec.
        optimizer: 'sgd', 'nesterov', 'momentum', 'adam', 'adamw', 'adagrad', a dict or an OptimizerSpec.
        learning_rate: overrides the optimizer's learning rate.
        schedule: None (constant), a schedule name, a dict or a ScheduleSpec (docs/schedules.md).
        penalty: None, ``Elastic(l1, l2)``, a dict or a pair.
        prediction: the model output the loss reads (default: the first).
        device: 'cpu', 'cuda' or 'cuda:N' (or an onnxtrain.Device). Without CUDA (not compiled in, or no device
            visible) the session raises an error saying which.
        inputs_requiring_grad: model inputs whose gradients ``run_backward`` also returns.
        mixed_precision: None (off), 'float16', 'bfloat16', a dict or a MixedPrecisionSpec: MatMul/Gemm/Conv
            compute on half-precision values, weights stay float32, a dynamic loss scale guards the backward and
            overflowed steps are skipped and counted (``loss_scale``, ``overflow_steps``; docs/trainer.md).
        adapter: None, 'lora', a dict or an AdapterSpec: LoRA adapters beside the targeted weights, which stay
            frozen; only the adapters train, plus the weights ``trainable`` names (docs/lora.md).
        memory: activation recomputation (docs/memory.md): None/'none', 'auto' or a list of forward node globs;
            the backward pass recomputes those activations instead of keeping them (same losses, to the bit).
        on_non_finite: what a step whose loss or a gradient is NaN/Inf does (its update is never applied;
            docs/reliability.md). 'raise' (default): ``train_step`` raises OnnxtrainError naming the step and the
            tensor. 'skip': ``train_step`` returns NaN, the step is counted in ``skipped_steps`` and a
            ``NonFiniteStepWarning`` names it (the first 10, then every 100th).
        check_every_value: debugging aid: check every intermediate value, so the report names the node that first
            produced the NaN/Inf. Costs a pass over every value per step.
        profile: time every step of ``train_step``'s plan; read it with ``profile()`` or ``profile_report()``
            (docs/performance.md, "Profiling a step").
        distributed: how a data-parallel session reduces gradients: None (defaults), a dict or a DataParallelSpec
            (``overlap``, ``bucket_bytes``, ``compression``, ``reduce_every_micro_batch``; the CLI's ``distributed:``
            keys, docs/distributed.md). Applies with ``parallel``.
        config: a complete TrainingConfig instead of the arguments above.
        parallel: data-parallel training (docs/distributed.md): True for ``communicator_from_environment()`` (the
            MPI ranks under ``mpirun``, this process alone otherwise) or a Communicator. Rank 0's weights are
            broadcast; each ``train_step`` averages the ranks' gradients and returns the loss of all their
            batches; only rank 0 writes files. Each rank feeds its own shard (``DistributedSampler``).
        replicas: data parallelism inside this process (docs/replicas.md): that many copies of the session, each on
            its own thread with one OpenMP thread, split every batch's rows between them and average their
            gradients before each update. The same steps as one session on the whole batch, up to float rounding,
            for losses that are a mean (or sum) over rows. 1 (default): one session on OpenMP's threads.

    Feeds are dicts of numpy arrays keyed by input name; C-contiguous arrays of the expected dtype are read in
    place. The loss target is fed under ``target_name``. Errors name the input or option at fault: a wrong
    dtype raises TypeError, other bad input ValueError (``OnnxtrainError``).
    """

    def __init__(self, model: ModelLike, *, trainable: Iterable[str] | None = None, loss: Any = "mse",
                 optimizer: Any = "sgd", learning_rate: float | None = None, schedule: Any = None,
                 penalty: Any = None, prediction: str | None = None, device: Union[str, Device, None] = None,
                 inputs_requiring_grad: Iterable[str] | None = None, config: TrainingConfig | None = None,
                 parallel: Union[None, bool, Communicator] = None, mixed_precision: Any = None,
                 on_non_finite: str = "raise", check_every_value: bool = False, profile: bool = False,
                 replicas: int = 1, adapter: Any = None, memory: Any = None, distributed: Any = None):
        if config is None:
            config = make_config(trainable=trainable, loss=loss, optimizer=optimizer, learning_rate=learning_rate,
                                 schedule=schedule, penalty=penalty, prediction=prediction, device=device,
                                 inputs_requiring_grad=inputs_requiring_grad, mixed_precision=mixed_precision,
                                 on_non_finite=on_non_finite, check_every_value=check_every_value, profile=profile,
                                 adapter=adapter, memory=memory, distributed=distributed)
        self._s = _onnxtrain.TrainingSession(model, config, _communicator(parallel), _replicas(replicas))
        self.config = config
        self._skips_seen = 0

    @classmethod
    def from_checkpoint(cls, checkpoint: ModelLike, parallel: Union[None, bool, Communicator] = None,
                        replicas: int = 1, distributed: Any = None) -> "TrainingSession":
        """Rebuilds the session a checkpoint was saved from (path, bytes or ModelProto); training continues
        bit-for-bit on CPU. ``parallel``, ``replicas`` and ``distributed`` as in the constructor: any number of
        ranks or replicas can resume any checkpoint. Checkpoints do not store ``distributed`` (it belongs to the
        run), so give it again to resume with other than the defaults."""
        self = cls.__new__(cls)
        self._s = _onnxtrain.TrainingSession.from_checkpoint(checkpoint, _communicator(parallel), _replicas(replicas),
                                                             make_distributed(distributed))
        self.config = None
        self._skips_seen = self._s.skipped_steps  # those were reported by the run that saved the checkpoint
        return self

    @property
    def communicator(self) -> Communicator | None:
        """The Communicator of a data-parallel session, else None."""
        return self._s.communicator

    @property
    def replicas(self) -> int:
        """One-thread replicas that split each batch (1: one session on OpenMP's threads)."""
        return self._s.replicas

    @property
    def rank(self) -> int:
        """This process's data-parallel rank (0 without a communicator)."""
        c = self._s.communicator
        return c.rank if c is not None else 0

    @property
    def world_size(self) -> int:
        """Number of data-parallel ranks (1 without a communicator)."""
        c = self._s.communicator
        return c.size if c is not None else 1

    # Running.
    def train_step(self, feeds: Feeds | None = None, /, **inputs: Any) -> float:
        """One optimizer step on a batch (model inputs plus the target); returns the loss before the update, or
        NaN for a step skipped under ``on_non_finite="skip"`` (then a NonFiniteStepWarning may name it)."""
        loss = self._s.train_step(_feeds(feeds, inputs))
        if loss != loss:  # NaN: only then can the step have been skipped
            self._warn_skipped()
        return loss

    def _warn_skipped(self, stacklevel: int = 3) -> None:
        # train_epoch can skip several steps in one call; each keeps its place in the rate limit, but only the
        # latest one's reason is still known.
        last = self._s.skipped_steps
        for n in range(self._skips_seen + 1, last + 1):
            if not _skip_is_reported(n):
                continue
            note = (f" (from now on only every {_SKIP_WARN_EVERY}th skipped step is reported; skipped_steps counts "
                    "them all)") if n == _SKIP_WARN_FIRST else ""
            reason = self._s.last_skip_reason if n == last else "in train_epoch; last_skip_reason names the latest"
            warnings.warn(NonFiniteStepWarning(f"skipped step #{n}: {reason}{note}"), stacklevel=stacklevel)
        self._skips_seen = max(self._skips_seen, last)

    def train_epoch(self, data: Feeds, batch_size: int, *, order: Any = None, sample_weight: Any = None,
                    sample_weight_feed: str | None = None, weights_sum_to_one: bool = False,
                    squares_of: Iterable[str] = (), interrupt_at_step: int = -1) -> dict[str, np.ndarray]:
        """One epoch of ``train_step`` calls over whole-data-set arrays, looped natively with the GIL released.

        ``data`` maps every feed (model inputs and target) to an array with one row per sample. Batches are
        ``batch_size`` rows (the last one what is left), taken in ``order`` (row indices, e.g. a shuffle; rows
        are gathered natively) or, without it, in row order (fed as views, no copy). With
        ``sample_weight_feed``, that feed gets each batch's ``sample_weight`` (raw, one per row; all 1 when
        None) scaled to sum to the batch's rows, or to 1 with ``weights_sum_to_one``. ``squares_of``: trainable
        weights whose sum of squares is reported per batch, read before its step.

        Returns per-batch arrays: ``loss`` (as train_step returns), ``rows``, ``weight_sum`` (the raw weights
        summed; rows without weights) and ``squares`` (empty without ``squares_of``). A batch skipped under
        ``on_non_finite="skip"`` has a NaN loss and is warned about as by ``train_step``. An exception in a step
        (or Ctrl-C) ends the epoch there, the steps before it applied. ``interrupt_at_step=k`` delivers a Ctrl-C
        (``signal.raise_signal``'s equivalent) right before step k of the epoch, as if the user had pressed it
        then: the tests' deterministic Ctrl-C, and a way for code to stop an epoch at a known step."""
        try:
            return self._s.train_epoch(dict(data), int(batch_size), order, sample_weight, sample_weight_feed or "",
                                       bool(weights_sum_to_one), list(squares_of), int(interrupt_at_step))
        finally:
            self._warn_skipped()  # on_non_finite="skip": a skipped batch's loss is NaN

    def infer(self, feeds: Feeds | None = None, /, **inputs: Any) -> list[np.ndarray]:
        """The model's outputs, in order."""
        return self._s.infer(_feeds(feeds, inputs))

    def gradients(self, feeds: Feeds | None = None, /, **inputs: Any) -> tuple[float, dict[str, np.ndarray]]:
        """(loss, {weight: gradient}) for a batch, without updating anything."""
        return self._s.gradients(_feeds(feeds, inputs))

    def run_forward(self, feeds: Feeds | None = None, /, **inputs: Any) -> list[np.ndarray]:
        """The model's outputs (feeds: the model's inputs, no target), keeping what ``run_backward`` needs. Runs
        on the session's own weights: train_step and set_weight are seen by the next call."""
        return self._s.run_forward(_feeds(feeds, inputs))

    def run_backward(self, output_grads: Sequence[Any]) -> dict[str, np.ndarray]:
        """One gradient per model output (None = zeros) for the last ``run_forward``; returns the gradient of
        every trainable weight and of each input in ``inputs_requiring_grad``, by name."""
        return self._s.run_backward(list(output_grads))

    # Interface.
    @property
    def input_names(self) -> list[str]:
        """The model's inputs."""
        return self._s.input_names

    @property
    def output_names(self) -> list[str]:
        """The model's outputs."""
        return self._s.output_names

    @property
    def feed_names(self) -> list[str]:
        """Everything train_step needs: the model's inputs, the target and 'sample_weight' if requested."""
        return self._s.feed_names

    @property
    def target_name(self) -> str:
        """The feed name of the loss target."""
        return self._s.target_name

    @property
    def trainable(self) -> list[str]:
        """The trained initializers."""
        return self._s.trainable

    # Weights and optimizer state.
    def get_weight(self, name: str) -> np.ndarray:
        """A copy of one trainable weight."""
        return self._s.get_weight(name)

    def weights(self) -> dict[str, np.ndarray]:
        """Copies of every trainable weight."""
        return self._s.weights()

    def set_weight(self, name: str, value: Any) -> None:
        """Overwrites a trainable weight (same dtype and shape)."""
        self._s.set_weight(name, value)

    def set_weights(self, values: Mapping[str, Any]) -> None:
        """set_weight for every entry."""
        self._s.set_weights(dict(values))

    @property
    def learning_rate(self) -> float:
        """The default group's current learning rate (settable; groups keep their ratio)."""
        return self._s.learning_rate

    @learning_rate.setter
    def learning_rate(self, lr: float) -> None:
        self._s.learning_rate = lr

    @property
    def step(self) -> int:
        """Optimizer updates applied so far."""
        return self._s.step

    @property
    def loss_scale(self) -> float:
        """Mixed precision: the current loss scale (0.0 without mixed precision)."""
        return self._s.loss_scale

    @property
    def overflow_steps(self) -> int:
        """Mixed precision: steps skipped because the loss or a gradient was not finite."""
        return self._s.overflow_steps

    def profile(self) -> list:
        """With ``profile=True``: where ``train_step``'s time went, one dict per step of its plan (``step``: the
        node, or the ops of a fused step; ``op``; ``calls``; ``seconds`` in all), most expensive first."""
        return self._s.profile()

    @property
    def arena_bytes(self) -> int:
        """Bytes of the arena of ``train_step``'s latest plan: every intermediate value, placed by lifetime (0
        before the first step). ``memory='auto'`` reduces it (docs/memory.md)."""
        return self._s.arena_bytes

    @property
    def arena_update_bytes(self) -> int:
        """Of ``arena_bytes``, the buffers of the optimizer's new weights and state (the same at any batch size):
        ``arena_bytes - arena_update_bytes`` is what activations, gradients and temporaries need at their peak."""
        return self._s.arena_update_bytes

    def profile_report(self, top: int = 15) -> str:
        """The profile as text: the share of each op type, then the ``top`` most expensive steps."""
        return self._s.profile_report(top)

    @property
    def skipped_steps(self) -> int:
        """on_non_finite='skip': train_step calls whose loss or a gradient was NaN/Inf, so nothing was applied
        (they do not advance ``step``). Saved in checkpoints."""
        return self._s.skipped_steps

    @property
    def last_skip_reason(self) -> str:
        """The report of the latest skipped step, naming the step and the tensor ('' before the first)."""
        return self._s.last_skip_reason

    @property
    def train_step_calls(self) -> int:
        """train_step calls so far, skipped ones and micro-batches included (the "training step N" of a report)."""
        return self._s.train_step_calls

    def end_epoch(self, mean_loss: float) -> None:
        """Reports an epoch's mean training loss (the 'adaptive' schedule reads it)."""
        self._s.end_epoch(mean_loss)

    @property
    def stop_requested(self) -> bool:
        """True when the schedule asks training to stop (scikit-learn's adaptive rule)."""
        return self._s.stop_requested

    def state(self, name: str) -> np.ndarray:
        """A copy of an optimizer state tensor ('optim.step', '<weight>.exp_avg', ...)."""
        return self._s.state(name)

    @property
    def state_names(self) -> list[str]:
        """Every optimizer state tensor."""
        return self._s.state_names

    # Models out.
    def export_inference(self, path: Union[str, "os.PathLike[str]", None] = None):
        """The inference model with the current weights: an onnx.ModelProto, or saved to ``path`` (atomically;
        returns None then)."""
        if path is not None:
            self._s.export_inference(path)
            return None
        return _model_proto(self._s.export_inference())

    def export_inference_bytes(self) -> bytes:
        """export_inference(), serialized (no onnx import needed)."""
        return self._s.export_inference()

    def checkpoint(self):
        """The trainable checkpoint as an onnx.ModelProto (docs/checkpoint.md)."""
        return _model_proto(self._s.checkpoint())

    def save_checkpoint(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Saves a trainable checkpoint atomically; TrainingSession.from_checkpoint(path) resumes it."""
        self._s.save_checkpoint(path)

    def export_gradient_model(self):
        """A standard ONNX model (onnx.ModelProto) computing the loss and every weight's gradient."""
        return _model_proto(self._s.export_gradient_model())

    def __repr__(self) -> str:
        return repr(self._s)
