"""BUCC mining: margin scores, LASER's max retrieval and XTREME's threshold / F1 against
brute-force loops written from the papers' definitions; the CLI on toyworld's analogue."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_overrides

from mmptm.eval.bucc import BuccSet, best_threshold, candidates, margin_scores, mine, prf


def _vectors(n, e, seed):
    return F.normalize(torch.randn(n, e, generator=torch.Generator().manual_seed(seed)), dim=-1)


def _brute_margin(x, y, k):
    """score(i, j) for every pair: cos / mean of the two k-nearest-neighbour mean cosines."""
    cos = [[float(x[i] @ y[j]) for j in range(len(y))] for i in range(len(x))]
    kx = [sum(sorted(row, reverse=True)[:k]) / min(k, len(y)) for row in cos]
    ky = [sum(sorted((cos[i][j] for i in range(len(x))), reverse=True)[:k]) / min(k, len(x))
          for j in range(len(y))]  # fmt: skip
    return {(i, j): cos[i][j] / ((kx[i] + ky[j]) / 2) for i in range(len(x)) for j in range(len(y))}


def _brute_mine(x, y, k):
    """LASER's max retrieval, by loops: each side's best margin among its k nearest cosines."""
    score = _brute_margin(x, y, k)
    cos = {p: float(x[p[0]] @ y[p[1]]) for p in score}
    props = []
    for i in range(len(x)):
        near = sorted(range(len(y)), key=lambda j: -cos[i, j])[:k]
        j = max(near, key=lambda j: score[i, j])
        props.append((score[i, j], i, j))
    for j in range(len(y)):
        near = sorted(range(len(x)), key=lambda i: -cos[i, j])[:k]
        i = max(near, key=lambda i: score[i, j])
        props.append((score[i, j], i, j))
    used_i, used_j, out = set(), set(), {}
    for s, i, j in sorted(props, key=lambda p: -p[0]):
        if i not in used_i and j not in used_j:
            used_i.add(i)
            used_j.add(j)
            if s > 0:
                out[i, j] = s
    return out


@pytest.mark.parametrize(("n", "m", "k"), [(7, 5, 4), (3, 9, 4), (6, 6, 2), (2, 3, 4)])
def test_margin_scores_and_mining_match_brute_force(n, m, k):
    x, y = _vectors(n, 6, n), _vectors(m, 6, 100 + m)
    want = _brute_margin(x, y, k)
    fwd, fwd_ind, bwd, bwd_ind = margin_scores(x, y, k)
    for i, j in itertools.product(range(n), range(min(k, m))):
        assert float(fwd[i, j]) == pytest.approx(want[i, int(fwd_ind[i, j])], rel=1e-5)
    for j, i in itertools.product(range(m), range(min(k, n))):
        assert float(bwd[j, i]) == pytest.approx(want[int(bwd_ind[j, i]), j], rel=1e-5)
    for block in (0, 1, 2):  # a few rows of cosines at a time: the same neighbours
        got = {(i, j): s for i, j, s in mine(x, y, k, block)}
        assert got.keys() == _brute_mine(x, y, k).keys()
        for p, s in _brute_mine(x, y, k).items():
            assert got[p] == pytest.approx(s, rel=1e-5)


def _brute_f1(cands, gold, threshold):
    chosen = {p for p, s in cands.items() if s >= threshold}
    right = len(chosen & gold)
    return 0.0 if right == 0 else 2 * right / (len(chosen) + len(gold))  # 2PR/(P+R)


def test_threshold_maximises_f1_as_a_sweep_over_every_cut():
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        pairs = [(f"s{i}", f"t{i}") for i in range(12)]
        scores = torch.rand(12, generator=g).tolist()
        cands = dict(zip(pairs, scores))
        gold = {p for p in pairs if torch.rand(1, generator=g).item() < 0.5} | {("s99", "t99")}
        th = best_threshold(cands, gold)
        best = max(_brute_f1(cands, gold, t) for t in [*scores, 2.0])
        assert _brute_f1(cands, gold, th) == pytest.approx(best)
        assert prf(cands, gold, th)["f1"] == pytest.approx(best)
        # XTREME's threshold lies midway between the last score kept and the next one
        kept = sorted((s for s in scores if s >= th), reverse=True)
        below = [s for s in scores if s < th]
        if below and kept:
            assert th == pytest.approx((kept[-1] + max(below)) / 2)


def test_prf_by_hand():
    cands = {("a", "x"): 0.9, ("b", "y"): 0.8, ("c", "z"): 0.3}
    gold = {("a", "x"), ("c", "z"), ("d", "w")}
    # at 0.5: {a-x, b-y}: 1 right, p 1/2, r 1/3, f1 0.4
    assert prf(cands, gold, 0.5) == pytest.approx({"p": 0.5, "r": 1 / 3, "f1": 0.4})
    assert prf(cands, gold, 0.95) == {"p": 0.0, "r": 0.0, "f1": 0.0}
    # best: all three (2 right, p 2/3, r 2/3) beats the first alone (p 1, r 1/3: 0.5)
    assert best_threshold(cands, gold) == pytest.approx(0.3)


def test_candidates_stand_for_every_id_of_a_sentence():
    vecs = {"A": [1.0, 0.0], "B": [0.0, 1.0], "a": [0.9, 0.1], "b": [0.1, 0.9]}

    def encode(texts, lang, side):
        return F.normalize(torch.tensor([vecs[t] for t in texts]), dim=-1)

    s = BuccSet(("de", "en"), source={"d1": "a", "d2": "b", "d3": "a"},
                target={"e1": "A", "e2": "B"})  # fmt: skip
    got = candidates(encode, s, k=2)
    assert set(got) == {("d1", "e1"), ("d3", "e1"), ("d2", "e2")}
    assert got["d1", "e1"] == got["d3", "e1"]


def test_eval_bucc_and_tatoeba_on_toyworlds_analogue(tiny_world, tmp_path, capsys):
    from mmptm.cli import main
    from mmptm.eval.bucc import read_bucc
    from mmptm.eval.xlingual import SentenceEncoder, SentenceVector, read_pairs
    from mmptm.models.load import load_pretrained
    from mmptm.recipe import load_run_config
    from mmptm.toyworld.retrieval import write_retrieval
    from mmptm.train.trainer import pretrain

    run = tmp_path / "run"
    pretrain(load_run_config("xlm_tlm_tiny", [*tiny_overrides(tiny_world, run, "xlm_tlm_tiny"),
                                              "train.max_steps=2"]))  # fmt: skip
    data = tmp_path / "ret"
    write_retrieval(data, languages=("de", "ru"), n_tatoeba=20, n_bucc=24, parallel=0.25)
    dev, test = (f"{data}/bucc/shards/{s}-*.tar" for s in ("sample", "training"))
    capsys.readouterr()
    assert main(["eval", "bucc", str(run), "--dev", dev, "--test", test, "--layer", "1"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sorted(result["sets"]) == ["de", "ru"] and result["vector"] == "mean, layer 1 of 2"
    # the same F1 from brute-force mining of the encoder's vectors
    model, tok, cfg = load_pretrained(str(run))
    encode = SentenceEncoder(model, cfg, tok, SentenceVector("mean", 1))
    for lang, r in result["sets"].items():
        mined = {}
        for name, spec in (("dev", dev), ("test", test)):
            s = read_bucc(spec)[lang]
            src, tgt = sorted(set(s.source.values())), sorted(set(s.target.values()))
            pairs = _brute_mine(encode(src, lang, "other"), encode(tgt, "en", "pivot"), 4)
            mined[name] = ({(a, b): sc for (i, j), sc in pairs.items()
                            for a, t in s.source.items() if t == src[i]
                            for b, u in s.target.items() if u == tgt[j]}, s.gold)  # fmt: skip
        dev_c, dev_gold = mined["dev"]
        best = max(_brute_f1(dev_c, dev_gold, t) for t in dev_c.values())
        assert r["dev_f1"] == pytest.approx(best)
        assert r["f1"] == pytest.approx(_brute_f1(*mined["test"], r["threshold"]))
    # Tatoeba: xret one way over every pair
    shards = f"{data}/tatoeba/shards/test-*.tar"
    assert main(["eval", "xret", str(run), "--shards", shards, "--pooling", "mean",
                 "--direction", "to-pivot", "--max-items", "0"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "each language → en" in out
    acc = json.loads(out.strip().splitlines()[-1])["mean, layer 2 of 2"]
    pairs = read_pairs(shards, "en", 0)
    assert {len(p) for p in pairs.values()} == {20}
    encode = SentenceEncoder(model, cfg, tok, SentenceVector("mean"))
    for lang, pp in pairs.items():
        sims = encode([p[1] for p in pp], lang) @ encode([p[0] for p in pp], "en").T
        hits = sum(int(row.argmax()) == i for i, row in enumerate(sims))
        assert acc[lang] == pytest.approx(hits / len(pp))


def test_one_way_tatoeba_accuracy_by_hand():
    from mmptm.eval.xlingual import retrieval_accuracy

    x = torch.tensor([[1.0, 0.0], [0.9, 0.1]])
    en = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    # x → en: x0 finds en0 (1 > 0), x1 finds en0 (.9 > .1): 1/2 (XTREME's Tatoeba)
    # en → x: en0 finds x0 (1 > .9), en1 finds x1 (.1 > 0): 2/2
    assert retrieval_accuracy(x, en, "to-pivot") == pytest.approx(0.5)
    assert retrieval_accuracy(x, en, "from-pivot") == pytest.approx(1.0)
    assert retrieval_accuracy(x, en) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="unknown direction 'up'"):
        retrieval_accuracy(x, en, "up")


def test_other_shards_are_one_line(tmp_path):
    from mmptm.data.shards import ShardWriter
    from mmptm.eval.bucc import read_bucc

    with ShardWriter(tmp_path / "p-%06d.tar", 10) as w:
        w.write({"__key__": "a", "json": {"languages": ["de", "en"], "texts": ["x", "y"]}})
    with pytest.raises(ValueError, match="sample 'a' is not BUCC's .*mmptm data bucc"):
        read_bucc(str(tmp_path / "p-*.tar"))
