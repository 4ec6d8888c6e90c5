"""ERNIE 1.0 (Baidu) on the miniature knowledge world: real batches mask mentions whole, and
the recipe trains; its baseline (BERT's MLM) is one override away."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import tiny_overrides
from kworld import write_knowledge_world

from mmptm.data.pipeline import Loader, stream_config
from mmptm.encoders.base import VocabInfo
from mmptm.models.load import build_model
from mmptm.models.pretrain import data_transforms
from mmptm.objectives.mlm import IGNORE
from mmptm.recipe import load_run_config
from mmptm.tokenizers.sentencepiece import train_tokenizer

MLM = "model.objectives.mlm"


@pytest.fixture(scope="module")
def kworld(tmp_path_factory) -> Path:
    root = write_knowledge_world(tmp_path_factory.mktemp("kworld"))
    shards = sorted((root / "knowledge" / "text").glob("train-*.tar"))
    train_tokenizer(shards, root / "tokenizer", vocab_size=60, seed=0, num_threads=1)
    return root


def _batches(world: Path, out: Path, *extra: str, n: int = 4):
    over = [*tiny_overrides(world, out, "ernie1_tiny"), "data.batch_size=16", *extra]
    cfg = load_run_config("ernie1_tiny", over)
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    vocab = VocabInfo.from_tokenizer(tok)
    stream = stream_config(
        cfg.data, tok, needs=model.data_needs(), transforms=data_transforms(cfg.model, vocab)
    )
    return model, [b for _, b in zip(range(n), Loader(stream, 0))]


def _mentions_masked(batch) -> tuple[int, int, int]:
    """(mentions, wholly masked, partly masked), mention by mention."""
    inside, sel = batch["entity_mask"], batch["mlm_labels"] != IGNORE
    n = whole = part = 0
    for b in range(inside.shape[0]):
        t, L = 0, inside.shape[1]
        while t < L:
            if not inside[b, t]:
                t += 1
                continue
            end = t
            while end < L and inside[b, end] and (end == t or batch["entity_ids"][b, end] < 0):
                end += 1
            s = sel[b, t:end]
            n, whole, part = n + 1, whole + bool(s.all()), part + bool(s.any() and not s.all())
            t = end
    return n, whole, part


def test_ernie1_masks_mentions_whole_and_trains(kworld, tmp_path):
    # entity masking alone (pieces and phrases almost never): a mention is in or out whole
    _, only = _batches(kworld, tmp_path / "e", f"{MLM}.mask_prob=1e-6", f'{MLM}.mask_phrases=""',
                       f"{MLM}.span_mask_prob=0.5")  # fmt: skip
    n, whole, part = map(sum, zip(*(_mentions_masked(b) for b in only)))
    assert n > 50 and part == 0
    assert 0.3 < whole / n < 0.7
    # the recipe as it is: all three levels; it trains with a gradient on every weight
    model, batches = _batches(kworld, tmp_path / "r", n=1)
    batch = batches[0]
    assert (batch["mlm_labels"] != IGNORE).any()
    out = model(batch)
    out.loss.backward()
    missing = [k for k, p in model.named_parameters()
               if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)]  # fmt: skip
    assert not missing
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = model(batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.7 * losses[0]


def test_ernie1_masks_more_in_runs_than_bert(kworld, tmp_path):
    """Knowledge masking masks runs of words; BERT's masking (the baseline override) rarely."""

    def runs(batches) -> float:
        sel = torch.cat([b["mlm_labels"] != IGNORE for b in batches])
        pairs = (sel[:, 1:] & sel[:, :-1]).sum()
        return float(pairs / sel.sum().clamp(min=1))

    _, ernie = _batches(kworld, tmp_path / "a")
    _, bert = _batches(kworld, tmp_path / "b", f'{MLM}.mask_spans=""', f'{MLM}.mask_phrases=""',
                       f"{MLM}.mask_prob=0.15")  # fmt: skip
    assert runs(ernie) > 2 * runs(bert)
