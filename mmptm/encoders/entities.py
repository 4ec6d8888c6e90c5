"""Knowledge-graph entity embeddings as a model part: an entity table read from
``mmptm kg train-embeddings`` output (or any format ``load_embeddings`` reads), frozen or
trained, projected to the knowledge width.

Rows follow the id list of the table (``entities.txt``), which is also the vocabulary the
text plug-in maps mention ids with (``span_vocabularies``), so ``entity_ids`` index rows
directly; -1 means "no entity" and embeds to zeros. Without a file (``embeddings: ""``)
the table is ``num_entities`` random rows: what the ``_base`` recipes instantiate offline
and what tests use.

Legend: B batch, N tokens, E entities, F the file's width, K the knowledge width.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from mmptm.kg.graph import EMBEDDING_FILES, load_embeddings


@dataclass
class EntityTableConfig:
    """Where the entity embeddings come from and how the model uses them."""

    #: a folder ``mmptm kg train-embeddings`` wrote, or any file ``load_embeddings`` reads
    #: (``.npy`` with ``ids``, OpenKE ``entity2vec.vec``...); "" = ``num_entities`` random rows
    embeddings: str = ""
    #: the id list of a ``.npy`` table (a folder's ``entities.txt`` is found by itself)
    ids: str = ""
    #: rows of a table without a file
    num_entities: int = 0
    #: width of a table without a file (a file gives its own)
    dim: int = 100
    #: train the rows (false: frozen, as ERNIE keeps its TransE vectors)
    trainable: bool = False
    #: a Linear from the table's width to the knowledge width (needed when they differ)
    projection: bool = False

    def id_list(self) -> str:
        """The id list naming the rows ("" without a file): the text plug-in's vocabulary."""
        if not self.embeddings:
            return ""
        if self.ids:
            return self.ids
        path = Path(self.embeddings)
        if path.is_dir() or not path.suffix:
            return str(path / EMBEDDING_FILES["entities"][1])
        return str(path.parent / "entity2id.txt")


class EntityTable(nn.Module):
    """``ids [B,N]`` (-1 = none) → entity vectors ``[B,N,K]`` (zeros where none)."""

    def __init__(self, cfg: EntityTableConfig, width: int) -> None:
        super().__init__()
        self.cfg = cfg
        if cfg.embeddings:
            emb = load_embeddings(cfg.embeddings, cfg.ids or None)
            weight = torch.from_numpy(emb.vectors.astype("float32", copy=True))
            self.names: list[str] = list(emb.vocab.names)
        else:
            if cfg.num_entities < 1:
                raise ValueError(
                    "entities: give embeddings (a folder of mmptm kg train-embeddings) or "
                    f"num_entities >= 1 for a random table, got {cfg.num_entities}"
                )
            weight = torch.randn(cfg.num_entities, cfg.dim) * 0.02
            self.names = []
        self.table = nn.Embedding.from_pretrained(weight, freeze=not cfg.trainable)
        F = weight.shape[1]
        if F != width and not cfg.projection:
            raise ValueError(
                f"entities: the table is {F} wide but the knowledge width is {width}; set "
                "projection: true (or entity_dim to the table's width)"
            )
        self.project = nn.Linear(F, width) if cfg.projection else nn.Identity()
        if cfg.projection:
            nn.init.normal_(self.project.weight, std=0.02)
            nn.init.zeros_(self.project.bias)

    def __len__(self) -> int:
        return self.table.num_embeddings

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The projected rows ``[..., K]`` of valid ids (>= 0)."""
        return self.project(self.table(ids))

    def forward(self, ids_BN: torch.Tensor) -> torch.Tensor:
        has_BN1 = (ids_BN >= 0).unsqueeze(-1)
        return self.rows(ids_BN.clamp_min(0)) * has_BN1
