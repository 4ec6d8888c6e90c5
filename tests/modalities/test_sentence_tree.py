"""K-BERT's sentence trees: soft positions and the visible matrix of a hand-built tree
against the paper's rules; the injection stage's caps; MLM never masks injected tokens."""

from __future__ import annotations

import torch

from mmptm.modalities.sentence_tree import Branch, InjectTriples, sentence_tree


def test_tree_positions_and_visibility_by_the_papers_rules():
    # [CLS] Tim Cook is visiting Beijing now [SEP]; "Tim Cook" (1-2) has the branches
    # "CEO Apple" (ids 20 21) and "born US" (22 23), "Beijing" (5) the branch "capital China".
    ids = [1, 10, 11, 12, 13, 14, 15, 2]
    branches = [Branch([20, 21], 2, (1, 3)), Branch([22, 23], 2, (1, 3)),
                Branch([24, 25], 5, (5, 6))]  # fmt: skip
    out, pos, injected, vis, source = sentence_tree(ids, list(range(8)), branches)
    assert out == [1, 10, 11, 20, 21, 22, 23, 12, 13, 14, 24, 25, 15, 2]
    # soft positions: branches continue from their entity; the sentence keeps its own
    assert pos == [0, 1, 2, 3, 4, 3, 4, 3, 4, 5, 6, 7, 6, 7]
    assert injected == [False] * 3 + [True] * 4 + [False] * 3 + [True] * 2 + [False] * 2
    assert source == [0, 1, 2, 2, 2, 2, 2, 3, 4, 5, 5, 5, 6, 7]
    sentence = [0, 1, 2, 7, 8, 9, 12, 13]
    groups = {"ceo": [3, 4], "born": [5, 6], "capital": [10, 11]}
    entity = {"ceo": [1, 2], "born": [1, 2], "capital": [9]}
    expected = torch.zeros(14, 14, dtype=torch.bool)
    for i in sentence:  # the sentence sees the sentence
        expected[i, sentence] = True
    for name, members in groups.items():
        for i in members:  # a branch sees itself and its entity ...
            expected[i, members] = True
            expected[i, entity[name]] = True
        for i in entity[name]:  # ... and only its entity sees it
            expected[i, members] = True
    assert torch.equal(vis, expected)


class _Tok:
    """Words → ids (one piece per word), enough for the injection stage."""

    pad_id = 0
    languages = ("en", "de")

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return [self.vocab.setdefault(w, 100 + len(self.vocab)) for w in text.split()]


def _batch():
    # row 0: [CLS] e5 x e7 [SEP] (two single-piece mentions); row 1: [CLS] e5 e5' y [SEP] [PAD]
    # with a two-piece mention at 1-2
    ids = torch.tensor([[1, 10, 11, 12, 2, 0], [1, 13, 14, 15, 2, 0]])
    real = ids != 0
    ents = torch.tensor([[-1, 5, -1, 7, -1, -1], [-1, 5, -1, -1, -1, -1]])
    inside = torch.tensor([[0, 1, 0, 1, 0, 0], [0, 1, 1, 0, 0, 0]]).bool()
    lang = torch.tensor([[0] * 6, [1] * 6])
    return {"input_ids": ids, "attention_mask": real, "entity_ids": ents, "entity_mask": inside,
            "segment_ids": torch.zeros(2, 6, dtype=torch.long), "lang_ids": lang}  # fmt: skip


def _stage(tok, **over):
    facts = {5: [("made of", "W"), ("owned by", "A"), ("comes from", "P")], 7: [("made of", "W")]}
    names = {"en": {"W": "wood", "A": "Anna"}, "de": {"W": "Holz"}, "*": {"P": "Paris"}}
    args = dict(prefix="", facts=facts, names=names, languages=("en", "de"), tokenizer=tok,
                max_entity_triples=2, max_triples=8, max_len=64)  # fmt: skip
    return InjectTriples(**{**args, **over})


def test_injection_caps_languages_and_carried_keys():
    tok = _Tok()
    b = _stage(tok)(_batch(), torch.Generator())
    words = {i: w for w, i in tok.vocab.items()}
    n0 = int(b["attention_mask"][0].sum())
    row0 = [words.get(i, i) for i in b["input_ids"][0, :n0].tolist()]
    # two triples for e5 (the cap per entity), one for e7, English names
    assert row0 == [1, 10, "made", "of", "wood", "owned", "by", "Anna", 11, 12, "made", "of",
                    "wood", 2]  # fmt: skip
    n1 = int(b["attention_mask"][1].sum())
    row1 = [words.get(i, i) for i in b["input_ids"][1, :n1].tolist()]
    # German sentence: German name, else the id (no German name of A) — after the whole mention
    assert row1 == [1, 13, 14, "made", "of", "Holz", "owned", "by", "A", 15, 2]
    assert b["lang_ids"][1, :n1].eq(1).all() and b["position_ids"][1, 3].item() == 3
    inj = b["injected_mask"]
    assert (b["entity_ids"][inj] == -1).all() and not b["entity_mask"][inj].any()
    assert b["entity_ids"][0, 1] == 5 and b["entity_ids"][0, 9] == 7
    capped = _stage(tok, max_triples=1)(_batch(), torch.Generator())
    assert int(capped["injected_mask"][0].sum()) == 3  # one triple in the sentence
    short = _stage(tok, max_len=8)(_batch(), torch.Generator())
    assert int(short["attention_mask"][0].sum()) <= 8
    none = _stage(tok, max_triples=0)(_batch(), torch.Generator())
    assert torch.equal(none["input_ids"], _batch()["input_ids"][:, :5])  # nothing injected
    assert not none["injected_mask"].any()


def test_every_span_annotation_follows_its_tokens_into_the_tree():
    """A fine-tuning head's spans (typing's ``mention``) must point at the same tokens after
    injection as before, and at no branch token."""
    tok = _Tok()
    batch = _batch()
    # row 0: the mention span on x (position 2), row 1 on y (position 3); ids at the first piece
    batch["mention_mask"] = torch.zeros(2, 6, dtype=torch.bool)
    batch["mention_mask"][0, 2] = batch["mention_mask"][1, 3] = True
    batch["mention_ids"] = torch.where(batch["mention_mask"], 0, -1)
    b = _stage(tok)(batch, torch.Generator())
    for row, token in ((0, 11), (1, 15)):  # x, y
        (at,) = b["mention_mask"][row].nonzero()[:, 0].tolist()
        assert b["input_ids"][row, at] == token
        assert b["mention_ids"][row, at] == 0 and (b["mention_ids"][row] == 0).sum() == 1
    assert not b["mention_mask"][b["injected_mask"]].any()


def test_mlm_never_masks_injected_tokens():
    from mmptm.objectives.mlm import MaskTokens

    b = _stage(_Tok())(_batch(), torch.Generator())
    side = MaskTokens(
        prefix="", mask_prob=0.9, p_mask=1.0, p_random=0.0, mask_id=4,
        special_ids=torch.tensor([0, 1, 2]), random_pool=torch.arange(5, 9),
    )  # fmt: skip
    out = side(b, torch.Generator().manual_seed(0))
    labelled = out["mlm_labels"] != -100
    assert labelled.any() and not (labelled & out["injected_mask"]).any()
