"""A run as one typed config tree: data, model, optimisation (what ``mmptm pretrain`` validates).

The recipes that ship with mmptm are found by name (:func:`list_recipes`, :func:`load_recipe`);
a folder of your own joins the search with :func:`add_recipe_dir` or ``MMPTM_RECIPE_PATH``.
"""

from __future__ import annotations

import copy
import importlib
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mmptm.config import (
    DELETE,
    ConfigError,
    add_recipe_dir,
    apply_overrides,
    bounded,
    component,
    components,
    find_recipe,
    from_dict,
    load_yaml_tree,
    recipe_files,
)
from mmptm.registry import ENCODERS, FUSIONS, MODALITIES, OBJECTIVES

log = logging.getLogger(__name__)


@dataclass
class SourceConfig:
    """One training source of a mixture; each batch comes from one source."""

    #: shard spec; with ``languages`` it contains ``{lang}``, e.g. ``mono/train-{lang}-*.tar``
    shards: str
    #: relative share of batches (normalised over the sources)
    weight: float = bounded(1.0, ge=0)
    #: one sub-source per language, sampled with p(l) ∝ (n_l / N) ** alpha (XLM / XLM-R)
    languages: list[str] = field(default_factory=list)
    alpha: float = bounded(0.7, ge=0)
    #: two-sentence samples (parallel pairs) for a model with one text view: ``join`` them
    #: into one sequence (TLM) or ``stack`` them as separate rows of one batch
    #: (sentence-level contrastive over ``[text, text]``); see ``modalities/text.py``
    pairs: Literal["join", "stack"] = "join"
    #: pack the source's rows into sequences of up to this many tokens, each sample attending
    #: only to itself (XLM's streams without the cross-sentence attention): no compute spent
    #: on padding, the same outputs per sample. Token-level objectives only (MLM / TLM);
    #: 0 = off. See ``PackRows`` in ``modalities/text.py``
    pack: int = bounded(0, ge=0)
    #: the modalities this source's samples carry, e.g. ``[text]`` for a text corpus mixed
    #: into an image-text recipe: only their plug-ins decode and collate its batches, and
    #: the model encodes what a batch has; route the objectives that need the rest away
    #: (``model.routes``). Empty: every modality the model reads
    modalities: list[str] = field(default_factory=list)


@dataclass
class DataConfig:
    """The data part of a recipe."""

    #: shard spec: a glob, a brace pattern (``train-{000000..000009}.tar``), a directory
    #: of ``.tar`` files, or several of those separated by commas; ``http(s)://`` and
    #: ``s3://`` URLs and ``pipe:`` commands too (docs/data/at-scale.md)
    train: str = ""
    val: str = ""
    test: str = ""
    #: sentencepiece ``.model`` file (``mmptm tokenizer train`` writes one), or CLIP's BPE
    #: merges ``.txt.gz`` (``mmptm import open_clip`` copies one into the run)
    tokenizer: str = ""
    batch_size: int = bounded(32, ge=1)
    num_workers: int = bounded(0, ge=0)
    #: ``pack`` (see ``SourceConfig``) for the ``train`` shards; sources set their own
    pack: int = bounded(0, ge=0)
    #: samples; 0 or 1 = no shuffle
    shuffle_buffer: int = bounded(1000, ge=0)
    #: sample shards with replacement (epochs of ``epoch_samples``) instead of per-epoch
    #: permutations
    resampled: bool = False
    #: with ``resampled``: samples per epoch, all ranks together (0 = the data's size, from
    #: the shards' manifest or their headers)
    epoch_samples: int = bounded(0, ge=0)
    #: remote shards (``http(s)://``, ``pipe:``, ``s3://``...): tries again after a read
    #: that failed or stalled, then skips the shard and counts its samples as bad
    retries: int = bounded(3, ge=0)
    #: seconds without a byte before a remote read counts as stalled
    timeout_s: float = bounded(60.0, gt=0)
    #: a local folder that keeps the remote shards read ("" = none)
    cache_dir: str = ""
    #: the cache's bound in GB: the least recently read shards go first
    cache_gb: float = bounded(100.0, gt=0)
    #: instead of ``train``: a mixture of sources, each batch drawn from one of them
    sources: dict[str, SourceConfig] = field(default_factory=dict)
    #: named evaluation sets (e.g. one per language): name → shard spec
    eval: dict[str, str] = field(default_factory=dict)
    #: settings of the modality plug-ins, by plug-in name (e.g. ``text: {max_len: 48}``);
    #: what the model's parts declare (an image encoder's size, mean, std) fills the rest
    modalities: dict[str, Any] = components(MODALITIES, keyed=True)


@dataclass
class ModelConfig:
    """The model part of a recipe."""

    #: the fusion width D every encoder projects to
    width: int = 256
    #: encoders whose tokens come at a width of their own rather than ``width``, e.g.
    #: {image: 1024}; only a fusion without cross-modal layers (dual) takes them, each tower
    #: and each contrastive projection then reading its modality at that width
    widths: dict[str, int] = field(default_factory=dict)
    encoders: dict[str, Any] = components(ENCODERS)
    fusion: Any = component(FUSIONS, "single_stream")
    objectives: dict[str, Any] = components(OBJECTIVES)
    #: per-step task sampling (UNITER): objective name → weight; each batch trains one
    #: objective and runs only its data side (conditional masking). A task may name several
    #: objectives joined by ``+`` (``itm+wra``: UNITER's OT loss on ITM's batches), which
    #: train together on its batches. Empty = all every step
    task_mix: dict[str, float] = field(default_factory=dict)
    #: data source (``data.sources`` key) → the objectives its batches train, e.g. MLM on
    #: monolingual batches and a contrastive loss on stacked pairs; sources not named train
    #: every objective. Only those objectives' data sides run on the source's batches
    routes: dict[str, list[str]] = field(default_factory=dict)
    #: objective name → the share of ``train.max_steps`` before it starts training (0 ≤ share
    #: < 1): a two-stage pre-training in one schedule, e.g. LXMERT's paper adds image QA for
    #: the second half, ``{vqa: 0.5}``. Objectives not named train from the first step
    starts: dict[str, float] = field(default_factory=dict)


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
    #: (MMPTM_PROGRESS=bar|lines|off overrides the choice; docs/training.md, Progress)
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
class Reference:
    """A published system (for a task recipe, a benchmark) that a recipe reproduces."""

    #: the system's name, e.g. ``CLIP``
    system: str
    #: the year of its paper
    year: int
    #: the paper's authors, short, e.g. ``Radford et al.``
    paper: str = ""

    def __str__(self) -> str:
        return f"{self.system} ({', '.join(str(x) for x in (self.paper, self.year) if x)})"


#: the recipe families, each a page of the documentation's recipes
FAMILIES = ("vision-language", "multilingual", "video", "audio", "knowledge")


@dataclass
class RecipeInfo:
    """What a recipe is, for ``mmptm recipes`` and the documentation; training ignores it."""

    #: one of :data:`FAMILIES` (the shipped recipes), or a family of your own
    family: str = ""
    #: the published systems it reproduces, at its size
    reproduces: list[Reference] = field(default_factory=list)
    #: what it is, in a sentence
    summary: str = ""
    #: the modalities it reads, for a recipe whose encoders come from its ``init`` run (a
    #: fine-tuning recipe); a recipe with encoders reads theirs
    modalities: list[str] = field(default_factory=list)
    #: the vocabulary size the parameter count of ``mmptm recipes`` assumes when the
    #: tokenizer file (``data.tokenizer``) is not there; 0 = none assumed
    vocab_size: int = bounded(0, ge=0)


@dataclass
class RunConfig:
    """A pre-training or fine-tuning run: data, model, optimisation, and where it writes."""

    #: what the recipe is and reproduces (listings, documentation); no effect on the run
    info: RecipeInfo = field(default_factory=RecipeInfo)
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


# ---------------------------------------------------------------------------------------------
# Checks that span sections: a recipe that passes them is one the trainer can run


def check_recipe(cfg: RunConfig) -> None:
    """The checks no single section can make alone; ``ValueError`` naming the keys."""
    if cfg.train.parallel == "fsdp":
        check_same_parameters(cfg)
    for name, share in cfg.model.starts.items():
        if name not in cfg.model.objectives:
            raise ValueError(
                f"model.starts names {name!r}, which is not in model.objectives "
                f"({sorted(cfg.model.objectives)})"
            )
        if not 0 <= share < 1:
            raise ValueError(
                f"model.starts.{name} must be a share of train.max_steps in [0, 1), got {share}"
            )
    unrouted = set(cfg.model.routes) - set(cfg.data.sources)
    if unrouted:
        raise ValueError(
            f"model.routes names {sorted(unrouted)}, which are not data.sources "
            f"({sorted(cfg.data.sources)})"
        )
    check_packing(cfg.model, packed_sources(cfg.data))


def packed_sources(cfg: DataConfig) -> dict[str, int]:
    """Training source name → tokens per packed row, for the sources that pack ("" names the
    batches of ``data.train``, which carry no source)."""
    if cfg.sources:
        if cfg.pack:
            raise ValueError(
                "data.pack packs the batches of data.train; with data.sources, set "
                "data.sources.<name>.pack instead"
            )
        return {name: src.pack for name, src in cfg.sources.items() if src.pack}
    return {"": cfg.pack} if cfg.pack else {}


def check_packing(cfg: ModelConfig, packed: Iterable[str]) -> None:
    """Packed sources (``data.sources.<name>.pack``; "" = ``data.pack``) need a fusion that
    honours visible matrices and may train only token-level objectives (rows hold several
    samples): an error naming the setting and the objective otherwise."""
    for src in packed:
        where = f"data.sources.{src}.pack" if src else "data.pack"
        fusion = FUSIONS.get(cfg.fusion.type)
        if not fusion.reads_visible_mask:
            raise ValueError(
                f"{where}: fusion {cfg.fusion.type!r} cannot keep packed samples apart "
                "(it reads no visible_mask); use single_stream or unset it"
            )
        names = cfg.routes.get(src, list(cfg.objectives)) if src else list(cfg.objectives)
        rows = [n for n in names if not OBJECTIVES.get(cfg.objectives[n].type).token_level]
        if rows:
            raise ValueError(
                f"{where}: objectives {rows} read whole rows or pooled vectors, and a packed "
                f"row holds several samples; route them to a source without pack "
                f"(model.routes) or unset it"
            )


def check_same_parameters(cfg: RunConfig) -> None:
    """FSDP reduces each block's gradients as one tensor per rank: every rank must compute
    gradients for the same parameters at each step. Settings that let ranks train different
    parts are refused (as are, by a timeout, mixtures whose sources need different encoders)."""
    varying = {
        "model.task_mix": "samples an objective per rank",
        "model.routes": "trains other objectives on other sources' batches",
        "model.starts": "leaves objectives untrained until their start",
        "train.find_unused_parameters": "is for steps that leave parameters unused",
    }
    tc, model = cfg.train, cfg.model
    settings = (model.task_mix, model.routes, model.starts, tc.find_unused_parameters)
    for key, on in zip(varying, settings):
        if on:
            raise ValueError(
                f"train.parallel=fsdp needs every rank to use the same parameters at each "
                f"step, but {key} {varying[key]}: use train.parallel=ddp with "
                "train.find_unused_parameters=true"
            )


#: data keys of earlier versions → where they live now (the text plug-in's settings)
MOVED = {
    "max_text_len": ("text", "max_len"),
    "caption_languages": ("text", "caption_languages"),
    "restart_positions": ("text", "restart_positions"),
}
#: earlier image keys: now facts the image encoders declare (their backbone's image_size,
#: mean, std)
IMAGE_KEYS = {"image_size": "image_size", "image_mean": "mean", "image_std": "std"}
_IMAGE_ENCODERS = ("timm_image", "roi_regions")
#: encoder keys of earlier versions → their key in the encoder's ``backbone`` block
BACKBONE_KEYS = {
    "model_name": "model_name",
    "model_kwargs": "model_kwargs",
    "weights": "weights",
    "image_size": "image_size",
    "mean": "mean",
    "std": "std",
    "freeze_backbone": "freeze",
}
_BACKBONE_ENCODERS = ("timm_image", "roi_regions", "video_frames", "video_backbone")


def upgrade(tree: Mapping[str, Any]) -> dict[str, Any]:
    """A config tree (a recipe, or one saved in an older checkpoint) in today's keys.

    ``data.max_text_len`` / ``caption_languages`` / ``restart_positions`` move to
    ``data.modalities.text``; an image encoder's ``model_name``, ``model_kwargs``,
    ``weights``, ``image_size``, ``mean``, ``std`` and ``freeze_backbone`` move into its
    ``backbone`` block (the last as ``freeze``); ``data.image_size`` / ``image_mean`` /
    ``image_std`` become the image encoders' ``backbone.image_size`` / ``mean`` / ``std``
    where those are unset.
    """
    tree = copy.deepcopy(dict(tree))
    data = tree.get("data")
    image = _upgrade_data(data) if isinstance(data, dict) else {}
    model = tree.get("model")
    encoders = model.get("encoders") if isinstance(model, dict) else None
    if not isinstance(encoders, dict):
        return tree
    for name, enc in encoders.items():
        if not isinstance(enc, dict) or enc.get("type") not in _BACKBONE_ENCODERS:
            continue
        backbone = _nest_backbone(enc, f"model.encoders.{name}")
        if backbone is not None and image and enc["type"] in _IMAGE_ENCODERS:
            for key, value in image.items():
                backbone.setdefault(key, value)
            enc["backbone"] = backbone
    return tree


def _upgrade_data(data: dict[str, Any]) -> dict[str, Any]:
    """Move earlier text keys of ``data`` in place; pop and return its earlier image keys
    (by their name in a backbone block)."""
    old = [k for k in (*MOVED, *IMAGE_KEYS) if k in data]
    if not old:
        return {}
    log.warning("config: data.%s moved (see docs/configs.md); read as before", ", data.".join(old))
    for key, (modality, name) in MOVED.items():
        if key in data:
            modalities = data.setdefault("modalities", {})
            modalities.setdefault(modality, {}).setdefault(name, data.pop(key))
    return {new: data.pop(key) for key, new in IMAGE_KEYS.items() if key in data}


def _nest_backbone(enc: dict[str, Any], where: str) -> dict[str, Any] | None:
    """Move an encoder's earlier flat backbone keys into its ``backbone`` block (a flat key,
    written later, e.g. as an override, wins); the block, or None when it is no mapping."""
    backbone = enc.get("backbone")
    if backbone is None:
        backbone = {}
    if not isinstance(backbone, dict):
        return None  # from_dict names the key and what it expected
    old = [k for k in BACKBONE_KEYS if k in enc]
    if old:
        log.warning(
            "config: %s.%s moved into %s.backbone (see docs/configs.md); read as before",
            where, f", {where}.".join(old), where,
        )  # fmt: skip
        for key in old:
            backbone[BACKBONE_KEYS[key]] = enc.pop(key)
    if backbone or "backbone" in enc:
        enc["backbone"] = backbone
    return backbone


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
    cfg = from_dict(RunConfig, upgrade(tree))
    try:
        check_recipe(cfg)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return cfg


def load_run_config(path: str, overrides: Sequence[str] = ()) -> RunConfig:
    """Load a recipe (a name or a path) with its bases and ``key=value`` overrides into a
    ``RunConfig``.

    ``data.train=SHARDS`` alone points any recipe at one's own shards: the recipe's
    ``data.sources`` (and its ``model.routes``, which name them) are dropped, with an info
    line, unless the overrides set sources or routes themselves."""
    tree = apply_overrides(_own_train(load_yaml_tree(path), overrides, path), overrides)
    try:
        return run_config(tree)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def _own_train(recipe: dict[str, Any], overrides: Sequence[str], path: str) -> dict[str, Any]:
    """``recipe`` without its ``data.sources`` and ``model.routes`` when ``overrides`` give
    ``data.train`` and touch neither: the user's shards replace the recipe's mixture (both
    set by the user stay an error that names them)."""
    keys: dict[str, str] = {}
    for item in overrides:
        key, _, raw = item.partition("=")
        keys[key.strip()] = raw.strip().strip("'\"")
    if keys.get("data.train", DELETE) in ("", DELETE):
        return recipe
    data, model = recipe.get("data"), recipe.get("model")
    if not isinstance(data, dict) or not data.get("sources"):
        return recipe
    mine = ("data", "data.sources", "model", "model.routes")
    if any(k in mine or k.startswith(("data.sources.", "model.routes.")) for k in keys):
        return recipe
    recipe = copy.deepcopy(recipe)
    names = ", ".join(recipe["data"].pop("sources"))
    routes = isinstance(model, dict) and recipe["model"].pop("routes", None) is not None
    log.info(
        "%s: data.train=%s replaces the recipe's data.sources (%s)%s",
        path, keys["data.train"], names, " and model.routes" if routes else "",
    )  # fmt: skip
    return recipe


# ---------------------------------------------------------------------------------------------
# Recipes by name


def load_recipe(name: str | os.PathLike[str], overrides: Sequence[str] = ()) -> RunConfig:
    """A recipe, by name (``clip_tiny``, ``vqa``, ``pretrain/clip_tiny``) or path, with its
    bases and ``key=value`` overrides (e.g. ``["train.max_steps=100"]``), validated.

    >>> load_recipe("clip_tiny", ["train.max_steps=100"]).train.max_steps
    100
    """
    return load_run_config(os.fspath(name), overrides)


def recipe_path(name: str) -> Path:
    """The YAML file of the recipe ``name`` (the first on the search path: the folders added
    with :func:`add_recipe_dir`, those of ``MMPTM_RECIPE_PATH``, then the package's).
    An unknown name is a ``ConfigError`` listing the nearest names."""
    return find_recipe(name)


def list_recipes(modality: str | None = None) -> list[str]:
    """The names of every recipe on the search path, sorted; with ``modality`` (``text``,
    ``image``, ``regions``, ``video``, ``features``, ``units``, ``audio``), those that read
    it. An unknown modality is a ``ConfigError`` naming the known ones."""
    names = sorted(recipe_files())
    if modality is None:
        return names
    known = sorted({ENCODERS.get(n).modality for n in ENCODERS.names()})
    if modality not in known:
        raise ConfigError(f"unknown modality {modality!r}; choices: {', '.join(known)}")
    return [n for n in names if modality in recipe_modalities(load_recipe(n))]


def recipe_modalities(cfg: RunConfig) -> list[str]:
    """The modalities a recipe reads: its encoders', or for one that takes its encoders from
    its ``init`` run, those ``info.modalities`` names."""
    found = [ENCODERS.get(c.type).modality for c in cfg.model.encoders.values()]
    return list(dict.fromkeys(found or cfg.info.modalities))


def recipe_kind(name: str | os.PathLike[str]) -> Literal["pretrain", "finetune"]:
    """``finetune`` for a recipe in a ``finetune`` folder, or elsewhere for one that starts
    from a run (``init:``); ``pretrain`` otherwise."""
    path = find_recipe(name)
    if path.parent.name in ("pretrain", "finetune"):
        return "finetune" if path.parent.name == "finetune" else "pretrain"
    return "finetune" if load_yaml_tree(path).get("init") else "pretrain"


__all__ = [
    "FAMILIES",
    "DataConfig",
    "ModelConfig",
    "RecipeInfo",
    "Reference",
    "RunConfig",
    "SourceConfig",
    "TrainConfig",
    "add_recipe_dir",
    "check_recipe",
    "list_recipes",
    "load_recipe",
    "load_run_config",
    "recipe_kind",
    "recipe_modalities",
    "recipe_path",
    "run_config",
]
