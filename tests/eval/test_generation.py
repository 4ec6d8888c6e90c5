"""Caption and translation metrics: CIDEr-D against coco-caption's Cider (pycocoevalcap),
BLEU with ragged references against a BLEU written out here, the caption tokenizer by hand."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import sacrebleu

from mmptm.eval import generation as G

Cider = pytest.importorskip("pycocoevalcap.cider.cider").Cider

# 24 items, 1 to 6 references each, in five languages and three scripts; hypotheses that
# match a reference, share nothing, repeat a word (clipping), are empty, differ in length
# (the Gaussian penalty), or hold n-grams no reference of the set has (df = 0)
EXAMPLES: list[tuple[str, list[str]]] = [
    ("A man riding a horse on a beach.", ["A man rides a horse along the beach.",
     "Someone riding a brown horse by the sea.", "A person on horseback at the beach.",
     "A man is riding a horse.", "Horse and rider on the sand."]),
    ("two dogs playing in the grass", ["Two dogs play in the grass.", "Dogs playing outside.",
     "A pair of dogs running on a lawn."]),
    ("a a a a a", ["A cat sitting on a mat.", "a cat on a mat"]),
    ("", ["An empty street at night.", "A street with no cars."]),
    ("A red bus.", ["A red double-decker bus drives down the street.", "A red bus.",
     "The bus is red.", "A big red bus on a city road."]),
    ("a plate of food with broccoli and rice", ["A plate with rice and broccoli.",
     "Broccoli, rice and chicken on a white plate.", "A healthy meal on a plate.",
     "Food on a plate.", "A dinner plate of rice, broccoli and meat.",
     "Chicken with broccoli and rice."]),
    ("zebra zebra giraffe", ["Two zebras standing next to a giraffe.",
     "Zebras and a giraffe in a field."]),
    ("a small child eating a slice of pizza in a kitchen with a dog",
     ["A child eats pizza.", "A kid with a slice of pizza.", "A little girl eating pizza."]),
    ("a clock tower", ["A tall clock tower in a city.", "The clock tower against a blue sky.",
     "An old tower with a clock."]),
    ("skateboarder does a trick", ["A skateboarder doing a trick on a ramp.",
     "A man skateboarding.", "A person performs a skateboard trick."]),
    ("Ein Mann fährt Fahrrad.", ["Ein Mann fährt Fahrrad auf der Straße.",
     "Ein Radfahrer auf einer Straße.", "Ein Mann auf einem Fahrrad."]),
    ("Ein großes blaues Dreieck ist über einem Kreis.", ["Ein großes blaues Dreieck ist über "
     "einem kleinen roten Kreis.", "Ein blaues Dreieck über einem roten Kreis."]),
    ("Un petit carré jaune, à gauche d'un cercle.", ["Un petit carré jaune est à gauche d'un "
     "grand cercle vert.", "Un carré jaune à gauche d'un cercle.", "Le carré est jaune."]),
    ("Большой синий треугольник над маленьким квадратом.", ["Большой синий треугольник "
     "находится над маленьким жёлтым квадратом.", "Синий треугольник над квадратом.",
     "Треугольник находится над квадратом."]),
    ("Маленький оранжевый квадрат слева от ромба", ["Маленький оранжевый квадрат находится "
     "слева от большого оранжевого ромба.", "Оранжевый квадрат слева от ромба."]),
    ("Un triángulo rojo grande está a la izquierda.", ["Un triángulo rojo grande está a la "
     "izquierda de un cuadrado amarillo.", "Un triángulo rojo a la izquierda."]),
    ("一只猫坐在垫子上。", ["一只猫坐在垫子上。", "猫在垫子上睡觉。", "垫子上有一只黑猫。"]),
    ("犬が公園で走っている", ["公園で犬が走っている。", "犬が走る。"]),
    ("a bowl of fruit", ["A bowl of fruit on a table."]),
    ("a bowl of fruit on a table", ["A bowl of fruit on a table.", "Fruit in a bowl.",
     "Apples and bananas in a bowl.", "A wooden bowl full of fruit."]),
    ("an airplane flying over a city", ["A plane flying in the sky.", "An airplane above "
     "buildings.", "A jet flies over a city.", "A large passenger airplane in flight."]),
    ("people walking", ["People walking down a busy street.", "A crowd of people walking.",
     "Pedestrians on a sidewalk.", "Many people walk in a city.", "People on a street."]),
    ("a man's surfboard, on the beach!", ["A surfboard lying on the beach.", "The man's "
     "surfboard on the sand.", "A surfboard on a beach."]),
    ("Ｔｗｏ　ＣＡＴＳ sleeping", ["Two cats sleeping on a couch.", "Two cats asleep.",
     "A pair of cats sleeping together."]),
]  # fmt: skip


def _tokenized(text: str) -> str:
    return " ".join(G.caption_tokens(text))


def _reference_cider(hyps: list[str], refs: list[list[str]]) -> tuple[float, np.ndarray]:
    """coco-caption's CIDEr-D on the same tokenised text (pycocoevalcap's Cider)."""
    gts = {i: [_tokenized(r) for r in rs] for i, rs in enumerate(refs)}
    res = {i: [_tokenized(h)] for i, h in enumerate(hyps)}
    score, scores = Cider().compute_score(gts, res)
    return float(score), np.asarray(scores)


def test_caption_tokens_by_hand() -> None:
    assert G.caption_tokens("A Man's dog, running!  Fast...") == [
        "a", "man", "s", "dog", "running", "fast"
    ]  # fmt: skip
    assert G.caption_tokens("Ein GROẞES Dreieck; «über» einem Kreis.") == [
        "ein", "großes", "dreieck", "über", "einem", "kreis"
    ]  # fmt: skip
    assert G.caption_tokens("Большой синий — треугольник.") == ["большой", "синий", "треугольник"]
    assert G.caption_tokens("一只猫。 Ｃａｔ") == ["一", "只", "猫", "cat"]  # NFKC: full-width
    assert G.caption_tokens("ねこ、カタカナ") == ["ね", "こ", "カ", "タ", "カ", "ナ"]
    assert G.caption_tokens(" .,!? ") == []
    for _, refs in EXAMPLES:  # idempotent: tokenised text tokenises to itself
        for r in refs:
            assert G.caption_tokens(_tokenized(r)) == G.caption_tokens(r)


def test_cider_d_matches_coco_caption() -> None:
    hyps = [h for h, _ in EXAMPLES]
    refs = [r for _, r in EXAMPLES]
    assert len(hyps) >= 20 and sum(len(r) > 1 for r in refs) >= 20
    ours = G.cider_d_items(hyps, refs)
    score, scores = _reference_cider(hyps, refs)
    np.testing.assert_allclose(ours, scores, rtol=0, atol=1e-9)
    assert G.cider_d(hyps, refs) == pytest.approx(score, abs=1e-9)
    assert ours.max() > 3.0 and (ours == 0).sum() >= 1  # the set spans good and hopeless
    # the idf is the evaluated set's own: a subset gives other scores, equal to coco-caption's
    sub = slice(3, 17)
    np.testing.assert_allclose(
        G.cider_d_items(hyps[sub], refs[sub]), _reference_cider(hyps[sub], refs[sub])[1], atol=1e-9
    )
    assert not np.allclose(G.cider_d_items(hyps[sub], refs[sub]), ours[sub])


def test_cider_d_on_raw_text_equals_tokenised() -> None:
    hyps = [h for h, _ in EXAMPLES]
    refs = [r for _, r in EXAMPLES]
    flat = G.cider_d_items(
        [_tokenized(h) for h in hyps], [[_tokenized(r) for r in rs] for rs in refs]
    )
    np.testing.assert_array_equal(G.cider_d_items(hyps, refs), flat)


def _brute_bleu(hyps: list[str], refs: list[list[str]]) -> float:
    """Corpus BLEU-4 of whitespace words: clipped n-gram precisions, closest reference
    length (shorter on ties), brevity penalty; for sets where every precision is > 0."""

    def grams(words: list[str], n: int) -> Counter:
        return Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))

    match, total = [0] * 4, [0] * 4
    c = r = 0
    for hyp, rs in zip(hyps, refs):
        h, ws = hyp.split(), [x.split() for x in rs]
        c += len(h)
        r += min((abs(len(w) - len(h)), len(w)) for w in ws)[1]
        for n in range(1, 5):
            mx: Counter = Counter()
            for w in ws:
                mx |= grams(w, n)
            match[n - 1] += sum((grams(h, n) & mx).values())
            total[n - 1] += max(len(h) - n + 1, 0)
    bp = 1.0 if c > r else math.exp(1 - r / c)
    return 100 * bp * math.exp(sum(math.log(m / t) for m, t in zip(match, total)) / 4)


RAGGED_HYPS = ["the cat sat on the mat", "a dog runs in the park", "it is raining"]
RAGGED_REFS = [
    ["the cat sat on the mat today", "a cat was sitting on the mat", "there is a cat"],
    ["a dog runs in a park", "dogs run"],
    ["it is raining very hard in the old city"],
]


def test_bleu_with_ragged_references() -> None:
    got = G.bleu(RAGGED_HYPS, RAGGED_REFS)
    assert got == pytest.approx(_brute_bleu(RAGGED_HYPS, RAGGED_REFS), rel=1e-12)
    # padding a short item by repeating its own reference changes nothing
    padded = [rs + [rs[0]] * (3 - len(rs)) for rs in RAGGED_REFS]
    assert got == pytest.approx(G.bleu(RAGGED_HYPS, padded), rel=1e-12)
    # whereas an empty string is a reference of length 0: closer to item 2's 3 words than
    # its 9, it would lift the brevity penalty (hypotheses 15 words, references 22)
    empty = [rs + [""] * (3 - len(rs)) for rs in RAGGED_REFS]
    streams = [[rs[k] for rs in empty] for k in range(3)]
    assert got != pytest.approx(sacrebleu.corpus_bleu(RAGGED_HYPS, streams).score, rel=1e-3)


def test_chrf_with_ragged_references() -> None:
    got = G.chrf(RAGGED_HYPS, RAGGED_REFS)
    padded = [rs + [rs[0]] * (3 - len(rs)) for rs in RAGGED_REFS]
    assert got == pytest.approx(G.chrf(RAGGED_HYPS, padded), rel=1e-12)
    assert 0 < got < 100 and G.chrf(["abc def"], [["abc def"]]) == pytest.approx(100)
    # one reference per item: sacrebleu's own single stream
    one = sacrebleu.corpus_chrf(RAGGED_HYPS, [[rs[0] for rs in RAGGED_REFS]]).score
    assert G.chrf(RAGGED_HYPS, [[rs[0]] for rs in RAGGED_REFS]) == pytest.approx(one)


def test_bleu_tokenizer_per_language() -> None:
    assert G.bleu_tokenizer("zh") == G.bleu_tokenizer("zh-CN") == "zh"
    assert G.bleu_tokenizer("ja") == G.bleu_tokenizer("th") == "char"
    for lang in ("en", "de", "fr", "ru", "es", "pt_BR"):
        assert G.bleu_tokenizer(lang) == "13a"
    hyps, refs = ["我喜欢吃苹果和香蕉"], [["我喜欢吃香蕉和苹果"]]
    zh = G.translation_scores(hyps, refs, "zh")
    # 13a sees one word a sentence and no match; zh splits the characters
    assert G.bleu(hyps, refs) == 0.0 and zh["bleu"] > 20
    assert zh["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs[0]], tokenize="zh").score)
    ru = G.translation_scores(["Синий квадрат слева."], [["Синий квадрат слева."]], "ru")
    assert ru == {"n": 1.0, "bleu": pytest.approx(100), "chrf": pytest.approx(100)}


def test_caption_scores_read_the_caption_tokens() -> None:
    hyps = [h for h, _ in EXAMPLES]
    refs = [r for _, r in EXAMPLES]
    scores = G.caption_scores(hyps, refs)
    assert set(scores) == {"n", "bleu4", "chrf", "cider_d"} and scores["n"] == len(EXAMPLES)
    assert scores["cider_d"] == pytest.approx(100 * _reference_cider(hyps, refs)[0], abs=1e-7)
    flat_hyps = [_tokenized(h) for h in hyps]
    flat_refs = [[_tokenized(r) for r in rs] for rs in refs]
    assert scores["bleu4"] == pytest.approx(G.bleu(flat_hyps, flat_refs, tokenize="none"))
    # case and punctuation do not count (upper case only where it is undone: ß -> SS is not)
    shouted = G.caption_scores([(h.upper() if h.isascii() else h) + " !" for h in hyps], refs)
    assert shouted == pytest.approx(scores)


def test_bad_input_names_the_item() -> None:
    with pytest.raises(ValueError, match="2 hypotheses but references for 1"):
        G.bleu(["a", "b"], [["a"]])
    with pytest.raises(ValueError, match="item 1: references must be a non-empty list"):
        G.cider_d(["a", "b"], [["a"], []])
    with pytest.raises(ValueError, match="item 0: references must be"):
        G.chrf(["a"], ["a"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="no hypotheses"):
        G.caption_scores([], [])
