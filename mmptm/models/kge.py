"""A knowledge-graph embedding model: an entity table (in memory or memory-mapped) + relations.

The entity table is a plain tensor, not a parameter: a batch gathers the rows it touches
(``gather``), the training loop updates only those rows (sparse, as PyTorch-BigGraph does), so
the table can live in a memory-mapped ``.npy`` of 4.6 M × 100 floats (Wikidata5M, 1.8 GB)
without ever being read whole into memory or onto the GPU. Relations are few: a parameter on
the compute device, updated densely.

Initialisation (both tables): uniform in ±6/√D as in TransE, drawn in fixed chunks of rows from
one seeded generator, so an in-memory and a memory-mapped table start identical; RotatE's
relations are D/2 phases, uniform in ±π (as PyKEEN's ``init_phases``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mmptm.kg.graph import Embeddings, Vocabulary, save_embeddings
from mmptm.layers.kge import COMPLEX_MODELS, Scorer, relation_width

INIT_CHUNK = 1 << 16  # rows drawn per call of the generator (fixed: same numbers either way)


def _init_rows(table: torch.Tensor, gen: torch.Generator, normalize: bool) -> None:
    bound = 6.0 / math.sqrt(table.shape[1])
    for start in range(0, len(table), INIT_CHUNK):
        rows = torch.empty(min(INIT_CHUNK, len(table) - start), table.shape[1])
        rows.uniform_(-bound, bound, generator=gen)
        table[start : start + len(rows)] = F.normalize(rows, dim=-1) if normalize else rows


def default_normalize(model: str) -> bool:
    """Unit-norm entities unless asked: TransE's constraint, kept for DistMult (as before) and
    ComplEx (it bounds the product the way PyKEEN's L2 regulariser does; unbounded, ComplEx
    did not learn a symmetric relation at the default lr); RotatE's moduli stay free, as in its
    paper and PyKEEN."""
    return model != "rotate"


class KGEModel:
    """Entity table ``entities [E,D]`` (storage device) + ``relations [R,D]`` (compute device)."""

    def __init__(
        self,
        n_entities: int,
        n_relations: int,
        dim: int,
        *,
        model: str = "transe",
        p_norm: int = 1,
        normalize_entities: bool | None = None,
        device: str | torch.device = "cpu",
        mmap_path: str | Path | None = None,
        seed: int = 0,
    ) -> None:
        self.model, self.p_norm, self.dim = model, p_norm, dim
        self.score = Scorer(model, p_norm)
        if model in COMPLEX_MODELS and dim % 2:
            raise ValueError(f"{model}: dim {dim} must be even (D/2 complex numbers per row)")
        if normalize_entities is None:
            normalize_entities = default_normalize(model)
        self.normalize_entities = normalize_entities
        self.device = torch.device(device)
        gen = torch.Generator().manual_seed(seed)
        if mmap_path is not None:
            # the table is the output file itself; rows are read and written in place
            self.entities_np: np.ndarray | None = np.lib.format.open_memmap(
                mmap_path, mode="w+", dtype=np.float32, shape=(n_entities, dim)
            )
            self.entities = torch.from_numpy(self.entities_np)
        else:
            self.entities_np = None
            self.entities = torch.empty(n_entities, dim)
        _init_rows(self.entities, gen, normalize_entities)
        if mmap_path is None:
            self.entities = self.entities.to(self.device)
        rel = torch.empty(n_relations, relation_width(model, dim))
        if model == "rotate":
            rel.uniform_(-math.pi, math.pi, generator=gen)
        else:
            _init_rows(rel, gen, normalize=False)
        self.relations = torch.nn.Parameter(rel.to(self.device))

    @property
    def storage(self) -> torch.device:
        return self.entities.device

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the entity table, on the compute device (a copy)."""
        return self.entities.index_select(0, ids.to(self.storage)).to(self.device)

    def entity_chunks(self, rows: int) -> Iterator[tuple[int, torch.Tensor]]:
        """(first row, ``[C,D]`` rows on the compute device) over the whole table."""
        for start in range(0, len(self.entities), rows):
            yield start, self.entities[start : start + rows].to(self.device)

    def project(self, rows_UD: torch.Tensor) -> torch.Tensor:
        """TransE's unit-norm entities, imposed on the rows a step changed (or left as they are)."""
        return F.normalize(rows_UD, dim=-1) if self.normalize_entities else rows_UD

    def save(self, folder: str | Path, entities: Vocabulary, relations: Vocabulary) -> None:
        """``entities.npy``/``.txt`` and ``relations.npy``/``.txt`` (``load_embeddings``)."""
        table = self.entities_np
        if table is not None:
            table.flush()  # the memory-mapped table already is entities.npy
        else:
            table = self.entities.cpu().numpy()
        save_embeddings(folder, "entities", Embeddings(entities, table))
        rel = self.relations.detach().cpu().numpy()
        save_embeddings(folder, "relations", Embeddings(relations, rel))
