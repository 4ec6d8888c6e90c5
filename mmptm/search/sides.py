"""A trained dual encoder as a search index sees it: its sides, and samples → vectors.

A **side** is one of the two names of the run's contrastive head (an encoder): ``image`` and
``text`` for CLIP, ``regions`` and ``text`` for ALBEF's ITC, ``text`` and ``text2`` for the
text↔text model, ``audio`` and ``image`` for sound↔image. A side decodes raw samples
through the run's modality plug-ins for its encoder's views and is embedded by the head
(``eval.retrieval.embed_rows``, the one embedding loop). The collection and the queries take
the same path: a typed query is a one-sentence sample (``txt`` + ``json.language``, the
monolingual text format), an uploaded picture a sample with an image member, and a
candidate to re-rank the sample read back from its shard.
Legend: N rows, E embedding width.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mmptm.batch import KEY, pick_device
from mmptm.data.decode import Collate, Decoder
from mmptm.eval.retrieval import Sides, embed_rows, itm_scores, objective_types, retrieval_heads
from mmptm.modalities.base import DataContext, Modality, Sample, build_modalities
from mmptm.modalities.text import TextData
from mmptm.models import checkpoint
from mmptm.models.load import load_pretrained
from mmptm.models.pretrain import PretrainModel
from mmptm.objectives.contrastive import Contrastive
from mmptm.recipe import RunConfig


@dataclass
class Side:
    """One side of the contrastive head, with the plug-ins that decode its inputs."""

    name: str
    #: the other side (the same one for a head that aligns two rows of one view)
    partner: str
    plugins: list[Modality]
    #: the batch keys its encoder reads
    keys: tuple[str, ...]

    @property
    def text(self) -> bool:
        """It reads sentences alone: queries can be typed, entries carry a language."""
        return all(isinstance(p, TextData) for p in self.plugins)

    def reads(self, member: str) -> bool:
        """Whether every plug-in of the side can decode a sample made of this member."""
        return all(member in p.members for p in self.plugins)

    def batch(self, samples: Sequence[Sample]) -> dict:
        """Raw samples → one collated evaluation batch of this side's keys.

        The plug-ins' batch stages do not run: they pack a pair's second sentence (the only
        one today), and a search sample holds one sentence.
        """
        decoder = Decoder(self.plugins, train=False)
        return Collate(self.plugins)([decoder(s) for s in samples])


def text_sample(text: str, lang: str, key: str = "query") -> Sample:
    """One sentence as a raw sample (the monolingual text format the text plug-in reads)."""
    return {KEY: key, "txt": text.encode("utf-8"), "json": json.dumps({"language": lang}).encode()}


def fingerprint(model: torch.nn.Module) -> str:
    """A digest of every weight: two runs give the same vectors iff their digests agree."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class DualEncoder:
    """A run loaded for search: the model, its contrastive (and ITM) head, and its sides."""

    def __init__(
        self,
        model: PretrainModel,
        cfg: RunConfig,
        tokenizer: object,
        device: str = "cpu",
        batch_size: int = 128,
    ) -> None:
        contrastive, itm = retrieval_heads(model)
        if contrastive is None:
            raise ValueError(
                "a search index needs a contrastive head (a dual encoder: CLIP, ALBEF's ITC, "
                f"text↔text); this model's objectives are {objective_types(model)}"
            )
        self.model = model.to(device)
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.head: Contrastive = contrastive
        self.itm = itm
        self.device = torch.device(device)
        self.batch_size = batch_size
        text = cfg.data.modalities.get("text") or TextData.Config()
        #: the json field holding captions by language, and the languages the run was
        #: trained on (the text plug-in's settings)
        self.captions_field: str = text.captions_field
        self.caption_languages: list[str] = list(text.caption_languages)
        #: the languages a query may be in: the caption languages and the tokenizer's
        self.languages: list[str] = sorted(
            {*self.caption_languages, *getattr(tokenizer, "languages", ())}
        )
        a, b = contrastive.cfg.modalities
        needs = model.data_needs()
        context = DataContext(tokenizer=tokenizer)
        self.sides: dict[str, Side] = {}
        for name, partner in ((a, b), (b, a)):
            if name in self.sides:
                continue
            if name not in model.encoders:
                raise ValueError(f"contrastive side {name!r} is not an encoder of the model")
            views = model.encoders[name].data_needs()
            plugins = build_modalities({v: needs[v] for v in views}, cfg.data.modalities, context)
            keys = tuple(k for p in plugins for v in p.views for k in p.view_keys(v))
            self.sides[name] = Side(name, partner, plugins, keys)

    @classmethod
    def load(
        cls, run: str, overrides: Sequence[str] = (), device: str = "cpu", batch_size: int = 128
    ) -> tuple[DualEncoder, dict]:
        """The run (a run directory or checkpoint file) and what identifies its weights:
        ``{"run", "checkpoint", "step", "fingerprint"}``. A ``device`` this machine lacks
        is a ValueError before anything loads."""
        device = str(pick_device(device))
        path = checkpoint.resolve(run)
        model, tokenizer, cfg = load_pretrained(str(path), overrides)
        ident = {
            "run": str(Path(run).resolve()),
            "checkpoint": str(path.resolve()),
            "step": int(m.group(1)) if (m := checkpoint.CKPT_RE.match(path.name)) else 0,
            "fingerprint": fingerprint(model),
        }
        return cls(model, cfg, tokenizer, device, batch_size), ident

    def embed(self, side: str, data: dict) -> np.ndarray:
        """Normalised float32 vectors [N,E] of one side of a collated batch."""
        s = self.sides[side]
        z_NE = embed_rows(self.model, self.head, data, s.keys, side, self.device, self.batch_size)
        return z_NE.float().cpu().numpy()

    def embed_samples(self, side: str, samples: Sequence[Sample]) -> np.ndarray:
        """Raw samples → vectors [N,E] of ``side`` (``ValueError`` for one it cannot decode)."""
        return self.embed(side, self.sides[side].batch(samples))

    def rerank_scores(
        self, item_side: str, items: Sequence[Sample], text_side: str, query: Sample
    ) -> np.ndarray:
        """ITM scores [K] of (item k, the query sentence): ALBEF's second stage."""
        assert self.itm is not None
        data = {**self.sides[item_side].batch(items), **self.sides[text_side].batch([query])}
        sides = Sides(self.sides[item_side].keys, self.sides[text_side].keys)
        k = len(items)
        scores = itm_scores(
            self.itm, self.model, data, sides, torch.arange(k), torch.zeros(k, dtype=torch.long),
            self.device, self.batch_size,
        )  # fmt: skip
        return scores.float().numpy()
