"""The candidates plug-in: json.candidates → token spans, candidate rows, priors and gold,
padded; spans without a piece, unknown entities and spans cut off by max_len handled as the
module says, by hand on a word-per-piece tokenizer."""

from __future__ import annotations

import json
import re

import pytest
import torch

from mmptm.modalities.base import DataContext
from mmptm.modalities.candidates import CandidatesData, DropMasked, DropTruncated, piece_span


class _Tok:
    """One piece per whitespace-separated word."""

    def encode_with_offsets(self, text: str):
        found = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
        return list(range(len(found))), found


@pytest.fixture
def plugin(tmp_path) -> CandidatesData:
    ids = tmp_path / "entities.txt"
    ids.write_text("A\nB\nC\n")
    cfg = CandidatesData.Config(entities=str(ids), max_candidates=2)
    return CandidatesData(cfg, views=["candidates"], context=DataContext(tokenizer=_Tok()))


def _sample(text: str, candidates) -> tuple[dict, dict]:
    return {"txt": text.encode()}, json.loads(json.dumps({"candidates": candidates}))


def test_piece_span_counts_from_cls():
    offsets = [(0, 4), (5, 8), (9, 13)]  # "Bimo met Kato"
    assert piece_span(offsets, 0, 4) == (1, 1)
    assert piece_span(offsets, 0, 8) == (1, 2)
    assert piece_span(offsets, 10, 12) == (3, 3)  # inside a piece: that piece
    assert piece_span(offsets, 4, 5) == (-1, -1)  # the space: no piece


def test_decode_and_collate_by_hand(plugin):
    text = "Bimo met Kato today"
    a = plugin.decode(*_sample(text, [
        [0, 4, ["A", "X", "B"], [0.5, 0.3, 0.2], 2],  # X unknown: dropped; gold B moves to 1
        [9, 13, ["C", "A", "B"], [0.6, 0.3, 0.1], 2],  # max_candidates 2: gold B cut off
        [4, 5, ["A"], [1.0], 0],  # the space covers no piece: dropped, counted
    ]), None)  # fmt: skip
    b = plugin.decode(*_sample("Kato", [[0, 4, ["C"], [1.0], 0]]), None)
    none = plugin.decode({"txt": b"no field"}, {}, None)
    batch = plugin.collate([a, b, none])
    assert batch["candidate_spans"].tolist() == [
        [[1, 1], [3, 3]], [[1, 1], [-1, -1]], [[-1, -1], [-1, -1]]]  # fmt: skip
    assert batch["candidate_ids"].tolist() == [
        [[0, 1], [2, 0]], [[2, -1], [-1, -1]], [[-1, -1], [-1, -1]]]  # fmt: skip
    torch.testing.assert_close(
        batch["candidate_priors"],
        torch.tensor([[[0.5, 0.2], [0.6, 0.3]], [[1.0, 0], [0, 0]], [[0, 0], [0, 0]]]),
    )
    assert batch["candidate_gold"].tolist() == [[1, -1], [0, -1], [-1, -1]]
    assert batch["candidate_mask"].tolist() == [[True, True], [True, False], [False, False]]
    assert plugin.dropped["no piece"] == 1


def test_a_bad_span_is_a_bad_sample(plugin):
    with pytest.raises(ValueError, match="not \\[start, end, \\[ids\\], \\[priors\\], gold\\]"):
        plugin.decode(*_sample("Bimo", [[0, 9, ["A"], [1.0], 0]]), None)
    with pytest.raises(ValueError, match="annotates the txt member"):
        plugin.decode({}, {"candidates": []}, None)


def test_spans_cut_off_by_max_len_are_dropped_and_counted():
    stage = DropTruncated("")
    real = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])  # 3 pieces; 1 piece
    batch = {
        "attention_mask": real,
        "candidate_spans": torch.tensor([[[1, 2], [3, 3]], [[1, 1], [2, 3]]]),
        "candidate_ids": torch.tensor([[[0], [1]], [[2], [0]]]),
        "candidate_priors": torch.ones(2, 2, 1),
        "candidate_gold": torch.tensor([[0, 0], [0, 0]]),
        "candidate_mask": torch.ones(2, 2, dtype=torch.bool),
    }
    out = stage(batch, torch.Generator())
    # row 1 has one real piece (position 1, then [SEP]): its span [2, 3] is cut off
    assert out["candidate_mask"].tolist() == [[True, True], [True, False]]
    assert out["candidate_spans"][1, 1].tolist() == [-1, -1]
    assert out["candidate_ids"][1, 1].tolist() == [-1] and out["candidate_gold"][1, 1] == -1
    assert float(out["candidate_priors"][1, 1].sum()) == 0.0
    assert stage.dropped["cut off by max_len"] == 1


def _spans_batch(spans, labels):
    """A batch of the candidates stages' keys: spans [B,M,2] (-1 padding), one candidate
    each, and masked LM labels [B,L] (-100 where nothing is predicted)."""
    spans_BM2 = torch.tensor(spans)
    real_BM = spans_BM2[..., 0] >= 0
    return {
        "candidate_spans": spans_BM2,
        "candidate_ids": torch.where(real_BM, 0, -1)[..., None],
        "candidate_priors": real_BM.float()[..., None],
        "candidate_gold": torch.where(real_BM, 0, -1),
        "candidate_mask": real_BM,
        "mlm_labels": torch.tensor(labels),
    }


def test_spans_with_a_predicted_piece_are_dropped_and_counted():
    # row 0: pieces 2 and 5 are predicted; spans [1,1] (no), [2,3] (piece 2), [4,6] (piece 5),
    # [3,4] (no). Row 1: nothing predicted, one span and padding.
    n = -100
    batch = _spans_batch(
        [[[1, 1], [2, 3], [4, 6], [3, 4]], [[1, 2], [-1, -1], [-1, -1], [-1, -1]]],
        [[n, n, 7, n, n, 9, n, n], [n] * 8],
    )
    stage = DropMasked("")
    out = stage(batch, torch.Generator())
    assert out["candidate_mask"].tolist() == [
        [True, False, False, True],
        [True, False, False, False],
    ]
    assert out["candidate_spans"][0, 1].tolist() == [-1, -1]
    assert out["candidate_spans"][0, 2].tolist() == [-1, -1]
    assert out["candidate_ids"][0, :, 0].tolist() == [0, -1, -1, 0]
    assert out["candidate_gold"][0].tolist() == [0, -1, -1, 0]
    assert out["candidate_priors"][0, :, 0].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert stage.dropped["masked for prediction"] == 2


def test_a_span_ending_at_the_last_piece_is_checked_there():
    n = -100
    batch = _spans_batch([[[3, 4]], [[3, 4]]], [[n, n, n, n, 5], [n, n, n, 5, n]])
    out = DropMasked("")(batch, torch.Generator())
    assert out["candidate_mask"].tolist() == [[False], [False]]


def test_drop_masked_off_keeps_the_stage_out(plugin, tmp_path):
    assert [type(s) for s in plugin.transforms()] == [DropTruncated, DropMasked]
    ids = tmp_path / "entities.txt"
    cfg = CandidatesData.Config(entities=str(ids), drop_masked=False)
    off = CandidatesData(cfg, views=["candidates"], context=DataContext(tokenizer=_Tok()))
    assert [type(s) for s in off.transforms()] == [DropTruncated]
