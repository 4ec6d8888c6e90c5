"""Cloze probes read the graph the run reads: K-BERT's sentence tree injects the subject's
triples into each query, KnowBERT's KAR gets the candidate spans ``annotate`` adds; a model
that answers from the injected knowledge alone is right with it and at chance without."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import MATERIALS, TOYS

from mmptm.eval.cloze import evaluate_cloze, query_needs
from mmptm.fusion.base import FusionOutput


def _made_of_lines() -> list[dict]:
    return [
        {"sub_uri": f"T{i:03d}", "sub_label": toy, "obj_uri": f"M{i % len(MATERIALS)}",
         "obj_label": MATERIALS[i % len(MATERIALS)], "predicate_id": "made_of",
         "masked_sentences": [f"{toy} is made of [MASK] ."]}
        for i, toy in enumerate(TOYS)
    ]  # fmt: skip


def made_of_probe(tmp: Path) -> Path:
    """A LAMA file of every toy's material, ``c.en.jsonl``."""
    probe = tmp / "c.en.jsonl"
    probe.write_text("".join(json.dumps(d) + "\n" for d in _made_of_lines()))
    return probe


def kbert_overrides(tmp: Path, knowledge: bool = True) -> list[str]:
    """Overrides that read the toy text run as K-BERT (same parameters: kbert is
    single_stream plus the visible matrix) with a graph stating every toy's material."""
    graph = tmp / "graph"
    graph.mkdir(exist_ok=True)
    (graph / "train.txt").write_text("".join(
        f"T{i:03d}\tmade_of\tM{i % len(MATERIALS)}\n" for i in range(len(TOYS))))  # fmt: skip
    (tmp / "entities.txt").write_text("".join(f"T{i:03d}\n" for i in range(len(TOYS))))
    (tmp / "aliases.txt").write_text("".join(f"M{i}\t{m}\n" for i, m in enumerate(MATERIALS)))
    return ["model.fusion.type=kbert", f"model.fusion.graph={graph}",
            f"model.fusion.entities={tmp}/entities.txt",
            f"model.fusion.aliases={{'*': {tmp}/aliases.txt}}", "model.fusion.max_len=60",
            f"model.fusion.knowledge={str(knowledge).lower()}"]  # fmt: skip


def _kbert(run: Path, tmp: Path, knowledge: bool = True):
    from mmptm.models.load import load_pretrained

    return load_pretrained(str(run), kbert_overrides(tmp, knowledge))


def _oracle(model, monkeypatch, seen: list) -> None:
    """Make ``model`` answer from injected tokens alone: every position's logits are 10 on
    each vocabulary id the row's injected branches hold, 0 elsewhere."""
    mlm = model.objectives["mlm"]
    V = mlm.logits(torch.zeros(1, model.cfg.width)).shape[-1]

    def fuse(batch):
        ids_BL = batch["input_ids"]
        inj_BL = batch.get("injected_mask", torch.zeros_like(ids_BL, dtype=torch.bool))
        seen.append({k: batch[k].clone() for k in ("input_ids", "cloze_mask")}
                    | {"injected_mask": inj_BL.clone()})  # fmt: skip
        h_BV = torch.zeros(len(ids_BL), V)
        for b in range(len(ids_BL)):
            h_BV[b, ids_BL[b][inj_BL[b]]] = 10.0
        h_BLV = h_BV[:, None].expand(-1, ids_BL.shape[1], -1)
        return FusionOutput(hidden={"text": h_BLV}, mask={}, pooled={})

    monkeypatch.setattr(model, "fuse", fuse)
    monkeypatch.setattr(mlm, "logits", lambda h: h)


def test_kbert_query_views_keep_the_sentence_tree_drop_no_text(toy_text_run, tmp_path):
    model, _, _ = _kbert(toy_text_run, tmp_path)
    needs = query_needs(model)
    assert needs["sentence_tree"].modality == "sentence_tree"
    assert needs["text"].facts["spans"] == {"entity": "mentions"}
    assert set(query_needs(model, None)) == set(model.data_needs())


@pytest.mark.parametrize("knowledge", [True, False])
def test_an_answer_only_the_injected_triple_gives(toy_text_run, tmp_path, monkeypatch, knowledge):
    model, tok, cfg = _kbert(toy_text_run, tmp_path, knowledge)
    seen: list[dict] = []
    _oracle(model, monkeypatch, seen)
    result = evaluate_cloze("", str(made_of_probe(tmp_path)), model=(model, tok, cfg))
    n, C = len(TOYS), len(MATERIALS)
    assert result["overall"]["n"] == n
    if not knowledge:  # nothing injected: every candidate scores alike, the realistic rank
        assert all(not b["injected_mask"].any() for b in seen)
        assert result["overall"]["p@1"] == 0.0
        assert result["overall"]["mrr"] == pytest.approx(2 / (C + 1))
        return
    assert result["overall"]["p@1"] == 1.0  # each toy's own material, from its branch alone
    rows = [(b["input_ids"][i], b["injected_mask"][i], b["cloze_mask"][i])
            for b in seen for i in range(len(b["input_ids"]))]  # fmt: skip
    assert len(rows) == n * C
    for r, (x, inj, cloze) in enumerate(rows):
        toy = r // C
        branch = tok.encode(f"made of {MATERIALS[toy % len(MATERIALS)]}")
        assert x[inj].tolist() == branch  # the graph's triple, after the subject's name
        assert not (inj & cloze).any() and (x[cloze] == tok.mask_id).all() and cloze.any()


def test_knowbert_queries_carry_the_annotated_spans(toy_text_run, tmp_path, monkeypatch):
    from mmptm.models import checkpoint
    from mmptm.models.load import build_model

    over = ["model.fusion.type=knowbert", "model.fusion.kar_after=[1]", "model.fusion.entity_dim=8",
            "model.fusion.kar_heads=2", "model.fusion.entities.num_entities=6",
            "model.fusion.entities.dim=8"]  # fmt: skip
    ckpt = checkpoint.read(str(toy_text_run))
    cfg = ckpt.run_config(over)
    model, tok = build_model(cfg)
    torch.manual_seed(0)  # the new KAR and entity table: random, the BERT part the run's
    model.load_state_dict(ckpt.model, strict=False)
    model.eval()
    seen: list[dict] = []
    fuse = model.fuse

    def spy(batch):
        out = fuse(batch)
        seen.append({k: batch[k].clone() for k in batch if k.startswith("candidate_")}
                    | {"h": out.hidden["text"].clone()})  # fmt: skip
        return out

    monkeypatch.setattr(model, "fuse", spy)

    def annotate(sample):  # the subject's name: two candidates, the gold first
        ((start, end, entity),) = sample["json"]["mentions"]
        sample["json"]["candidates"] = [[start, end, [int(entity[1:]), 5], [0.7, 0.3], 0]]
        return sample

    probe = made_of_probe(tmp_path)
    linked = evaluate_cloze("", str(probe), model=(model, tok, cfg), annotate=annotate)
    spans = torch.cat([b["candidate_spans"] for b in seen])
    ids = torch.cat([b["candidate_ids"] for b in seen])
    assert spans.shape[:2] == (len(TOYS) * len(MATERIALS), 1)
    for r in range(len(spans)):
        toy, c = divmod(r, len(MATERIALS))
        _, offsets = tok.encode_with_offsets(f"{TOYS[toy]} is made of {MATERIALS[c]}.")
        # the pieces with characters of the name, counted from [CLS] = 0
        name = [t + 1 for t, (a, b) in enumerate(offsets) if a < b and a < len(TOYS[toy])]
        assert spans[r, 0].tolist() == [name[0], name[-1]]
        assert ids[r, 0].tolist() == [toy, 5]
    h_linked = torch.cat([b["h"] for b in seen])
    seen.clear()
    plain = evaluate_cloze("", str(probe), model=(model, tok, cfg))
    assert all(not b["candidate_mask"].any() for b in seen)
    assert plain["overall"]["n"] == linked["overall"]["n"]
    # KAR folds the linked entities into the words: the queries' states differ without them
    assert not torch.allclose(h_linked, torch.cat([b["h"] for b in seen]))
