"""The relation plug-in: a triple's relation, ``json["relation"]`` → ``relation_ids [B]``.

Triple samples (``mmptm.converters.triples``: the head's and the tail's descriptions as a
sentence pair, plus the relation) feed KEPLER's knowledge-embedding objective, which declares
this plug-in with its relation vocabulary (an id list, row i = line i). Like the answers
plug-in it rides along in mixtures: a sample without a relation (a text source's) gets -1.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from mmptm.modalities.base import Modality, Sample, read_id_list
from mmptm.registry import MODALITIES


@MODALITIES.register("relation")
class RelationData(Modality):
    """The relation of a triple sample, as a row of the relation vocabulary (-1: none)."""

    members: ClassVar[tuple[str, ...]] = ("json",)
    keys: ClassVar[tuple[str, ...]] = ("relation_ids",)

    @dataclass
    class Config:
        type: str = "relation"
        #: id list of the relations (one per line, row i = line i); "" = integer ids only
        vocabulary: str = ""

    def __init__(self, cfg: Config, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self.rows = read_id_list(cfg.vocabulary) if cfg.vocabulary else None

    def decode(self, sample: Sample, meta: dict[str, Any], rng: random.Random | None) -> Sample:
        rel = meta.get("relation")
        if rel is None:
            row = -1
        elif isinstance(rel, str) and self.rows is not None and rel in self.rows:
            row = self.rows[rel]
        elif isinstance(rel, int) and not isinstance(rel, bool) and rel >= 0:
            row = rel
        else:
            raise ValueError(f"relation {rel!r} is not in {self.cfg.vocabulary or 'a vocabulary'}")
        return {self.prefix(self.views[0]) + "relation_ids": row}

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        key = self.prefix(self.views[0]) + "relation_ids"
        return {key: torch.tensor([s[key] for s in samples], dtype=torch.long)}
