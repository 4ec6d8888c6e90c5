"""A run as one typed config tree: data, model, optimisation (what ``mmptm pretrain`` validates)."""

from __future__ import annotations

import copy
import importlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mmptm.config import ConfigError, apply_overrides, bounded, from_dict, load_yaml_tree
from mmptm.data.pipeline import DataConfig
from mmptm.models.pretrain import ModelConfig

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping of a run."""

    max_steps: int = bounded(1000, ge=1)
    #: stop (with a checkpoint) at this step although the schedule runs to max_steps, to
    #: split a job across time-limited allocations; resume=true continues it. 0 = off
    stop_at: int = bounded(0, ge=0)
    lr: float = bounded(5e-4, ge=0)
    weight_decay: float = bounded(0.01, ge=0)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = bounded(1e-6, gt=0)
    warmup_steps: int = bounded(100, ge=0)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    #: the learning rate decays to ``lr * min_lr_ratio``
    min_lr_ratio: float = bounded(0.0, ge=0, le=1)
    #: micro-batches per optimiser step (each of data.batch_size)
    grad_accum: int = bounded(1, ge=1)
    #: max global gradient norm; 0 disables clipping
    clip_grad_norm: float = bounded(1.0, ge=0)
    #: auto = bf16 autocast on CUDA, fp32 on CPU
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    compile: bool = False
    device: str = "auto"
    #: steps between rows of metrics.jsonl / TensorBoard (and progress lines off a terminal)
    log_every: int = bounded(10, ge=1)
    ckpt_every: int = bounded(500, ge=1)
    #: 0 keeps all
    keep_checkpoints: int = bounded(2, ge=0)
    #: a progress bar on a terminal, a log line every log_every steps elsewhere
    #: (MMPTM_PROGRESS=bar|lines|off overrides the choice; README, Training)
    progress: bool = True
    #: TensorBoard event files beside metrics.jsonl (``tensorboard --logdir runs/``)
    tensorboard: bool = True
    #: steps with a non-finite loss to skip (no update; a warning names the step, the loss
    #: terms and the batch's sample keys) before the run stops with that report; 0 = stop
    #: at the first
    max_nonfinite_steps: int = bounded(0, ge=0)
    #: seconds a rank waits for the others (a collective: gradients, a checkpoint) before
    #: the run stops with a message naming the ranks that did not answer; allow for the
    #: slowest checkpoint write
    dist_timeout_s: float = bounded(600.0, gt=0)
    #: how ranks under ``torchrun`` share the work: ddp = each holds the whole model and
    #: optimiser; fsdp = FSDP2, each holds a shard of every parameter, gradient and optimiser
    #: state (per block of ``block_modules``), with sharded checkpoints (``step_N.dcp/``)
    #: that resume at another number of ranks
    parallel: Literal["ddp", "fsdp"] = "ddp"
    #: class names of the model's blocks: the FSDP units and what activation checkpointing
    #: recomputes (mmptm's TransformerBlock, timm's ViT Block)
    block_modules: list[str] = field(default_factory=lambda: ["TransformerBlock", "Block"])
    #: recompute each block's forward in the backward pass: less activation memory for
    #: about a third more compute (any parallel mode, and one process)
    activation_checkpointing: bool = False
    #: peak FLOP/s of one device, for the ``mfu`` column of metrics.jsonl; 0 = known GPUs'
    #: bf16 dense peak (H100, A100, L4, ...), no mfu elsewhere
    peak_flops: float = bounded(0.0, ge=0)
    #: DDP option for models whose objectives leave parameters unused on some steps
    find_unused_parameters: bool = False
    #: parameters left out of training, as glob patterns over their names, e.g.
    #: ["encoders.text.*"] (the text embeddings, as in cross-lingual transfer) or
    #: ["fusion.stack.blocks.0.*"]; every pattern must match some parameter
    freeze: list[str] = field(default_factory=list)


@dataclass
class RunConfig:
    """A pre-training or fine-tuning run: data, model, optimisation, and where it writes."""

    output_dir: str = "runs/default"
    seed: int = 0
    #: Python modules imported before the config is validated: parts defined outside mmptm
    #: (a modality plug-in, an encoder, ...) register themselves when imported
    plugins: list[str] = field(default_factory=list)
    #: true = continue from the latest checkpoint in output_dir; a path = that checkpoint
    resume: bool | str = False
    #: start from this checkpoint (file or run directory): its encoders, fusion and tokenizer
    #: replace this recipe's; the objectives (task heads) stay this recipe's
    init: str = ""
    #: weights = load them; architecture = the same shapes with fresh weights (baselines);
    #: encoders = keep this recipe's model (e.g. a fusion with cross-modal layers on top of
    #: a dual encoder): each encoder the checkpoint has is loaded whole (its weights must
    #: all fit), an encoder it lacks stays new (an image tower beside SpeechBERT's audio
    #: encoder); other tensors are loaded where name and shape match (a dual text tower as
    #: a ``unimodal_layers`` tower)
    init_mode: Literal["weights", "architecture", "encoders"] = "weights"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


#: data keys of earlier versions → where they live now (the text plug-in's settings)
MOVED = {
    "max_text_len": ("text", "max_len"),
    "caption_languages": ("text", "caption_languages"),
    "restart_positions": ("text", "restart_positions"),
}
#: earlier image keys: now facts the image encoders declare (their image_size, mean, std)
IMAGE_KEYS = {"image_size": "image_size", "image_mean": "mean", "image_std": "std"}
_IMAGE_ENCODERS = ("timm_image", "roi_regions")


def upgrade(tree: Mapping[str, Any]) -> dict[str, Any]:
    """A config tree (a recipe, or one saved in an older checkpoint) in today's keys.

    ``data.max_text_len`` / ``caption_languages`` / ``restart_positions`` move to
    ``data.modalities.text``; ``data.image_size`` / ``image_mean`` / ``image_std`` become
    the image encoders' ``image_size`` / ``mean`` / ``std`` where those are unset.
    """
    tree = copy.deepcopy(dict(tree))
    data = tree.get("data")
    if not isinstance(data, dict):
        return tree
    old = [k for k in (*MOVED, *IMAGE_KEYS) if k in data]
    if not old:
        return tree
    log.warning("config: data.%s moved (see README, Configs); read as before", ", data.".join(old))
    for key, (modality, name) in MOVED.items():
        if key in data:
            modalities = data.setdefault("modalities", {})
            modalities.setdefault(modality, {}).setdefault(name, data.pop(key))
    image = {new: data.pop(key) for key, new in IMAGE_KEYS.items() if key in data}
    encoders = (tree.get("model") or {}).get("encoders") or {}
    for enc in encoders.values():
        if isinstance(enc, dict) and enc.get("type") in _IMAGE_ENCODERS:
            for name, value in image.items():
                enc.setdefault(name, value)
    return tree


def import_plugins(tree: Mapping[str, Any]) -> None:
    """Import the modules a config tree's ``plugins`` names, so their parts are registered."""
    plugins = tree.get("plugins") or []
    if not isinstance(plugins, list) or not all(isinstance(m, str) for m in plugins):
        raise ConfigError(f"plugins: expected a list of module names, got {plugins!r}")
    for name in plugins:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ConfigError(f"plugins: cannot import {name!r} ({e})") from None


def run_config(tree: Mapping[str, Any]) -> RunConfig:
    """Validate a config tree (recipe or saved) into a ``RunConfig``: plugins, old keys."""
    import_plugins(tree)
    return from_dict(RunConfig, upgrade(tree))


def load_run_config(path: str, overrides: Sequence[str] = ()) -> RunConfig:
    """Load a recipe with its bases and ``key=value`` overrides into a ``RunConfig``."""
    tree = apply_overrides(load_yaml_tree(path), overrides)
    try:
        return run_config(tree)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
