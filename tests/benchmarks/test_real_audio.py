"""The real-audio benchmark's data side (Hydrogen kits → labelled clips → author-grouped folds
→ ESC-50 layout → shards) and its scoring, on a few kits written here."""

from __future__ import annotations

import csv
import json
import sys
import tarfile
from xml.sax.saxutils import escape

import numpy as np
import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import real_audio_data as rad
from real_audio import scores

from mmptm.converters.audio import convert_esc50

NS = "http://www.hydrogen-music.org/drumkit"


def write_kit(root, name, author, instruments, *, rate=22050, seed=0):
    """A kit folder: drumkit.xml (namespaced, layers in instrumentComponent as Hydrogen 1.x
    writes) and one short noise burst per named file (files starting 'absent' are not
    written)."""
    import soundfile as sf

    folder = root / name
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    parts = []
    for inst, files in instruments:
        layers = "".join(f"<layer><filename>{f}</filename></layer>" for f in files)
        component = f"<instrumentComponent>{layers}</instrumentComponent>"
        parts.append(f"<instrument><id>0</id><name>{inst}</name>{component}</instrument>")
        for f in files:
            if not f.startswith("absent"):
                burst = rng.standard_normal(rate // 10).astype(np.float32) * 0.1
                sf.write(folder / f, burst, rate, subtype="PCM_16")
    xml = (f'<?xml version="1.0"?><drumkit_info xmlns="{NS}"><name>{name}</name>'
           f"<author>{escape(author)}</author><license>GPL</license>"
           f"<instrumentList>{''.join(parts)}</instrumentList></drumkit_info>")  # fmt: skip
    (folder / "drumkit.xml").write_text(xml)
    return folder


@pytest.mark.parametrize(
    "name, cls",
    [
        ("Kick Lite 1", "kick"),
        ("c3 - bass drum 1", "kick"),
        ("BassDrum", "kick"),
        ("Snare Rimshot (Pearl Free Floating Maple 14x3.5)", "snare"),
        ("Sabian Hat Semi-Open", "hihat"),  # a maker of cymbals, but a hi-hat first
        ("Closed HH", "hihat"),
        ("tomhi2", "tom"),
        ("Floor Tom", "tom"),
        ("Hand Clap", "clap"),
        ("ride-crash20inch", "cymbal"),
        ("Paiste Bell", "cymbal"),
        ("Cowbell", None),
        ("Djembe1 Slap", None),
        ("Pearl Side Stick", None),
        ("Sample: beats_01-10.flac", None),
    ],
)
def test_instrument_class(name, cls):
    assert rad.instrument_class(name) == cls


def test_author_key_folds_spellings():
    keys = {rad.author_key(a) for a in ("emillo.net", "Emillo <emillo@emillo.net>", "emillo")}
    assert keys == {"emillo"}
    assert rad.author_key("Glen MacArthur / Sebastian Moors") == "glen"
    assert rad.author_key("") == "(unknown)"


def make_kits(root):
    write_kit(root, "A1", "Ann <ann@x>", [("Kick", ["k1.wav", "k2.wav"]), ("Snare", ["s.wav"]),
                                          ("Cowbell", ["c.wav"])], seed=1)  # fmt: skip
    write_kit(root, "A2", "ann.net", [("Tom Hi", ["t.wav"]), ("Open HH", ["h.wav"])], seed=2)
    write_kit(root, "B", "Bob", [("Crash", ["x.wav"]), ("Kick", ["absent.wav"])], seed=3)
    c = write_kit(root, "C", "Cy", [("Clap", ["cl.wav"]), ("Snare", ["s2.wav"])], seed=4)
    # C's snare is A1's snare, byte for byte: kept once
    (c / "s2.wav").write_bytes((root / "A1" / "s.wav").read_bytes())


def test_read_dedupe_and_folds(tmp_path):
    make_kits(tmp_path)
    kits = rad.read_kits(tmp_path)
    assert [k.name for k in kits] == ["A1", "A2", "B", "C"]
    a1 = kits[0]
    assert [(s.path.name, s.label) for s in a1.samples] == [
        ("k1.wav", "kick"), ("k2.wav", "kick"), ("s.wav", "snare")]  # fmt: skip
    assert a1.dropped == {"instrument of no class": 1}
    assert kits[2].dropped == {"missing file": 1}
    assert rad.dedupe(kits) == {"duplicate bytes": 1}
    assert [s.path.name for s in kits[3].samples] == ["cl.wav"]
    folds = rad.assign_folds(kits, 2)
    # groups: ann (A1 3 + A2 2 = 5 clips), bob 1, cy 1 → ann alone in fold 1, the rest in 2
    assert folds == {"A1": 1, "A2": 1, "B": 2, "C": 2}
    with pytest.raises(ValueError, match="3 kit authors cannot fill 4 folds"):
        rad.assign_folds(kits, 4)


def test_esc50_layout_through_the_converter(tmp_path):
    make_kits(tmp_path / "kits")
    kits = rad.read_kits(tmp_path / "kits")
    rad.dedupe(kits)
    folds = rad.assign_folds(kits, 2)
    per_fold = rad.write_esc50(kits, folds, tmp_path / "esc50")
    assert per_fold == {1: 5, 2: 2}
    with open(tmp_path / "esc50/meta/esc50.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows[0] == {"filename": "A1__k1.wav", "fold": "1", "target": "0", "category": "kick",
                       "src_file": "A1", "take": "Kick"}  # fmt: skip
    present = {r["category"] for r in rows}
    assert present == {"kick", "snare", "tom", "hihat", "cymbal", "clap"}
    result = convert_esc50(tmp_path / "esc50", tmp_path / "shards", sample_rate=16000)
    assert result["written"] == 7 and not result["skipped"]
    labels = (tmp_path / "shards/labels.txt").read_text().split()
    assert labels == list(rad.CLASSES)
    with tarfile.open(tmp_path / "shards/fold2/fold2-000000.tar") as tar:
        metas = [json.load(tar.extractfile(m)) for m in tar.getmembers() if m.name.endswith("json")]
    assert {(m["category"], m["src_file"], m["sample_rate"]) for m in metas} == {
        ("cymbal", "B", 16000), ("clap", "C", 16000)}  # fmt: skip


def test_scores_macro_f1_by_hand():
    gold = np.array([0, 0, 1, 1, 2])
    pred = np.array([0, 1, 1, 1, 0])
    # class 0: P 1/2 R 1/2 F 1/2; class 1: P 2/3 R 1 F 4/5; class 2: F 0 → mean 13/30
    r = scores(gold, pred)
    assert r["acc"] == pytest.approx(3 / 5)
    assert r["macro_f1"] == pytest.approx(13 / 30)


def test_the_debian_kits_when_unpacked():
    root = ROOT / "data/real_audio/work/unpacked/hydrogen-drumkits" / rad.KITS_DIR
    if not root.is_dir():
        pytest.skip("hydrogen-drumkits is not unpacked here (benchmarks/real_audio.py prepare)")
    kits = rad.read_kits(root)
    assert len(kits) == 14
    assert all(k.samples or k.name == "circAfrique v4" for k in kits)  # djembes: no class
    assert {s.label for k in kits for s in k.samples} == set(rad.CLASSES)
