"""Building a run's model and loading pre-trained runs back (config, tokenizer, weights).

Used by training (a fresh model, or ``init=`` from another run), fine-tuning, evaluation,
weight imports and the studies alike, so none of them needs the trainer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from mmptm.encoders.base import VocabInfo
from mmptm.models import checkpoint
from mmptm.models.checkpoint import Checkpoint
from mmptm.models.pretrain import PretrainModel
from mmptm.recipe import RunConfig
from mmptm.registry import ENCODERS, MODALITIES
from mmptm.tokenizers.sentencepiece import Tokenizer, load_tokenizer

if TYPE_CHECKING:
    from mmptm.tokenizers.clip import ClipTokenizer

log = logging.getLogger(__name__)


#: the vocabulary of a model built without a tokenizer (one that reads no text)
NO_TEXT = VocabInfo(vocab_size=0)


def build_model(
    cfg: RunConfig, vocab_size: int | None = None
) -> tuple[PretrainModel, Tokenizer | ClipTokenizer | None]:
    """The tokenizer named by the recipe and a freshly initialised model for it.

    A model without a text encoder (wav2vec 2.0, an imported speech model) needs no
    tokenizer: with ``data.tokenizer`` empty it is built with :data:`NO_TEXT` and the
    tokenizer is None. ``vocab_size`` stands in for the tokenizer (its file need not exist:
    a model of the right shapes before one is trained); the tokenizer is then None.
    """
    if vocab_size is not None:
        languages = sorted({lang for s in cfg.data.sources.values() for lang in s.languages})
        # the tags stand in as the last ids (a decoder started from a language's tag)
        tags = tuple(range(vocab_size - len(languages), vocab_size))
        vocab = VocabInfo(vocab_size=vocab_size, languages=tuple(languages), lang_tags=tags)
        return PretrainModel(cfg.model, vocab), None
    if not cfg.data.tokenizer:
        text = [n for n, c in cfg.model.encoders.items() if ENCODERS.get(c.type).modality == "text"]
        if text:
            raise ValueError(
                f"data.tokenizer is empty but encoders {text} read text: train one with "
                "`mmptm tokenizer train`"
            )
        return PretrainModel(cfg.model, NO_TEXT), None
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    return PretrainModel(cfg.model, VocabInfo.from_tokenizer(tokenizer)), tokenizer


def count_parameters(cfg: RunConfig, vocab_size: int | None = None) -> int:
    """How many parameters the model of ``cfg`` has (that of a fresh :func:`build_model`),
    counted on the meta device: nothing is allocated or initialised, so a base-size recipe is
    counted in milliseconds.

    ``vocab_size`` stands in for the tokenizer's vocabulary (when its file is not there yet;
    the recipe's sources name the languages); None reads the tokenizer. The files other parts
    read (an answer list, a codebook, entity vectors) must be there.
    """
    with torch.device("meta"):
        model, _ = build_model(cfg, vocab_size)
    return sum(p.numel() for p in model.parameters())


def load_pretrained(
    path: str, overrides: Sequence[str] = ()
) -> tuple[PretrainModel, Tokenizer | ClipTokenizer | None, RunConfig]:
    """Model (in eval mode), tokenizer (None without text) and config of a checkpoint file
    or run directory."""
    ckpt = checkpoint.read(path)
    cfg = ckpt.run_config(overrides)
    model, tokenizer = build_model(cfg)
    model.load_state_dict(ckpt.model)
    return model.eval(), tokenizer, cfg


def init_from(cfg: RunConfig) -> Checkpoint | None:
    """Give ``cfg`` the architecture (and tokenizer, if unset) of the run ``cfg.init`` names.

    The heads, and the task mix, routes and starts over them, stay the recipe's own. With
    ``init_mode: encoders`` the whole model stays the recipe's own. In every mode the data
    keep the layout the run was pre-trained with (:func:`take_layout`). Returns the checkpoint,
    whose weights :func:`load_init` loads, or None without ``init``.
    """
    if not cfg.init:
        return None
    ckpt = checkpoint.read(cfg.init)
    src = ckpt.run_config()
    if not cfg.data.tokenizer:
        cfg.data.tokenizer = src.data.tokenizer
    take_layout(cfg, src)
    if cfg.init_mode == "encoders":
        return ckpt
    cfg.model = replace(
        src.model,
        objectives=cfg.model.objectives,
        task_mix=cfg.model.task_mix,
        routes=cfg.model.routes,
        starts=cfg.model.starts,
    )
    return ckpt


def take_layout(cfg: RunConfig, src: RunConfig) -> None:
    """Give ``cfg`` the input layout the run ``src`` was pre-trained with: the settings each
    modality plug-in names as its ``layout`` (text: ``segments``, ``separators``,
    ``restart_positions``, e.g. XLM-R's ``<s> a </s></s> b </s>``), so that a task recipe
    fine-tunes every model in its own layout.

    The settings ``src`` moved off the plug-in's defaults win over the recipe's (logged);
    the others are the recipe's choice (a run that never joined pairs fixes no layout).
    """
    for name, theirs in src.data.modalities.items():
        cls = MODALITIES.get(theirs.type)
        keys = getattr(cls, "layout", ())  # a plug-in class attribute; most have none
        default = cls.Config() if keys else None
        moved = [k for k in keys if getattr(theirs, k) != getattr(default, k)]
        if not moved:
            continue
        ours = cfg.data.modalities.setdefault(name, cls.Config())
        for key in moved:
            want = getattr(theirs, key)
            if getattr(ours, key) != want:
                setattr(ours, key, want)
                where = f"data.modalities.{name}.{key}"
                log.info(
                    "init=%s: %s=%r, the layout it was pre-trained with", cfg.init, where, want
                )


def encoder_prefixes(model: nn.Module, sd: dict[str, torch.Tensor], source: str) -> tuple:
    """``encoders.<name>.`` of each of the model's encoders the checkpoint has (``init_mode:
    encoders``: those are loaded whole; an encoder the checkpoint lacks, e.g. the image
    tower of a speech→image model started from SpeechBERT, stays new)."""
    names = [
        n for n in getattr(model, "encoders", {}) if any(k.startswith(f"encoders.{n}.") for k in sd)
    ]
    if not names:
        raise ValueError(f"init={source}: the checkpoint has none of the model's encoders")
    return tuple(f"encoders.{n}." for n in names)


def load_init(
    model: nn.Module, sd: dict[str, torch.Tensor], source: str, only: str | tuple = ""
) -> None:
    """Load pre-trained weights; the recipe's own heads (objectives.*) may be new.

    ``only`` (key prefixes, e.g. ``encoders.``): the checkpoint must hold every tensor under
    them, with the same shapes; other tensors are loaded where the checkpoint has one of the
    same name and shape (a dual encoder's text tower as a single-stream fusion's
    ``unimodal_layers`` tower) and keep their fresh initialisation otherwise.
    """
    own = model.state_dict()
    fits = {k: v for k, v in sd.items() if k in own and v.shape == own[k].shape}
    wrong = [k for k in sd if k in own and k not in fits and k.startswith(only)]
    if wrong:
        raise ValueError(f"init={source}: tensors differ in shape, e.g. {wrong[:5]}")
    missing = [k for k in own if k.startswith(only) and k not in sd]
    missing = [k for k in missing if not k.startswith("objectives.")]
    if missing:
        raise ValueError(
            f"init={source}: the checkpoint lacks {len(missing)} tensors: {missing[:5]}"
        )
    model.load_state_dict(fits, strict=False)
    fresh = [k for k in own if k not in fits]
    log.info("init from %s; new (randomly initialised): %s", source, fresh or "none")
