"""KnowBERT end to end on the miniature knowledge world: ``mmptm data candidates`` writes the
spans, the ``candidates`` plug-in turns them into tensors, ``knowbert_tiny`` trains MLM and
the linker (a gradient on every trainable weight, the linking loss falls), and the base
recipe has BERT-base's stack plus one KAR, counted by hand."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import torch
from conftest import tiny_overrides
from kworld import write_knowledge_world

from mmptm.cli import main as cli_main
from mmptm.data.pipeline import Loader, stream_config
from mmptm.encoders.base import VocabInfo
from mmptm.models.load import build_model
from mmptm.models.pretrain import data_transforms
from mmptm.recipe import load_run_config
from mmptm.tokenizers.sentencepiece import train_tokenizer


@pytest.fixture(scope="module")
def kworld(tmp_path_factory) -> Path:
    root = write_knowledge_world(tmp_path_factory.mktemp("kworld"))
    k = root / "knowledge"
    shards = sorted((k / "text").glob("train-*.tar"))
    train_tokenizer(shards, root / "tokenizer", vocab_size=60, seed=0, num_threads=1)
    code = cli_main([
        "data", "candidates", "--input", f"{k}/text/*.tar", "--aliases", f"{k}/graph/aliases.txt",
        "--triples", f"{k}/graph/train.txt", "--entities", f"{k}/transe/entities.txt",
        "--confusers", "2", "--out", f"{k}/candidates", "--no-progress",
    ])  # fmt: skip
    assert code == 0
    return root


def _setup(world: Path, out: Path, *extra: str):
    over = [*tiny_overrides(world, out, "knowbert_tiny"), "model.fusion.kar_after=[2]", *extra]
    cfg = load_run_config("knowbert_tiny", over)
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    vocab = VocabInfo.from_tokenizer(tok)
    stream = stream_config(
        cfg.data, tok, needs=model.data_needs(), transforms=data_transforms(cfg.model, vocab)
    )
    return model, tok, next(iter(Loader(stream, 0)))


def test_candidates_command_writes_every_span_with_its_gold(kworld):
    summary = json.loads((kworld / "knowledge" / "candidates" / "candidates.json").read_text())
    # 10 sentences x 2 copies x 3 splits, each with two gold mentions, all found
    assert summary["samples"] == 60 and summary["mentions"] == 120
    assert summary["gold_spans"] == 120 and summary["mentions_without_span"] == 0
    assert summary["candidates"] == 3 * summary["spans"]  # one alias, 2 confusers: 3 each
    with tarfile.open(kworld / "knowledge" / "candidates" / "train-en-000000.tar") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar}
    text = members["train0000.txt"].decode()
    meta = json.loads(members["train0000.json"])
    for start, end, ids, priors, gold in meta["candidates"]:
        (entity,) = [e for a, b, e in meta["mentions"] if (a, b) == (start, end)]
        assert ids[gold] == entity and abs(sum(priors) - 1) < 1e-5
        assert text[start:end] in {"Bimo", "wood"}


def test_batch_carries_token_spans_of_the_gold_mentions(kworld, tmp_path):
    _model, tok, batch = _setup(kworld, tmp_path)
    spans, ids, gold = batch["candidate_spans"], batch["candidate_ids"], batch["candidate_gold"]
    assert spans.shape[:2] == ids.shape[:2] == gold.shape and spans.shape[-1] == 2
    rows = (kworld / "knowledge" / "transe" / "entities.txt").read_text().split()
    labels = batch["mlm_labels"]  # the pieces MLM replaced, back in place
    input_ids = torch.where(labels >= 0, labels, batch["input_ids"])
    checked = 0
    for b in range(spans.shape[0]):
        text = tok.decode(input_ids[b].tolist())
        for m in range(spans.shape[1]):
            if not batch["candidate_mask"][b, m]:
                assert (spans[b, m] == -1).all() and gold[b, m] == -1
                continue
            first, last = spans[b, m].tolist()
            # no span keeps a piece MLM predicts (its candidates would name the answer)
            assert (labels[b, first : last + 1] < 0).all()
            words = tok.decode(input_ids[b, first : last + 1].tolist()).strip()
            assert words and words in text
            entity = rows[int(ids[b, m, gold[b, m]])]
            names = dict(
                line.split("\t")
                for line in (kworld / "knowledge" / "graph" / "aliases.txt")
                .read_text()
                .splitlines()
            )
            assert names[entity] == words  # the gold candidate is the entity the words name
            checked += 1
    assert checked >= spans.shape[0] // 2  # two mentions a row; masking drops some


def test_knowbert_tiny_trains_every_weight_and_the_linker_learns(kworld, tmp_path):
    model, _tok, batch = _setup(kworld, tmp_path)
    model.train()
    out = model(batch)
    assert {"mlm_loss", "linking_loss", "linking_acc", "linking_prior_acc"} <= set(out.terms)
    out.loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"no gradient reaches {missing}"
    assert not model.fusion.entities.table.weight.requires_grad  # frozen, as KnowBERT's
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(20):
        out = model(batch)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(float(out.terms["linking_loss"]))
    assert losses[-1] < 0.5 * losses[0]
    assert float(out.terms["linking_acc"]) == 1.0


def test_without_the_graph_no_span_reaches_kar(kworld, tmp_path):
    model, _tok, batch = _setup(kworld, tmp_path, "model.fusion.knowledge=false")
    model.eval()
    out = model(batch)
    assert "linking_loss" not in out.terms  # every span is off: nothing to link
    fused = model.fuse(batch)
    assert all(torch.isinf(v).all() for v in fused.link.values())


def test_base_recipe_is_bert_base_plus_one_kar_counted_by_hand(tiny_world):
    cfg = load_run_config("knowbert_base", [f"data.tokenizer={tiny_world}/tokenizer.model"])
    model, _ = build_model(cfg)
    fusion = model.fusion
    D, E = 768, 300

    def count(module) -> int:
        return sum(p.numel() for p in module.parameters())

    # BERT-base's stack: per layer Q, K, V, O (D x D + D), two LayerNorms, the 4D MLP
    assert count(fusion.stack) == 12 * (4 * (D * D + D) + 2 * 2 * D + (8 * D * D + 5 * D))
    block_E = 4 * (E * E + E) + 2 * 2 * E + 8 * E * E + 5 * E  # the spans' Transformer block
    kar = (
        D * E + E  # W1
        + E + 1  # span pooling scores
        + block_E
        + (2 * 100 + 100) + (100 + 1)  # the linker's MLP
        + 2 * E + E  # LayerNorm of the span states, the null key
        + 4 * (E * E + E)  # word-to-span attention
        + 8 * E * E + 5 * E  # its MLP
        + E * D + D  # W2
    )  # fmt: skip
    assert list(fusion.kar) == ["10"] and count(fusion.kar) == kar
    assert count(fusion.entities) == 5040 * E


def test_linking_accuracy_counts_every_gold_span_and_the_prior_as_the_json_says(kworld, tmp_path):
    from mmptm.eval.linking import linking_accuracy

    over = [*tiny_overrides(kworld, tmp_path, "knowbert_tiny"), "model.fusion.kar_after=[1,2]"]
    cfg = load_run_config("knowbert_tiny", over)
    model, tok = build_model(cfg)
    shards = f"{kworld}/knowledge/candidates/test-*.tar"
    got = linking_accuracy(model, cfg, tok, shards)
    # independently, from the json: spans with a gold candidate, and argmax prior == gold
    n = right = 0
    for path in sorted((kworld / "knowledge" / "candidates").glob("test-*.tar")):
        with tarfile.open(path) as tar:
            for m in tar:
                if m.name.endswith(".json"):
                    for _s, _e, _ids, priors, gold in json.loads(tar.extractfile(m).read())[
                        "candidates"
                    ]:
                        if gold >= 0:
                            n += 1
                            right += max(range(len(priors)), key=priors.__getitem__) == gold
    assert got["spans"] == n > 0
    assert got["prior_acc"] == pytest.approx(right / n)
    assert sorted(got["per_layer"]) == [1, 2] and got["acc"] == got["per_layer"][2]
    assert 0 <= got["acc"] <= 1


def test_prior_accuracy_by_hand():
    from mmptm.objectives.linking import prior_accuracy

    prior = torch.tensor([[[0.2, 0.8], [0.9, 0.0]], [[0.5, 0.5], [0.0, 0.0]]])
    cands = torch.tensor([[[3, 4], [5, -1]], [[1, 2], [-1, -1]]])
    gold = torch.tensor([[1, 0], [1, -1]])
    # right: span (0,0) and (0,1); (1,0) ties -> the first wins, gold is 1; (1,1) no gold
    assert prior_accuracy(prior, cands, gold) == (2, 3)


def test_the_study_prints_linking_beside_the_prior():
    from mmptm.studies.knowledge import format_knowledge

    cell = {"text": 0.5, "graph": 0.25}
    link = {"acc": 0.9, "prior_acc": 0.3, "spans": 10, "per_layer": {3: 0.9}}
    result = {"runs": {"knowbert_tiny with graph": {"typing": cell, "linking": link},
                       "knowbert_tiny without graph": {"typing": cell}}}  # fmt: skip
    text = format_knowledge(result)
    assert "knowbert_tiny with graph: linking accuracy 90.0 % vs the prior alone 30.0 % (10" in text
    assert "without graph: linking" not in text
