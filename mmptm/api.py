"""The public Python API, exported by ``mmptm`` itself: recipes by name, models, trained runs
with the transforms their inputs need, training, and the registered parts.

    >>> import mmptm
    >>> mmptm.list_recipes(modality="audio")           # names, as `mmptm recipes` lists them
    >>> model = mmptm.create_model("clip_tiny")        # a fresh model
    >>> run = mmptm.load("runs/demo-clip")              # a trained run and its transforms
    >>> run.embed_text(["a large red circle"]) @ run.embed_images(["photo.jpg"]).T

Everything here composes the library's own functions (``mmptm.recipe``,
``mmptm.models.load``, ``mmptm.search.sides``, ``mmptm.train``); the command line calls the
same ones.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmptm.batch import pick_device
from mmptm.data.decode import Collate, Decoder
from mmptm.modalities.base import DataContext, Modality, Sample, build_modalities
from mmptm.models.load import build_model, load_pretrained
from mmptm.models.pretrain import PretrainModel
from mmptm.recipe import RunConfig, add_recipe_dir, list_recipes, load_recipe, recipe_path
from mmptm.registry import ENCODERS, FUSIONS, MODALITIES, OBJECTIVES
from mmptm.search.images import PNG_MODES
from mmptm.search.sides import DualEncoder, text_sample

#: a picture, a sound or a clip as the API takes it: a file path, its bytes, or (images) a
#: PIL image
Media = str | os.PathLike[str] | bytes | Any


def list_parts(kind: str | None = None) -> dict[str, list[str]]:
    """The registered parts by plug point (``modality``, ``encoder``, ``fusion``,
    ``objective``), or those of one ``kind``: what a recipe may name."""
    parts = {r.kind: r.names() for r in (MODALITIES, ENCODERS, FUSIONS, OBJECTIVES)}
    if kind is None:
        return parts
    if kind not in parts:
        raise ValueError(f"unknown kind of part {kind!r}; kinds: {', '.join(parts)}")
    return {kind: parts[kind]}


def _overrides(overrides: Sequence[str], model_keys: Mapping[str, Any]) -> list[str]:
    """``key=value`` overrides, with keyword arguments as ``model.<key>`` ones (a nested key
    spelled with ``__``: ``fusion__transformer__layers=2``); values as JSON, which YAML reads."""
    extra = [f"model.{k.replace('__', '.')}={json.dumps(v)}" for k, v in model_keys.items()]
    return [*overrides, *extra]


def create_model(
    recipe: str | RunConfig,
    *overrides: str,
    vocab_size: int | None = None,
    seed: int | None = None,
    **model_keys: Any,
) -> PretrainModel:
    """A freshly initialised model of a recipe (a name, a YAML file or a loaded config), as
    ``timm.create_model`` gives one: ``create_model("clip_tiny", width=128)``.

    ``overrides`` are ``key=value`` strings of the whole recipe; keyword arguments set
    ``model.<key>`` (``__`` for a nested key). The vocabulary comes from the recipe's
    tokenizer file, or from ``vocab_size`` when there is none yet (the recipe's
    ``info.vocab_size`` when that file is missing). ``seed`` (default: the recipe's) seeds
    the initial weights as training does.
    """
    from mmptm.train.trainer import seed_everything

    if isinstance(recipe, RunConfig):
        cfg = recipe
        if overrides or model_keys:
            raise ValueError("create_model: overrides go with a recipe name or file, not a config")
    else:
        cfg = load_recipe(recipe, _overrides(overrides, model_keys))
    if vocab_size is None and cfg.data.tokenizer and not Path(cfg.data.tokenizer).is_file():
        vocab_size = cfg.info.vocab_size or None
        if vocab_size is None:
            raise ValueError(
                f"data.tokenizer {cfg.data.tokenizer} does not exist: train one (`mmptm "
                "tokenizer train`), point data.tokenizer at it, or pass vocab_size="
            )
    seed_everything(cfg.seed if seed is None else seed)
    model, _ = build_model(cfg, vocab_size)
    return model


@dataclass
class Run:
    """A trained run with what its inputs need: ``model`` (eval mode), ``tokenizer``,
    ``config``, and ``transforms``, the modality plug-ins that turn raw samples (shard
    members: ``{"txt": ..., "jpg": ...}``) into the batch the model reads
    (:meth:`batch`). A dual encoder (a contrastive head: CLIP, CLAP, ALBEF's ITC, text↔text)
    also embeds text, images, audio and video (:meth:`embed_text`, ...)."""

    model: PretrainModel
    tokenizer: Any
    config: RunConfig
    transforms: list[Modality]
    device: torch.device
    dual: DualEncoder | None = None

    def batch(self, samples: Sequence[Sample]) -> dict[str, Any]:
        """Raw samples (each a dict of shard members, as bytes, with a ``__key__``) → one
        collated batch on the run's device, decoded as evaluation decodes them."""
        from mmptm.batch import move_to

        decoder = Decoder(self.transforms, train=False)
        return move_to(Collate(self.transforms)([decoder(s) for s in samples]), self.device)

    def _dual(self) -> DualEncoder:
        if self.dual is None:
            raise ValueError(
                "embedding needs a dual encoder (a run with a contrastive head: clip, clap, "
                f"albef, xtext_clip ...); {self.config.output_dir} has none"
            )
        return self.dual

    def _side(self, modality: str) -> str:
        """The contrastive head's side whose plug-in reads this modality."""
        dual = self._dual()
        for name, side in dual.sides.items():
            if any(p.registry_name == modality for p in side.plugins):
                return name
        raise ValueError(f"this run's contrastive head has no {modality} side: {list(dual.sides)}")

    def embed_text(self, texts: Sequence[str], lang: str | Sequence[str] = "en") -> np.ndarray:
        """Normalised vectors [N,E] of sentences in language ``lang`` (one code, or one per
        sentence)."""
        langs = [lang] * len(texts) if isinstance(lang, str) else list(lang)
        if len(langs) != len(texts):
            raise ValueError(f"embed_text: {len(texts)} sentences but {len(langs)} languages")
        samples = [
            text_sample(t, la, key=f"text{i}") for i, (t, la) in enumerate(zip(texts, langs))
        ]
        return self._dual().embed_samples(self._side("text"), samples)

    def embed_images(self, images: Sequence[Media]) -> np.ndarray:
        """Normalised vectors [N,E] of pictures (paths, bytes or PIL images)."""
        return self._embed("image", images, "png")

    def embed_audio(self, sounds: Sequence[Media]) -> np.ndarray:
        """Normalised vectors [N,E] of sounds (paths or bytes of flac, wav, ogg, mp3)."""
        return self._embed("audio", sounds, "wav")

    def embed_video(self, clips: Sequence[Media]) -> np.ndarray:
        """Normalised vectors [N,E] of clips (paths or bytes of mp4, webm)."""
        return self._embed("video", clips, "mp4")

    def _embed(self, modality: str, items: Sequence[Media], default_member: str) -> np.ndarray:
        side = self._side(modality)
        samples = [
            {"__key__": f"{modality}{i}", **media_member(x, default_member)}
            for i, x in enumerate(items)
        ]
        return self._dual().embed_samples(side, samples)


def media_member(item: Media, default_member: str) -> dict[str, bytes]:
    """One picture, sound or clip as the shard member its plug-in reads: a file by its
    extension (``.jpeg`` is ``jpg``), bytes as ``default_member``, a PIL image as PNG."""
    if isinstance(item, bytes):
        return {default_member: item}
    if isinstance(item, (str, os.PathLike)):
        path = Path(item)
        ext = path.suffix.lower().lstrip(".") or default_member
        return {"jpg" if ext == "jpeg" else ext: path.read_bytes()}
    if hasattr(item, "save"):  # a PIL image, in its own mode where PNG stores it
        if item.mode not in PNG_MODES:
            item = item.convert("RGBA" if "A" in item.mode else "RGB")
        buf = io.BytesIO()
        item.save(buf, format="PNG")
        return {"png": buf.getvalue()}
    raise TypeError(f"expected a path, bytes or a PIL image, got {type(item).__name__}")


def load(run: str | os.PathLike[str], *overrides: str, device: str = "cpu") -> Run:
    """A trained run (its directory or a checkpoint file) with the transforms its inputs
    need, in one call, as open_clip's ``create_model_and_transforms`` and LAVIS's
    ``load_model_and_preprocess`` give them. ``overrides``: ``key=value`` of its config."""
    dev = pick_device(device, setting="device")
    model, tokenizer, cfg = load_pretrained(str(run), overrides)
    model.to(dev)
    context = DataContext(tokenizer=tokenizer)
    transforms = build_modalities(model.data_needs(), cfg.data.modalities, context)
    try:
        dual = DualEncoder(model, cfg, tokenizer, str(dev))
    except ValueError:  # no contrastive head: the run still fuses, classifies, answers
        dual = None
    return Run(model, tokenizer, cfg, transforms, dev, dual)


def pretrain(recipe: str | RunConfig, *overrides: str) -> dict[str, Any]:
    """Pre-train a recipe (a name, a YAML file or a loaded config) with ``key=value``
    overrides, as ``mmptm pretrain`` does; returns the last logged metrics."""
    from mmptm.train.trainer import pretrain as run

    return run(recipe if isinstance(recipe, RunConfig) else load_recipe(recipe, overrides))


def finetune(recipe: str | RunConfig, init: str | None = None, *overrides: str) -> dict[str, Any]:
    """Fine-tune a task recipe from a trained run (``init``: its directory or checkpoint), as
    ``mmptm finetune`` does; returns ``{"last": metrics, "eval": scores of data.eval}``."""
    from mmptm.train.finetune import finetune as run

    if isinstance(recipe, RunConfig):
        return run(recipe, show=False)
    extra = [f"init={init}"] if init is not None else []
    return run(load_recipe(recipe, [*extra, *overrides]), show=False)


__all__ = [
    "Run",
    "add_recipe_dir",
    "create_model",
    "finetune",
    "list_parts",
    "list_recipes",
    "load",
    "load_recipe",
    "media_member",
    "pretrain",
    "recipe_path",
]
