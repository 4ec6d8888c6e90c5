"""The real-graph benchmark's KEPLER row (``benchmarks/real_kg.py kepler``) end to end, as a
user runs it, on a small graph with descriptions written here."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from real_kg import description_baseline

WORDS = ["dog", "cat", "wolf", "lion", "oak", "pine", "rose", "tulip", "iron", "gold",
         "salt", "sand"]  # fmt: skip
KIND = {"dog": "animal", "cat": "animal", "wolf": "animal", "lion": "animal", "oak": "tree",
        "pine": "tree", "rose": "flower", "tulip": "flower", "iron": "metal", "gold": "metal",
        "salt": "mineral", "sand": "mineral"}  # fmt: skip


def write_graph(folder) -> None:
    """Twelve entities in six kinds: ``same_kind`` both ways within a kind, ``next_to`` a
    chain; valid and test hold one fact each whose entities are in training."""
    folder.mkdir()
    ids = {w: f"n{i:03d}" for i, w in enumerate(WORDS)}
    facts = []
    for a in WORDS:
        for b in WORDS:
            if a != b and KIND[a] == KIND[b]:
                facts.append((ids[a], "same_kind", ids[b]))
    facts += [(ids[a], "next_to", ids[b]) for a, b in itertools.pairwise(WORDS)]
    test, valid = [facts.pop(0)], [facts.pop(-1)]
    for name, rows in (("train", facts), ("valid", valid), ("test", test)):
        (folder / f"{name}.txt").write_text("".join("\t".join(t) + "\n" for t in rows))
    (folder / "descriptions.txt").write_text(
        "".join(f"{ids[w]}\t{w}: a kind of {KIND[w]}, a {w} of the {KIND[w]}s\n" for w in WORDS)
    )


@pytest.mark.slow
def test_kepler_subcommand_writes_a_row_with_an_mrr(tmp_path):
    """Data, tokenizer, pre-training and link prediction through mmptm's commands: the row
    exists with an MRR in (0, 1], beside the baselines, and the text shards hold the
    descriptions without their ids."""
    graph, runs = tmp_path / "graph", tmp_path / "runs"
    write_graph(graph)
    shrink = ["model.width=32", "model.fusion.transformer.layers=1",
              "model.fusion.transformer.heads=2", "data.batch_size=8", "data.num_workers=0",
              "data.shuffle_buffer=10", "train.warmup_steps=1", "train.ckpt_every=3"]  # fmt: skip
    cmd = [sys.executable, str(ROOT / "benchmarks" / "real_kg.py"), "kepler", "--data",
           str(graph), "--runs", str(runs), "--steps", "3", "--vocab-size", "200",
           "--name", "kepler row"] + [f"--set={s}" for s in shrink]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((runs / "results.json").read_text())
    assert {"uniform", "frequency", "kepler row"} <= set(results)
    both = results["kepler row"]["test"]["both"]
    assert isinstance(both["mrr"], float) and math.isfinite(both["mrr"])
    assert 0 < both["mrr"] <= 1
    assert both["count"] == 2  # the one test fact, tail and head
    assert results["kepler row"]["test"]["no_description"] == 0
    assert "| kepler row |" in (runs / "results.md").read_text()
    texts = []
    for shard in sorted((runs / "kepler_data" / "text").glob("train-*.tar")):
        with tarfile.open(shard) as tar:
            texts += [tar.extractfile(m).read().decode() for m in tar if m.isfile()]
    joined = "\n".join(texts)
    assert "dog: a kind of animal" in joined and "n000" not in joined


def test_the_tfidf_baseline_matches_sklearn_and_a_brute_force_filtered_rank(tmp_path):
    """Cosines of sklearn's tf-idf (smooth idf, l2), ranked by hand: filtered against every
    known triple but the answer, ties counted half (the realistic rank)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    graph = tmp_path / "graph"
    write_graph(graph)
    rng = np.random.default_rng(0)
    pool = ["red", "small", "tall", "old", "wild", "soft", "cold", "dark", "loud", "fast"]
    lines = [line.split("\t")[0] for line in (graph / "descriptions.txt").read_text().splitlines()]
    text = {n: " ".join(rng.choice(pool, size=rng.integers(2, 7))) for n in lines}
    (graph / "descriptions.txt").write_text("".join(f"{n}\t{t}\n" for n, t in text.items()))
    (graph / "test.txt").write_text((graph / "train.txt").read_text())  # many queries
    got = description_baseline(graph)["tf-idf of the descriptions (no learning)"]["test"]

    names = sorted(text)
    cos = TfidfVectorizer(token_pattern=r"\w+").fit_transform([text[n] for n in names])
    cos = (cos @ cos.T).toarray()
    read = [line.split("\t") for f in ("train", "valid", "test")
            for line in (graph / f"{f}.txt").read_text().splitlines()]  # fmt: skip
    known = {tuple(t) for t in read}
    ranks = []
    for h, r, t in [line.split("\t") for line in (graph / "test.txt").read_text().splitlines()]:
        for query, answer, side in ((h, t, "tail"), (t, h, "head")):
            row = cos[names.index(query)]
            s = row[names.index(answer)]
            others = [
                e
                for e in names
                if e != answer and ((query, r, e) if side == "tail" else (e, r, query)) not in known
            ]
            higher = sum(row[names.index(e)] > s + 1e-9 for e in others)
            equal = sum(abs(row[names.index(e)] - s) <= 1e-9 for e in others)
            ranks.append(1 + higher + equal / 2)
    assert got["both"]["count"] == len(ranks)
    assert got["both"]["mrr"] == pytest.approx(np.mean(1 / np.array(ranks)), rel=1e-6)
