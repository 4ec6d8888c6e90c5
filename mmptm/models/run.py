"""A run as one typed config tree: data, model, optimisation (what ``mmptm pretrain`` validates)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from mmptm.config import load_config
from mmptm.data.pipeline import DataConfig
from mmptm.models.pretrain import ModelConfig


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping of a run."""

    max_steps: int = 1000
    #: stop (with a checkpoint) at this step although the schedule runs to max_steps, to
    #: split a job across time-limited allocations; resume=true continues it. 0 = off
    stop_at: int = 0
    lr: float = 5e-4
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-6
    warmup_steps: int = 100
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    #: the learning rate decays to ``lr * min_lr_ratio``
    min_lr_ratio: float = 0.0
    #: micro-batches per optimiser step (each of data.batch_size)
    grad_accum: int = 1
    #: max global gradient norm; 0 disables clipping
    clip_grad_norm: float = 1.0
    #: auto = bf16 autocast on CUDA, fp32 on CPU
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    compile: bool = False
    device: str = "auto"
    log_every: int = 10
    ckpt_every: int = 500
    keep_checkpoints: int = 2
    progress: bool = True
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
    #: true = continue from the latest checkpoint in output_dir; a path = that checkpoint
    resume: bool | str = False
    #: start from this checkpoint (file or run directory): its encoders, fusion and tokenizer
    #: replace this recipe's; the objectives (task heads) stay this recipe's
    init: str = ""
    #: weights = load them; architecture = the same shapes with fresh weights (baselines)
    init_mode: Literal["weights", "architecture"] = "weights"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


def load_run_config(path: str, overrides: Sequence[str] = ()) -> RunConfig:
    """Load a recipe with its bases and ``key=value`` overrides into a ``RunConfig``."""
    return load_config(path, overrides, schema=RunConfig)
