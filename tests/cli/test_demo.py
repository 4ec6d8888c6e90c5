"""``mmptm demo``: the toyworld studies end to end at toy sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmptm.cli import main
from mmptm.search.index import SearchIndex
from mmptm.studies import DEMO_QUERIES


@pytest.mark.slow
def test_demo_video_runs_every_recipe_and_video_qa(tmp_path, capsys):
    """`mmptm demo video` end to end at toy sizes: data, codebook, three pre-trainings (and
    the bag of frames), retrieval per language, the reversal test, video QA both ways."""
    out = tmp_path / "demo"
    argv = ["demo", "video", "--out", str(out), "--n-train", "32", "--n-test", "16",
            "--steps", "3", "--qa-steps", "2",
            "--recipes", "videoclip_tiny,video_clip_tiny,videobert_tiny,cbt_tiny",
            "--set", "data.batch_size=8", "--set", "data.num_workers=0"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    runs = {"videoclip_tiny", "bag of frames", "video_clip_tiny", "videobert_tiny", "cbt_tiny"}
    assert set(result["retrieval"]) == set(result["reversal"]) == runs
    assert set(result["languages"]) == {"en", "de", "fr", "ru", "es"}
    assert all(0 <= r["reversal_acc"] <= 1 and r["n"] == 16 for r in result["reversal"].values())
    assert set(result["video_qa"]) == {
        f"{run} {how}" for run in ("videoclip_tiny", "video_clip_tiny", "cbt_tiny")
        for how in ("pre-trained", "from scratch")
    }  # fmt: skip
    printed = capsys.readouterr().out
    assert "reversal test" in printed and "text↔video retrieval" in printed
    assert _drawn(out / "curves.png") and _drawn(out / "curves_qa.png")


@pytest.mark.slow
def test_demo_audio_runs_every_recipe(tmp_path, capsys):
    """`mmptm demo audio` end to end at toy sizes: scene sounds and spoken captions, the MFCC
    codebook, five pre-trainings, retrieval (text↔audio per language, sound↔image, spoken
    caption↔image both ways), linear probes against their random-init baselines."""
    out = tmp_path / "demo"
    argv = ["demo", "audio", "--out", str(out), "--n-train", "32", "--n-test", "16",
            "--steps", "2", "--ft-steps", "2",
            "--recipes", "clap_tiny,audio_image_tiny,wav2vec2_tiny,hubert_tiny,speechbert_tiny",
            "--set", "data.batch_size=8", "--set", "data.num_workers=0"]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    assert set(result["retrieval"]) == {
        "text↔audio (CLAP)", "image↔sound",
        "spoken caption↔image, pre-trained", "spoken caption↔image, from scratch",
    }  # fmt: skip
    assert set(result["languages"]) == {"en", "de", "fr", "ru"}
    assert set(result["probe"]) == {
        f"{r} {how}" for r in ("clap_tiny", "wav2vec2_tiny", "hubert_tiny")
        for how in ("pre-trained", "random init")
    }  # fmt: skip
    for r in result["probe"].values():
        assert 0 <= r["acc"] <= 1 and r["n_test"] == 16
    printed = capsys.readouterr().out
    assert "linear probe" in printed and "text↔audio" in printed
    assert _drawn(out / "curves.png") and _drawn(out / "curves_speech_image.png")


def _drawn(png) -> bool:
    """A figure with coloured lines on it (axes and text are black and grey)."""
    import numpy as np
    from PIL import Image

    rgb = np.asarray(Image.open(png).convert("RGB")).astype(int)
    return int((rgb.max(-1) - rgb.min(-1) > 60).sum()) > 200


def test_demo_clip_writes_results_and_curves(tmp_path, capsys):
    """`mmptm demo` (the README's `make demo`) at toy sizes: retrieval table, curves."""
    out = tmp_path / "demo"
    argv = ["demo", "--out", str(out), "--n-train", "32", "--n-test", "16", "--steps", "4",
            "--set", "data.batch_size=8", "--set", "data.num_workers=0",
            "--set", "train.log_every=2"]  # fmt: skip
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["retrieval"]["n"] == 16
    by_lang = results["retrieval_by_language"]
    assert set(by_lang) == {"en", "de", "fr", "ru"} and by_lang["en"] == results["retrieval"]
    # each language's captions are their own test: the table differs from English somewhere
    assert any(r != by_lang["en"] for r in by_lang.values())
    rows = [json.loads(line) for line in (out / "clip_tiny" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [2, 4]
    assert _drawn(out / "curves.png")
    printed = capsys.readouterr().out
    assert f"training curves: {out / 'curves.png'}" in printed
    # the test images are indexed by the demo's run and searched in three languages
    index = SearchIndex.open(out / "index")
    assert index.meta["counts"]["items"] == 16
    assert Path(index.meta["checkpoint"]).parent.parent == (out / "clip_tiny").resolve()
    assert {lang for _, lang in DEMO_QUERIES} >= {"en", "ru"}
    for query, lang in DEMO_QUERIES:
        assert f"{query!r} → images (their {lang} captions)" in printed
        hits = index.search_text(query, k=3, lang=lang)
        block = printed.split(f"{query!r} → images")[1].split("\n\n")[0]
        assert [line.split()[2] for line in block.splitlines()[2:5]] == [h.key for h in hits]
        assert all(h.language == lang and h.caption in block for h in hits)
    assert f"mmptm serve {out / 'index'}" in printed
    # precision@3 of the attribute queries, per language, printed and in results.json
    precision = results["attribute_precision"]
    assert set(precision) == {"en", "de", "fr", "ru"}
    assert all(p["queries"] + p["skipped"] == 60 for p in precision.values())
    assert "attribute queries (size × colour × shape, 60 per language)" in printed
