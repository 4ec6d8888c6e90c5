"""Cloze probes: ranking rule, brute-force recomputation, entity ids in the batch, the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import MATERIALS, OWNERS, TOYS, cli_error

from mmptm.eval.cloze import (
    ClozeItem,
    evaluate_cloze,
    mean_piece_logprob,
    query_sample,
    rank_metrics,
    read_cloze,
    realistic_ranks,
    relation_candidates,
)


def write_probe(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(d) + "\n" for d in lines), encoding="utf-8")
    return path


def probe_lines() -> list[dict]:
    lines = []
    for i, toy in enumerate(TOYS):
        lines.append({"sub_uri": f"T{i:03d}", "sub_label": toy, "obj_uri": "m",
                      "obj_label": MATERIALS[i % len(MATERIALS)], "predicate_id": "made_of",
                      "masked_sentences": [f"{toy} is made of [MASK] .",
                                           f"[MASK] is what {toy} is made of ."],
                      "facts": "text" if i % 2 else "graph"})  # fmt: skip
        lines.append({"sub_uri": f"T{i:03d}", "sub_label": toy, "obj_uri": "o",
                      "obj_label": OWNERS[i % len(OWNERS)], "predicate_id": "owned_by",
                      "masked_sentences": [f"[MASK] owns {toy} ."],
                      "facts": "text" if i % 2 else "graph"})  # fmt: skip
    return lines


def test_realistic_ranks_and_metrics_by_hand():
    scores = torch.tensor([[3.0, 1.0, 3.0, 0.0], [0.0, 2.0, -1.0, 5.0], [1.0, 1.0, 1.0, 1.0]])
    ranks = realistic_ranks(scores, torch.tensor([0, 3, 2]))
    # row 0: one tie above nothing → 1 + 0 + 1/2; row 1: best; row 2: all tied → (4 + 1) / 2
    torch.testing.assert_close(ranks, torch.tensor([1.5, 1.0, 2.5], dtype=torch.float64))
    m = rank_metrics(ranks)
    assert m["p@1"] == pytest.approx(1 / 3) and m["p@10"] == 1.0
    assert m["mrr"] == pytest.approx((1 / 1.5 + 1 + 1 / 2.5) / 3)


def test_mean_piece_logprob_by_hand():
    # rows 0 and 2 have 2 and 1 masked pieces, row 1 none (a candidate cut off by max_len)
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]]))
    mean, n = mean_piece_logprob(logp, torch.tensor([0, 1, 2]), torch.tensor([0, 0, 2]), 3)
    assert n.tolist() == [2, 0, 1]
    assert mean[0].item() == pytest.approx((math.log(0.5) + math.log(0.8)) / 2)
    assert mean[1].item() == float("-inf")
    assert mean[2].item() == pytest.approx(math.log(0.6))
    # a one-piece candidate beats a two-piece one whose pieces are likelier on average only
    # if its own log-probability is higher: the ranking reads these means
    ranks = realistic_ranks(mean[None, [0, 2]], torch.tensor([1]))
    assert ranks.item() == (1.0 if math.log(0.6) > mean[0].item() else 2.0)


def test_candidates_from_file_and_given(tmp_path):
    items = read_cloze(write_probe(tmp_path / "p.jsonl", probe_lines()))
    c = relation_candidates(items)
    assert c["made_of"] == MATERIALS and c["owned_by"] == OWNERS
    given = relation_candidates(items, ["steel", "wood"])
    assert given["made_of"][:2] == ["steel", "wood"] and set(MATERIALS) <= set(given["made_of"])


def _brute_force_ranks(run: Path, lines: list[dict]) -> list[float]:
    """Every candidate scored by hand: tokenised in its sentence, its pieces masked, the mean
    log-probability of its pieces from the model's MLM head on a batch built here."""
    from mmptm.models.load import load_pretrained

    model, tok, _ = load_pretrained(str(run))
    mlm = model.objectives["mlm"]
    cands: dict[str, list[str]] = {}
    for d in lines:
        cands.setdefault(d["predicate_id"], [])
        if d["obj_label"] not in cands[d["predicate_id"]]:
            cands[d["predicate_id"]].append(d["obj_label"])
    ranks = []
    for d in lines:
        scores = []
        for c in cands[d["predicate_id"]]:
            per_sentence = []  # a line's sentences: the mean of the candidate's scores
            for sent in d["masked_sentences"]:
                sent = sent.replace(" .", ".")  # as running text, as the training text is
                text = sent.replace("[MASK]", c)
                start = sent.index("[MASK]")
                ids, offs = tok.encode_with_offsets(text)
                inside = [a < start + len(c) and b > start and a < b for a, b in offs]
                x = [tok.cls_id, *[tok.mask_id if m else i for i, m in zip(ids, inside)],
                     tok.sep_id]  # fmt: skip
                L = len(x)
                batch = {
                    "input_ids": torch.tensor([x]),
                    "attention_mask": torch.ones(1, L, dtype=torch.bool),
                    "segment_ids": torch.zeros(1, L, dtype=torch.long),
                    "lang_ids": torch.full((1, L), tok.languages.index("en")
                                           if "en" in tok.languages else 0),
                }  # fmt: skip
                with torch.no_grad():
                    h = model.fuse(batch).hidden["text"][0, 1:-1]
                    logp = mlm.logits(h).log_softmax(-1)
                lp = [logp[t, ids[t]].item() for t in range(len(ids)) if inside[t]]
                per_sentence.append(sum(lp) / len(lp))
            scores.append(sum(per_sentence) / len(per_sentence))
        gold = cands[d["predicate_id"]].index(d["obj_label"])
        higher = sum(s > scores[gold] for s in scores)
        tied = sum(s == scores[gold] for s in scores) - 1
        ranks.append(1 + higher + tied / 2)
    return ranks


def test_cloze_equals_brute_force(toy_text_run, tmp_path):
    lines = probe_lines()
    result = evaluate_cloze(str(toy_text_run), str(write_probe(tmp_path / "c.en.jsonl", lines)))
    ranks = _brute_force_ranks(toy_text_run, lines)
    n = len(lines)
    assert result["overall"]["n"] == n and result["language"] == "en"
    assert result["overall"]["p@1"] == pytest.approx(sum(r == 1 for r in ranks) / n)
    assert result["overall"]["mrr"] == pytest.approx(sum(1 / r for r in ranks) / n, rel=1e-5)
    graph = [r for r, d in zip(ranks, lines) if d["facts"] == "graph"]
    assert result["by_facts"]["graph"]["mrr"] == pytest.approx(
        sum(1 / r for r in graph) / len(graph), rel=1e-5
    )
    made_of = [r for r, d in zip(ranks, lines) if d["predicate_id"] == "made_of"]
    assert result["by_relation"]["made_of"]["n"] == len(made_of)
    assert result["candidates"] == {"made_of": len(MATERIALS), "owned_by": len(OWNERS)}
    assert 0 <= result["single_piece_answers"] <= n


def test_queries_are_running_text_with_the_candidate_and_subject_spans():
    item = ClozeItem(["Bimo , the toy , is made of [MASK] ."], "Bimo", "wood", "made_of", "T0")
    q = query_sample(item, 0, "pine wood", "en", "k")
    text = q["txt"]
    assert text == "Bimo, the toy, is made of pine wood."
    ((s, e, _),) = q["json"]["cloze"]
    ((ms, me, entity),) = q["json"]["mentions"]
    assert (text[s:e], text[ms:me], entity) == ("pine wood", "Bimo", "T0")


def test_one_sentence_of_each_line(toy_text_run, tmp_path):
    lines = probe_lines()
    path = write_probe(tmp_path / "c.en.jsonl", lines)
    firsts = [{**d, "masked_sentences": d["masked_sentences"][:1]} for d in lines]
    ranks = _brute_force_ranks(toy_text_run, firsts)
    result = evaluate_cloze(str(toy_text_run), str(path), sentence=0)
    assert result["overall"]["mrr"] == pytest.approx(sum(1 / r for r in ranks) / len(ranks),
                                                     rel=1e-5)  # fmt: skip
    with pytest.raises(ValueError, match=r"c.en.jsonl: line 2 has no masked sentence 1"):
        evaluate_cloze(str(toy_text_run), str(path), sentence=1)


def test_subject_entity_ids_reach_the_batch(toy_text_run, tmp_path):
    from mmptm.models.load import load_pretrained

    ids = tmp_path / "entities.txt"
    ids.write_text("".join(f"T{i:03d}\n" for i in reversed(range(len(TOYS)))))
    over = ["data.modalities.text.spans={entity: mentions}",
            f"data.modalities.text.span_vocabularies={{entity: {ids}}}"]  # fmt: skip
    model, tok, cfg = load_pretrained(str(toy_text_run), over)
    seen = []
    fuse = model.fuse

    def spy(batch):
        seen.append({k: batch[k].clone() for k in ("input_ids", "entity_ids", "cloze_mask")})
        return fuse(batch)

    model.fuse = spy
    lines = probe_lines()[:2]  # Bimo: "Bimo is made of [MASK] ." ... and "[MASK] owns Bimo ."
    given = {"made_of": MATERIALS, "owned_by": OWNERS}
    f = write_probe(tmp_path / "c.jsonl", lines)
    evaluate_cloze("", str(f), candidates=given, model=(model, tok, cfg))
    rows = [(b["entity_ids"][i], b["input_ids"][i], b["cloze_mask"][i])
            for b in seen for i in range(len(b["input_ids"]))]  # fmt: skip
    assert len(rows) == 2 * len(MATERIALS) + len(OWNERS)  # made_of has two sentences
    bimo_row = len(TOYS) - 1  # T000 is the last line of entities.txt
    first_piece = tok.encode_with_offsets("Bimo")[0][0]
    for ent, x, cloze in rows:
        at = (ent >= 0).nonzero()[:, 0].tolist()
        assert len(at) == 1 and ent[at[0]] == bimo_row
        assert x[at[0]] == first_piece and not cloze[at[0]]  # the subject, not the masked object
        assert (x[cloze] == tok.mask_id).all() and cloze.any()


def test_cli_cloze_and_errors(toy_text_run, tmp_path, capsys):
    from mmptm.cli import main

    f = write_probe(tmp_path / "c.en.jsonl", probe_lines())
    out = tmp_path / "r.json"
    assert main(["eval", "probe", str(toy_text_run), "--cloze", str(f), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "facts=graph" in printed and "relation made_of" in printed
    assert json.loads(out.read_text())["overall"]["n"] == len(probe_lines())
    bad = write_probe(tmp_path / "bad.jsonl", [*probe_lines()[:1], {"sub_label": "x"}])
    msg = cli_error(capsys, ["eval", "probe", str(toy_text_run), "--cloze", str(bad)])
    assert "bad.jsonl:2" in msg and "obj_label" in msg
