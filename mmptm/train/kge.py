"""`mmptm kg train-embeddings`: TransE / DistMult training with negative sampling.

One step: B positive triples, N negatives each (the head or the tail replaced by an entity
drawn uniformly, the side chosen per negative with probability 1/2, as PyKEEN's basic
sampler; negatives are not filtered against true triples), the loss of ``layers/kge.py``,
then a sparse update of the entity rows the batch touched (``RowOptimizer``) and a dense one
of the relations. All randomness comes from one seeded CPU generator, so a run is
reproducible and an in-memory table and a memory-mapped one (``mmap``) give the same result.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmptm.eval.link_prediction import link_prediction, named_relations
from mmptm.kg.graph import EMBEDDING_FILES, KnowledgeGraph, load_graph
from mmptm.layers.kge import COMPLEX_MODELS, LOSSES, MODELS, kge_loss
from mmptm.models.kge import KGEModel, default_normalize
from mmptm.progress import progress_bar

log = logging.getLogger(__name__)

OPTIMIZERS = ("adam", "adagrad", "sgd")
LR_SCHEDULES = ("constant", "linear", "cosine")
RESULT_FILE = "kge.json"


@dataclass
class KGETrainConfig:
    """Hyper-parameters of one knowledge-graph embedding run (saved in ``kge.json``)."""

    model: str = "transe"
    dim: int = 100
    p_norm: int = 1  # TransE's distance: L1 or L2
    normalize_entities: bool | None = None  # ‖e‖ = 1 after every step (None: TransE, DistMult)
    loss: str = "nssa"
    margin: float | None = None  # γ of either loss (None: 6 for distances, 0 for products)
    adversarial_temperature: float = 1.0  # α of nssa (0: uniform weights, KEPLER)
    negatives: int = 32
    optimizer: str = "adam"
    lr: float = 0.01
    lr_schedule: str = "cosine"  # lr over the run's steps: constant, or linear or cosine to 0
    batch_size: int = 512
    epochs: int = 50
    seed: int = 0
    device: str = "cpu"
    mmap: bool = False  # entity table (and its optimiser state) memory-mapped in the out dir
    eval_every: int = 0  # epochs between validation link predictions (0: none)
    eval_max_triples: int = 0  # validation triples evaluated (0: all)

    def resolved(self) -> KGETrainConfig:
        """This configuration with the model-dependent defaults (``None``) filled in."""
        return dataclasses.replace(
            self,
            margin=default_margin(self.model) if self.margin is None else self.margin,
            normalize_entities=default_normalize(self.model)
            if self.normalize_entities is None
            else self.normalize_entities,
        )

    def check(self) -> None:
        choices = {"model": MODELS, "loss": LOSSES, "optimizer": OPTIMIZERS,
                   "lr_schedule": LR_SCHEDULES}  # fmt: skip
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"{key} {getattr(self, key)!r}: expected one of {allowed}")
        for key in ("dim", "negatives", "batch_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be ≥ 1, got {getattr(self, key)}")
        if self.epochs < 0:
            raise ValueError(f"epochs must be ≥ 0, got {self.epochs}")
        if self.p_norm not in (1, 2):
            raise ValueError(f"p_norm must be 1 or 2, got {self.p_norm}")
        if self.model in COMPLEX_MODELS and self.dim % 2:
            raise ValueError(
                f"dim {self.dim}: {self.model} needs an even dim (D/2 complex numbers)"
            )
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r}: CUDA is not available here")


def default_margin(model: str) -> float:
    """γ by default: 6 where the score is a negative distance (TransE, RotatE: a positive
    needs −d > −6 and a negative −d < −6, PyKEEN's and the RotatE paper's scale); 0 where it
    is a product (DistMult, ComplEx), whose scores start near 0 and which a γ of 6 makes
    push every negative below −6 first (measured: a symmetric relation stays unlearnt)."""
    return 0.0 if model in ("distmult", "complex") else 6.0


def _state_table(shape: tuple[int, ...], device: torch.device, path: Path | None) -> torch.Tensor:
    if path is None:
        return torch.zeros(shape, device=device)
    return torch.from_numpy(np.lib.format.open_memmap(path, "w+", np.float32, shape))


class RowOptimizer:
    """Updates only the given rows of a table (in memory or memory-mapped).

    - ``sgd``: w -= lr·g.
    - ``adagrad``: row-wise Adagrad of PyTorch-BigGraph: one accumulator per row,
      s += mean_d g²; w -= lr·g / (√s + ε) (D times less state than element-wise).
    - ``adam``: lazy Adam, exactly ``torch.optim.SparseAdam``: moments of the touched rows
      only, bias correction by the global step count.
    """

    def __init__(self, kind: str, table: torch.Tensor, lr: float, *,
                 state_dir: Path | None = None, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 0.0) -> None:  # fmt: skip
        self.kind, self.table, self.lr, self.betas, self.step_count = kind, table, lr, betas, 0
        self.eps = eps or (1e-10 if kind == "adagrad" else 1e-8)
        where = (lambda name: state_dir / f"{name}.npy") if state_dir else (lambda name: None)
        if kind == "adagrad":
            self.sum_sq = _state_table((len(table),), table.device, where("adagrad_sum"))
        elif kind == "adam":
            self.exp_avg = _state_table(tuple(table.shape), table.device, where("adam_m"))
            self.exp_avg_sq = _state_table(tuple(table.shape), table.device, where("adam_v"))

    @torch.no_grad()
    def step(self, ids_U: torch.Tensor, grad_UD: torch.Tensor,
             project: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:  # fmt: skip
        """Apply the gradient ``grad_UD`` of the distinct rows ``ids_U``; ``project``: a
        constraint applied to the updated rows before they are written back."""
        ids_U, g = ids_U.to(self.table.device), grad_UD.to(self.table.device)
        self.step_count += 1
        if self.kind == "sgd":
            update = self.lr * g
        elif self.kind == "adagrad":
            s_U = self.sum_sq.index_select(0, ids_U) + g.pow(2).mean(1)
            self.sum_sq.index_copy_(0, ids_U, s_U)
            update = self.lr * g / (s_U.sqrt() + self.eps)[:, None]
        else:
            b1, b2 = self.betas
            m = self.exp_avg.index_select(0, ids_U).lerp_(g, 1 - b1)
            v = self.exp_avg_sq.index_select(0, ids_U).lerp_(g * g, 1 - b2)
            self.exp_avg.index_copy_(0, ids_U, m)
            self.exp_avg_sq.index_copy_(0, ids_U, v)
            bc1, bc2 = 1 - b1**self.step_count, 1 - b2**self.step_count
            update = (self.lr * math.sqrt(bc2) / bc1) * m / (v.sqrt() + self.eps)
        rows_UD = self.table.index_select(0, ids_U) - update
        self.table.index_copy_(0, ids_U, project(rows_UD) if project is not None else rows_UD)


def scheduled_lr(cfg: KGETrainConfig, step: int, total: int) -> float:
    """The learning rate of step ``step`` (0-based) of ``total``: ``constant``, or decayed to 0
    at the end, ``linear``ly or along a half ``cosine``."""
    if cfg.lr_schedule == "constant" or total <= 0:
        return cfg.lr
    done = step / total
    if cfg.lr_schedule == "linear":
        return cfg.lr * (1.0 - done)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * done))


def _set_lr(ent_opt: RowOptimizer, rel_opt: torch.optim.Optimizer, lr: float) -> None:
    ent_opt.lr = lr
    for group in rel_opt.param_groups:
        group["lr"] = lr


def _dense_optimizer(kind: str, params: list[torch.nn.Parameter], lr: float):
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr)
    if kind == "adagrad":
        return torch.optim.Adagrad(params, lr=lr)
    return torch.optim.SGD(params, lr=lr)


def corrupt(pos_B3: torch.Tensor, negatives: int, n_entities: int, gen: torch.Generator
            ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Negatives of each positive: (replacing entity [B,N], replaces-the-head flag [B,N])."""
    B = len(pos_B3)
    head_BN = torch.rand(B, negatives, generator=gen) < 0.5
    ent_BN = torch.randint(n_entities, (B, negatives), generator=gen)
    return ent_BN, head_BN


def train_step(model: KGEModel, ent_opt: RowOptimizer, rel_opt: torch.optim.Optimizer,
               pos_B3: torch.Tensor, ent_BN: torch.Tensor, head_BN: torch.Tensor,
               cfg: KGETrainConfig) -> float:  # fmt: skip
    """One step on positives ``pos_B3`` (h, r, t) and their negatives; returns the loss."""
    B, N = ent_BN.shape
    ids = torch.cat([pos_B3[:, 0], pos_B3[:, 2], ent_BN.reshape(-1)])
    # the distinct rows the batch touches: gathered once, updated once
    ids_U, inverse = torch.unique(ids, return_inverse=True)
    rows_UD = model.gather(ids_U).requires_grad_(True)
    inverse = inverse.to(model.device)
    # index_select, not rows[idx]: on CPU its backward (index_add) is ~2× faster
    # and split, not slices: a slice's backward fills a zero tensor of the whole
    h_BD, t_BD, e_XD = rows_UD.index_select(0, inverse).split([B, B, B * N])
    e_BND = e_XD.view(B, N, -1)
    r_BD = model.relations.index_select(0, pos_B3[:, 1].to(model.device))
    # a negative keeps one side of its positive: it is that side's query matched against e
    tail_q_BD = model.score.tail_query(h_BD, r_BD)
    head_q_BD = model.score.head_query(r_BD, t_BD)
    pos_B = model.score.match(tail_q_BD, t_BD)
    which_BN = torch.arange(B)[:, None] + B * head_BN.long()  # row of [tail queries; head ones]
    q_BND = torch.cat([tail_q_BD, head_q_BD]).index_select(0, which_BN.view(-1).to(model.device))
    q_BND = q_BND.view(B, N, -1)
    neg_BN = model.score.match(q_BND, e_BND)
    loss = kge_loss(cfg.loss, pos_B, neg_BN, cfg.margin, cfg.adversarial_temperature)
    rel_opt.zero_grad(set_to_none=True)
    loss.backward()
    ent_opt.step(ids_U, rows_UD.grad, model.project)
    rel_opt.step()
    return loss.item()


def train_kge(graph: KnowledgeGraph, cfg: KGETrainConfig, out: Path | None = None, *,
              progress: bool = True) -> tuple[KGEModel, dict[str, Any]]:  # fmt: skip
    """Train on ``graph``'s train split; evaluate on valid (every ``eval_every`` epochs) and
    test (at the end) when the graph has them. ``out``: needed by ``mmap`` (the table's file).
    """
    cfg.check()
    cfg = cfg.resolved()
    state_dir = None
    mmap_path = None
    if cfg.mmap:
        if out is None:
            raise ValueError("mmap: the entity table needs an output folder")
        out.mkdir(parents=True, exist_ok=True)
        mmap_path = out / EMBEDDING_FILES["entities"][0]
        state_dir = out / ".optimizer"
        state_dir.mkdir(exist_ok=True)
    model = KGEModel(
        len(graph.entities), len(graph.relations), cfg.dim, model=cfg.model, p_norm=cfg.p_norm,
        normalize_entities=cfg.normalize_entities, device=cfg.device, mmap_path=mmap_path,
        seed=cfg.seed,
    )  # fmt: skip
    ent_opt = RowOptimizer(cfg.optimizer, model.entities, cfg.lr, state_dir=state_dir)
    rel_opt = _dense_optimizer(cfg.optimizer, [model.relations], cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    train = torch.as_tensor(graph.splits["train"])
    known = graph.all_true()
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    bar = progress_bar(total=cfg.epochs * steps_per_epoch, desc="kg train", unit="batch",
                       enabled=progress)  # fmt: skip
    history: list[dict[str, Any]] = []
    train_s, step, loss = 0.0, 0, float("nan")
    for epoch in range(1, cfg.epochs + 1):
        t0 = time.perf_counter()
        order = torch.randperm(len(train), generator=gen)
        losses = []
        for start in range(0, len(train), cfg.batch_size):
            pos_B3 = train[order[start : start + cfg.batch_size]]
            ent_BN, head_BN = corrupt(pos_B3, cfg.negatives, len(graph.entities), gen)
            _set_lr(ent_opt, rel_opt, scheduled_lr(cfg, step, cfg.epochs * steps_per_epoch))
            loss = train_step(model, ent_opt, rel_opt, pos_B3, ent_BN, head_BN, cfg)
            step += 1
            if not math.isfinite(loss):
                raise FloatingPointError(f"kg train: non-finite loss {loss} at step {step}")
            losses.append(loss)
            bar.update(1)
            bar.set_postfix(epoch=epoch, loss=f"{loss:.4f}", refresh=False)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        train_s += time.perf_counter() - t0
        record: dict[str, Any] = {"epoch": epoch, "loss": float(np.mean(losses))}
        if cfg.eval_every and epoch % cfg.eval_every == 0 and len(graph.splits.get("valid", [])):
            record["valid"] = link_prediction(model, graph.splits["valid"], known,
                                              max_triples=cfg.eval_max_triples)["both"]  # fmt: skip
            log.info("epoch %d: loss %.4f, valid MRR %.4f, Hits@10 %.4f", epoch, record["loss"],
                     record["valid"]["mrr"], record["valid"]["hits@10"])  # fmt: skip
        history.append(record)
    bar.close()
    result: dict[str, Any] = {
        "config": dataclasses.asdict(cfg),
        "graph": graph.summary(),
        "train": {"epochs": cfg.epochs, "steps": step, "seconds": round(train_s, 3),
                  "triples_per_s": round(cfg.epochs * len(train) / max(train_s, 1e-9), 1),
                  "final_loss": history[-1]["loss"] if history else None},
        "history": history,
    }  # fmt: skip
    if len(graph.splits.get("test", [])):
        test = link_prediction(model, graph.splits["test"], known, progress=progress,
                               per_relation=True)  # fmt: skip
        result["test"] = named_relations(test, graph.relations.names)
    return model, result


def train_embeddings(triples: str | Path, out: str | Path, cfg: KGETrainConfig, *,
                     progress: bool = True) -> dict[str, Any]:  # fmt: skip
    """Read ``triples`` (a file or folder, see ``data/graph.py``), train, evaluate, and write
    ``out``: ``entities.npy``/``.txt``, ``relations.npy``/``.txt``, ``kge.json``."""
    out = Path(out)
    graph = load_graph(triples)
    out.mkdir(parents=True, exist_ok=True)
    model, result = train_kge(graph, cfg, out, progress=progress)
    model.save(out, graph.entities, graph.relations)
    shutil.rmtree(out / ".optimizer", ignore_errors=True)  # the memory-mapped optimiser state
    result["source"] = str(triples)
    (out / RESULT_FILE).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result
