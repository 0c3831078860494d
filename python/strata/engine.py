"""strata.initialize and the Engine: DeepSpeed's training loop over Strata's C++ engine.

    engine, optimizer, _, lr_scheduler = strata.initialize(config="configs/demo_cpu.json", model="10m")
    loss = engine(input_ids)      # forward
    engine.backward(loss)         # gradients
    engine.step()                 # the optimizer, at the gradient-accumulation boundary

The arithmetic is the C++ engine's (strata._strata.Core); this layer keeps DeepSpeed's bookkeeping: the
micro-step counter behind is_gradient_accumulation_boundary(), the step's figures, the optimizer and
scheduler views, checkpoints with client state, and rank-0 printing.
"""

import json
import math
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field

from . import _strata
from ._strata import StrataError


# JSON has no infinities or NaN, and the checkpoint's reader takes JSON only: a non-finite float in a
# client_state (best_loss = inf) is written as {"__strata_float__": "inf"} and read back as the float.
_FLOAT_TAG = "__strata_float__"


def _tag_non_finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return {_FLOAT_TAG: repr(x)}  # 'inf', '-inf', 'nan': what float() reads back
    if isinstance(x, dict):
        return {k: _tag_non_finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_tag_non_finite(v) for v in x]
    return x


def _untag_non_finite(d):
    if len(d) == 1 and isinstance(d.get(_FLOAT_TAG), str):
        return float(d[_FLOAT_TAG])
    return d


class Loss(float):
    """The loss of one forward (a float), remembering which forward it came from so that
    engine.backward(loss) takes the gradients of that one. `loss.item()` works as on a torch scalar."""

    def __new__(cls, value, engine_token, forward_id):
        obj = super().__new__(cls, value)
        obj._engine_token = engine_token
        obj._forward_id = forward_id
        return obj

    def item(self) -> float:
        return float(self)

    def __repr__(self) -> str:
        return f"Loss({float(self)!r})"


@dataclass(frozen=True)
class StepInfo:
    """One optimizer step's figures (engine.last_step)."""

    step: int  # optimizer steps so far, skipped ones included (global_steps)
    # the step's loss over every rank: the mean over its counted labels when every forward was given
    # num_items_in_batch (and they differ per micro-batch), else the mean of the micro-batch losses
    loss: float
    applied: bool  # False: skipped (fp16 overflow or non-finite gradients)
    grad_norm: float  # global L2 norm of the unscaled gradients
    lr: float  # the rate this step used
    loss_scale: float
    tokens: int  # tokens of the step, every rank
    counted: int  # of those, the labels that counted (not -100), every rank
    times: dict = field(default_factory=dict)  # seconds: forward, backward, optimizer, wait, total


class OptimizerView:
    """What DeepSpeed's optimizer object answers, read from the engine (the optimizer itself runs inside the
    engine: cpu_optim over offloaded shards, or the device optimizer)."""

    def __init__(self, engine):
        self._engine = engine

    @property
    def param_groups(self):
        opt = self._engine.config["optimizer"]
        params = dict(opt.get("params", {}))
        params["lr"] = self._engine.get_lr()[0]
        return [params]

    @property
    def loss_scale(self) -> float:
        return self._engine.loss_scale

    cur_scale = loss_scale  # DeepSpeed's fp16 optimizer's name

    def zero_grad(self, set_to_none=True):
        """Nothing to do: the engine clears its gradient buffers after each optimizer step."""

    def __repr__(self) -> str:
        return f"OptimizerView({self._engine.config['optimizer'].get('type')}, lr={self._engine.get_lr()[0]:g})"


class LRSchedulerView:
    """DeepSpeed's lr_scheduler object: the engine steps the schedule at every optimizer step."""

    def __init__(self, engine):
        self._engine = engine

    def get_lr(self):
        return self._engine.get_lr()

    get_last_lr = get_lr

    @property
    def last_batch_iteration(self) -> int:
        return self._engine.global_steps - 1

    def __repr__(self) -> str:
        return f"LRSchedulerView({self._engine.config['scheduler'].get('type')}, lr={self.get_lr()[0]:g})"


def _masked_labels(input_ids, labels):
    """labels as given, else a token_loader batch's own (its token file's loss mask), else None."""
    if labels is None and isinstance(input_ids, _strata.Tokens):
        return input_ids.labels
    return labels


def _batch_positions(input_ids, position_ids):
    """position_ids as given, else a token_loader batch's own (its token file's document boundaries), else
    None."""
    if position_ids is None and isinstance(input_ids, _strata.Tokens):
        return input_ids.position_ids
    return position_ids


def _byte_size(value):
    """device_memory_cap as the engine takes it: bytes (int) or a size string such as "64MiB" (0: keep the
    config's)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"device_memory_cap: expected bytes (int) or a size such as '64MiB', got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"device_memory_cap: {value} must be positive")
        return value
    return _strata.parse_byte_size(value, "device_memory_cap")


class Engine:
    """A training run: Strata's engine and model, driven as DeepSpeed's engine is.

    Make one with strata.initialize(). With several ranks every rank makes the same calls in the same
    order. Not for use from several Python threads at once (calls are serialised by a lock)."""

    def __init__(self, core):
        self._core = core
        self._lock = threading.Lock()
        self._config = json.loads(core.config_json)
        self.micro_steps = 0  # micro-batches stepped, over the whole run (DeepSpeed's micro_steps)
        self._forward_id = 0
        self._token = object()  # what this engine's Loss objects carry
        self._last_step = None

    # ---- the loop ----
    def __call__(self, input_ids, labels=None, num_items_in_batch=None, position_ids=None):
        return self.forward(input_ids, labels, num_items_in_batch, position_ids)

    def forward(self, input_ids, labels=None, num_items_in_batch=None, position_ids=None):
        """The forward of one micro-batch: input_ids (B, L) integers, labels (B, L) or None (= input_ids),
        Hugging Face's causal-LM convention: labels are not shifted by the caller — position t predicts
        labels[:, t + 1], the model runs over the first L - 1 tokens, and a label of -100 (any negative one)
        is left out. Returns the mean loss over the labels that count, as a Loss.

        num_items_in_batch (transformers' name): the labels that count (>= 0, after the shift) in the whole
        optimizer step — every micro-batch of the accumulation, summed over every rank. Given, backward
        weighs this micro-batch's gradients by its share of them, so that the step's gradients and
        last_step.loss are the mean over every counted label (strata.loss_weighting "tokens", as
        `strata train` does by default); not given, each micro-batch weighs the same (the mean of the
        micro-batch means, a plain DeepSpeed loop). The returned loss is the micro-batch's mean either way.

        position_ids (B, L) or None: packed documents, as transformers' padding-free packing takes them
        (DataCollatorWithFlattening): 0 at each document's first token, then 1, 2, ...; each document then
        attends to itself only and its rotary positions start at 0. Give labels with -100 at each
        document's first token too, as that collator does, so that no document is scored on the one before.

        A batch of token_loader over a token file with a loss mask (TOKENFILE.mask) carries its labels
        (batch.labels, -100 where the mask leaves a token out); with labels=None those are used. One with
        document boundaries (TOKENFILE.docs) carries such labels and batch.position_ids, used when
        position_ids=None."""
        if num_items_in_batch is not None:
            if isinstance(num_items_in_batch, bool) or not isinstance(num_items_in_batch, int):
                try:
                    num_items_in_batch = int(num_items_in_batch.item())  # a torch / numpy scalar
                except AttributeError:
                    raise ValueError(
                        f"num_items_in_batch: expected an int, got {type(num_items_in_batch).__name__}") from None
            if num_items_in_batch < 0:
                raise ValueError(f"num_items_in_batch: {num_items_in_batch} must be at least 0")
        labels = _masked_labels(input_ids, labels)
        position_ids = _batch_positions(input_ids, position_ids)
        with self._lock:
            value = self._core.forward(input_ids, labels, num_items_in_batch, position_ids)
            self._forward_id += 1
            return Loss(value, self._token, self._forward_id)

    def backward(self, loss):
        """Adds the gradients of the last forward's loss: scaled by 1 / (gradient_accumulation_steps x
        world size), or, when that forward was given num_items_in_batch, by its counted labels /
        num_items_in_batch."""
        with self._lock:
            fid = getattr(loss, "_forward_id", None)
            if fid is None:
                raise ValueError(
                    f"engine.backward: expected the Loss that engine(input_ids) returned, got {type(loss).__name__}")
            if loss._engine_token is not self._token:
                raise ValueError("engine.backward: this loss comes from another engine's forward")
            if fid != self._forward_id:
                raise ValueError(
                    f"engine.backward: this loss comes from forward #{fid}, but the last forward is "
                    f"#{self._forward_id}; pass the loss of the last engine(input_ids) call")
            self._core.backward()  # strata.StrataError when that forward's backward has already run

    def step(self):
        """Call after every backward. Counts the micro-batch; at the gradient-accumulation boundary runs the
        optimizer step (global norm, clipping, fp16 overflow check, the update, the schedule), records
        its figures in last_step and, when the config enables csv_monitor or tensorboard, writes them to
        their files (rank 0, flushed; docs/python.md "Metrics")."""
        with self._lock:
            boundary = self._boundary()
            if boundary:
                if self._core.pending_micro_steps == 0:
                    raise StrataError(
                        "engine.step(): no backward since the last optimizer step, so there are no gradients to "
                        "step with; call loss = engine(input_ids) and engine.backward(loss) first")
                r = self._core.step()
                self._last_step = StepInfo(**r)
            self.micro_steps += 1

    def is_gradient_accumulation_boundary(self) -> bool:
        """True while the current micro-batch is the last of its optimizer step (DeepSpeed's rule:
        (micro_steps + 1) % gradient_accumulation_steps == 0)."""
        return self._boundary()

    def _boundary(self):
        return (self.micro_steps + 1) % self._core.accumulation_steps == 0

    def eval_loss(self, input_ids, labels=None, position_ids=None) -> float:
        """The loss of a batch (same conventions as forward) without gradients or optimizer state."""
        labels = _masked_labels(input_ids, labels)
        position_ids = _batch_positions(input_ids, position_ids)
        with self._lock:
            return self._core.eval_loss(input_ids, labels, position_ids)

    # ---- DeepSpeed's counters and figures ----
    @property
    def global_steps(self) -> int:
        """Optimizer steps taken, skipped ones included."""
        return self._core.global_step

    @property
    def global_samples(self) -> int:
        """Samples consumed by the optimizer steps, every rank's: global_steps x train_batch_size."""
        return self._core.global_step * self._core.train_batch_size

    @property
    def skipped_steps(self) -> int:
        return self._core.skipped_steps

    @property
    def last_step(self):
        """The last optimizer step's StepInfo (None before the first)."""
        return self._last_step

    def was_step_applied(self) -> bool:
        return self._last_step is None or self._last_step.applied

    def get_lr(self):
        """The learning rate the next optimizer step uses, as a list (one parameter group)."""
        return [self._core.lr]

    def get_global_grad_norm(self):
        """The last optimizer step's global gradient norm (None before the first step)."""
        return None if self._last_step is None else self._last_step.grad_norm

    @property
    def loss_scale(self) -> float:
        """The fp16 loss scale the next step's gradients are computed with (1 without fp16)."""
        return self._core.loss_scale

    def train_micro_batch_size_per_gpu(self) -> int:
        return self._core.micro_batch

    def gradient_accumulation_steps(self) -> int:
        return self._core.accumulation_steps

    def train_batch_size(self) -> int:
        return self._core.train_batch_size

    @property
    def seq_len(self) -> int:
        """The longest sequence (tokens the model runs over) the device plan reserved activations for."""
        return self._core.seq_len

    @property
    def config(self) -> dict:
        """The resolved config (every key, defaults and "auto" values filled in)."""
        return self._config

    @property
    def model_config(self):
        return self._core.model_config

    # ---- ranks ----
    @property
    def rank(self) -> int:
        return self._core.rank

    @property
    def world_size(self) -> int:
        return self._core.world_size

    @property
    def local_rank(self) -> int:
        return self._core.local_rank

    @property
    def is_main_process(self) -> bool:
        return self._core.rank == 0

    def print(self, *args, **kwargs):
        """print(), on rank 0 only."""
        if self._core.rank == 0:
            kwargs.setdefault("flush", True)
            print(*args, **kwargs)

    # ---- data ----
    def token_loader(self, path, shuffle=True):
        """strata train's loader over a token file: (micro-batch, seq_len + 1) windows, this rank's share,
        shuffled by strata.seed and the epoch."""
        with self._lock:
            return self._core.token_loader(os.fspath(path), shuffle)

    # ---- checkpoints and export ----
    def save_checkpoint(self, save_dir, tag=None, client_state=None, data_loader=None):
        """Writes save_dir/tag (default global_step<N>) in strata train's format and points save_dir/latest
        at it. client_state: a JSON-serialisable dict, returned by load_checkpoint. data_loader: a
        TokenLoader whose position is saved. Every rank calls it. Returns the checkpoint's path."""
        state = {} if client_state is None else client_state
        if not isinstance(state, dict):
            raise ValueError(f"save_checkpoint: client_state must be a dict, got {type(state).__name__}")
        try:
            text = json.dumps(_tag_non_finite(state), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"save_checkpoint: client_state must be JSON-serialisable: {e}") from None
        with self._lock:
            return self._core.save_checkpoint(os.fspath(save_dir), "" if tag is None else str(tag), text,
                                              data_loader)

    def load_checkpoint(self, load_dir, tag=None, data_loader=None):
        """Reads load_dir/tag (default: the tag load_dir/latest names), written by this API or by
        strata train, into this engine; moves data_loader (if given) to the saved position. Returns
        (path, client_state), or (None, None) with a warning when load_dir has no `latest` and no tag is
        given (DeepSpeed's behaviour)."""
        with self._lock:
            r = self._core.load_checkpoint(os.fspath(load_dir), "" if tag is None else str(tag), data_loader)
        if r is None:
            warnings.warn(f"strata: no checkpoint to load: {os.path.join(os.fspath(load_dir), 'latest')} does "
                          "not exist (pass tag= to load a particular one)", stacklevel=2)
            return None, None
        self._last_step = None
        self.micro_steps = self._core.global_step * self._core.accumulation_steps
        return r[0], json.loads(r[1], object_hook=_untag_non_finite)

    def export(self, path, merged=False):
        """Writes the model as transformers loads it (bf16): a Hugging Face directory, or one file when
        path ends in .safetensors. With LoRA adapters (strata.lora or initialize(adapter=...)): a PEFT
        adapter directory (adapter_config.json, adapter_model.safetensors) that PeftModel.from_pretrained
        loads, or with merged=True the model with the adapters merged. Every rank calls it; rank 0 writes."""
        with self._lock:
            self._core.export(os.fspath(path), bool(merged))

    # ---- memory ----
    def memory_snapshot(self) -> dict:
        """The tier manager's snapshot: per tier its capacity and bytes in use (current, peak) by kind, and
        the moves between tiers (memprof's document)."""
        with self._lock:
            return json.loads(self._core.memory_snapshot())

    @property
    def memory_plan(self) -> dict:
        """The device plan (bytes): state, working set, activations, chunk cache; pinned and NVMe state;
        the optimizer sub-groups kept on the device (offload ratio) and overlapped with backward."""
        return json.loads(self._core.memory_plan())

    # ---- lifetime ----
    def close(self):
        """Frees the device, pinned memory and NVMe swap files now (otherwise when the engine is collected)."""
        with self._lock:
            self._core.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self) -> str:
        if self._core.closed:
            return "strata.Engine(closed)"
        return (f"strata.Engine({self._core.model_config.name}, step {self.global_steps}, "
                f"{self._core.device_name}, rank {self.rank}/{self.world_size})")


def _end_the_job_on_an_uncaught_exception():
    """Note [Errors at several ranks] (python/engine_binding.cpp): at several ranks an exception that ends
    one rank's script would leave the others in a collective for ever; after Python has printed it, the
    job ends (every rank exits with status 1), as `strata train` ends on an error."""
    previous = sys.excepthook
    if getattr(previous, "_strata_ends_the_job", False):
        return

    def hook(kind, value, tb):
        previous(kind, value, tb)
        sys.stderr.flush()
        sys.stdout.flush()
        _strata.abort_job(1)

    hook._strata_ends_the_job = True
    sys.excepthook = hook


def initialize(config=None, model=None, *, seq_len=None, backend=None, device_memory_cap=None,
               checkpoint_activations=None, adapter=None, **auto_values):
    """DeepSpeed's initialize: returns (engine, optimizer, None, lr_scheduler).

    config: a ds_config.json path or the same document as a dict; "auto" keys are filled from auto_values
    (docs/config.md's override names: lr, micro_batch, grad_accum, train_batch, grad_clip, betas, eps,
    weight_decay, warmup_min_lr, warmup_steps, total_steps, fp16, bf16, hidden_size).
    model: a preset name, a model JSON file, a Hugging Face Llama directory or .safetensors file (its
    weights), or a strata.ModelConfig.
    seq_len: the longest sequence fed (tokens the model runs over); default min(max_seq_len, 256).
    backend, device_memory_cap: override strata.backend and strata.device_memory_cap.
    checkpoint_activations: True / False overrides strata.checkpoint_activations (default "auto": on only
    when the activations would not fit the device).
    adapter: a PEFT adapter directory (adapter_config.json, adapter_model.safetensors) whose LoRA adapters
    train (or evaluate) over the frozen base `model` names; a config's strata.lora block starts new ones.
    Everything a bad argument can get wrong raises here (strata.ConfigError, a ValueError;
    strata.OutOfMemoryError, a MemoryError; strata.IoError, an OSError)."""
    if config is None:
        raise ValueError("strata.initialize: config= is required (a ds_config.json path or a dict)")
    if model is None:
        raise ValueError("strata.initialize: model= is required (a preset name such as '10m', a model JSON, "
                         "a Hugging Face directory or a strata.ModelConfig)")
    if isinstance(config, dict):
        try:
            config_text, is_path = json.dumps(config), False
        except (TypeError, ValueError) as e:
            raise ValueError(f"strata.initialize: config dict is not JSON-serialisable: {e}") from None
    elif isinstance(config, (str, os.PathLike)):
        config_text, is_path = os.fspath(config), True
    else:
        raise ValueError(f"strata.initialize: config must be a path or a dict, got {type(config).__name__}")
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if not isinstance(model, (str, _strata.ModelConfig)):
        raise ValueError(f"strata.initialize: model must be a preset name, a path or a strata.ModelConfig, "
                         f"got {type(model).__name__}")
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1):
        raise ValueError(f"strata.initialize: seq_len must be a whole number >= 1, got {seq_len!r}")
    try:
        overrides = json.dumps(auto_values)
    except (TypeError, ValueError) as e:
        raise ValueError(f"strata.initialize: the auto values must be numbers, strings or lists: {e}") from None
    core = _strata.Core(config_text, is_path, overrides, model, 0 if seq_len is None else seq_len,
                        "" if backend is None else str(backend), _byte_size(device_memory_cap),
                        None if checkpoint_activations is None else bool(checkpoint_activations),
                        "" if adapter is None else os.fspath(adapter))
    engine = Engine(core)
    if core.world_size > 1:
        _end_the_job_on_an_uncaught_exception()
    scheduler = engine.config.get("scheduler", {}).get("type")
    lr_scheduler = None if scheduler in (None, "none") else LRSchedulerView(engine)
    return engine, OptimizerView(engine), None, lr_scheduler


__all__ = ["initialize", "Engine", "Loss", "StepInfo", "OptimizerView", "LRSchedulerView"]
