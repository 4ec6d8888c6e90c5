"""The knowledge recipes (ERNIE, KEPLER, K-BERT, VL + entities) on a miniature knowledge
world: each trains (finite loss that falls on a repeated batch, a gradient on every weight),
with and without the graph through its one switch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import ROOT, tiny_overrides
from kworld import write_knowledge_world

from mmptm.data.pipeline import Loader, stream_config
from mmptm.data.tokenizer import train_tokenizer
from mmptm.encoders.base import VocabInfo
from mmptm.models.load import build_model
from mmptm.models.pretrain import data_transforms
from mmptm.models.run import load_run_config


@pytest.fixture(scope="module")
def kworld(tmp_path_factory) -> Path:
    root = write_knowledge_world(tmp_path_factory.mktemp("kworld"))
    shards = sorted((root / "knowledge" / "text").glob("train-*.tar"))
    train_tokenizer(shards, root / "tokenizer", vocab_size=60, seed=0, num_threads=1)
    return root


def _setup(recipe: str, world: Path, out: Path, *extra: str):
    over = tiny_overrides(world, out, recipe)
    over.append(f"model.fusion.entities.embeddings={world}/knowledge/transe")
    cfg = load_run_config(str(ROOT / "configs" / "pretrain" / f"{recipe}.yaml"), over + list(extra))
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    vocab = VocabInfo.from_tokenizer(tok)
    stream = stream_config(
        cfg.data, tok, needs=model.data_needs(), transforms=data_transforms(cfg.model, vocab)
    )
    return model, next(iter(Loader(stream, 0)))


def _train(model, batch, steps: int = 15) -> list[dict]:
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    model.train()
    history = []
    for _ in range(steps):
        out = model(batch)
        assert torch.isfinite(out.loss)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        history.append({k: float(v) for k, v in out.terms.items()} | {"loss": float(out.loss.detach())})
    return history


def test_ernie_tiny_trains_with_every_weight_and_learns(kworld, tmp_path):
    model, batch = _setup("ernie_tiny", kworld, tmp_path)
    assert (batch["entity_labels"] >= 0).sum() > 0 and "mlm_labels" in batch
    out = model(batch)
    out.loss.backward()
    missing = [n for n, p in model.named_parameters()
               if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)]  # fmt: skip
    assert not missing, f"no gradient reaches {missing}"
    assert not model.fusion.entities.table.weight.requires_grad  # frozen TransE vectors
    model.zero_grad()
    h = _train(model, batch)
    assert h[-1]["loss"] < 0.7 * h[0]["loss"]
    assert h[-1]["dea_loss"] < h[0]["dea_loss"]


def test_ernie_without_the_graph(kworld, tmp_path):
    model, batch = _setup("ernie_tiny", kworld, tmp_path, "model.fusion.knowledge=false")
    out = model(batch)
    assert "mlm_loss" in out.terms and not any(k.startswith("dea") for k in out.terms)
    # same architecture: the entity table and K-Encoder are there, they just see no entity
    with_graph, _ = _setup("ernie_tiny", kworld, tmp_path / "g")
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in with_graph.parameters()
    )
    model.eval()
    none = dict(batch, entity_ids=torch.full_like(batch["entity_ids"], -1))
    torch.testing.assert_close(model.fuse(batch).hidden["text"], model.fuse(none).hidden["text"])
