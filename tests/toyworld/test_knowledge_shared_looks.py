"""toyworld knowledge's ``shared_looks``: several toys to a look, so only the entity tells
them apart; read back from the files, independently of the code that wrote them."""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmptm import toyworld
from mmptm.cli import main
from mmptm.studies.knowledge import visual_cloze_queries
from tests.conftest import read_shard_samples

LANGS = ("en", "de", "fr", "ru", "es")
SMALL = {"n_train": 40, "n_val": 12, "n_test": 12, "image_size": 32, "shard_size": 25}
RELATIONS = ("made_of", "owned_by", "comes_from")
#: sha256 over (path, bytes) of every file of the default knowledge view at SMALL, as the
#: generator wrote it before shared_looks existed (commit fcf5ead): the option, off, changes
#: nothing. Update it only for a change of the default world meant as one.
DEFAULT_DIGEST = "c5c31cecc71e68803f68c0800db24c23e0f9d5010eaa486dca679a2847bab73d"


def _generate(out: Path, **kw) -> Path:
    toyworld.generate(out, **{**SMALL, **kw}, languages=LANGS, views=("knowledge",))
    return out / "knowledge"


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    return _generate(tmp_path_factory.mktemp("kw") / "tw", shared_looks=3)


def _toys(kdir: Path) -> dict[str, dict]:
    return {t["id"]: t for t in json.loads((kdir / "graph" / "toys.json").read_text())}


def _look(x: dict) -> tuple[str, str, str]:
    return (x["shape"], x["color"], x["size"])


def _samples(kdir: Path, pattern: str) -> list[tuple[str, dict[str, bytes]]]:
    return read_shard_samples(sorted(str(p) for p in kdir.glob(pattern)))


def test_default_output_unchanged(tmp_path):
    root = _generate(tmp_path / "tw", shared_looks=1)
    digest = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            digest.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    assert digest.hexdigest() == DEFAULT_DIGEST
    manifest = json.loads((tmp_path / "tw" / "manifest.json").read_text())
    assert "shared_looks" not in manifest["knowledge"]


def test_every_look_is_three_toys_with_different_facts(shared):
    toys = _toys(shared)
    by_look = defaultdict(list)
    for t in toys.values():
        by_look[_look(t)].append(t)
    assert len(toys) == 60 and len(by_look) == 20
    assert all(len(g) == 3 for g in by_look.values())
    pairs = {(shape, color) for shape, color, _ in by_look}
    assert len(pairs) == 20  # "the red circle" still names one look
    for group in by_look.values():
        assert len({t["facts_in_text"] for t in group}) == 1
        for r in RELATIONS:
            assert len({t["facts"][r] for t in group}) == 3
    manifest = json.loads((shared.parent / "manifest.json").read_text())
    assert manifest["knowledge"]["shared_looks"] == 3


def test_regions_show_their_toys_looks_and_looks_do_not_tell_the_toy(shared):
    toys = _toys(shared)
    seen = defaultdict(set)  # look -> toys a region of that look showed
    patterns = ["image_text/*.tar", *(f"kvqa/{split}-*.tar" for split in ("train", "val", "test"))]
    for _, s in (x for pattern in patterns for x in _samples(shared, pattern)):
        meta = json.loads(s["json"])
        npz = np.load(io.BytesIO(s["regions.npz"]))
        pixels = np.asarray(Image.open(io.BytesIO(s["jpg"])).convert("RGB"), dtype=float)
        for k, entity in enumerate(meta["region_entities"]):
            toy = toys[entity]
            assert toyworld.SHAPES[int(npz["labels"][k])] == toy["shape"]
            if "objects" in meta:
                assert _look(meta["objects"][k]) == _look(toy)
            x1, y1, x2, y2 = npz["boxes"][k]
            cx, cy = int((x1 + x2) / 2 * 32), int((y1 + y2) / 2 * 32)
            rgb = pixels[cy, cx]  # a shape's centre is inside it: its colour
            assert np.abs(rgb - toyworld.COLORS[toy["color"]]).max() < 60
            seen[_look(toy)].add(entity)
    assert max(len(v) for v in seen.values()) >= 2
    assert sum(len(v) >= 2 for v in seen.values()) >= 10


def test_look_mates_share_a_split_so_kvqa_tests_unseen_looks(shared):
    """A held-out toy's look is held out with it: the toys of a look share a downstream split,
    and no look a test question asks about is asked about in training."""
    toys = _toys(shared)
    by_look = defaultdict(set)
    for t in toys.values():
        by_look[_look(t)].add(t["split"])
    assert all(len(splits) == 1 for splits in by_look.values())
    for in_text in (True, False):  # 60 / 20 / 20 % of each group's 10 looks
        counts = defaultdict(int)
        for t in toys.values():
            if t["facts_in_text"] == in_text:
                counts[t["split"]] += 1
        assert dict(counts) == {"train": 18, "dev": 6, "test": 6}
    asked = {}
    for split in ("train", "test"):
        asked[split] = set()
        for _, s in _samples(shared, f"kvqa/{split}-*.tar"):
            meta = json.loads(s["json"])
            asked[split].add(_look(toys[meta["entity"]]))
    assert asked["train"] and asked["test"]
    assert not asked["train"] & asked["test"]


def test_caption_fact_is_the_regions_toys(shared):
    toys = _toys(shared)
    values = json.loads((shared / "graph" / "values.json").read_text())
    name_of = {v["id"]: v["names"]["en"] for v in values}
    checked = 0
    for _, s in _samples(shared, "image_text/*.tar"):
        meta = json.loads(s["json"])
        fact = meta["caption_fact"]
        if fact is None:
            continue
        toy = toys[meta["region_entities"][fact["region"]]]
        m = re.match(r"The (\w+) (\w+) .*? (\w+)\. ", meta["captions"]["en"])
        assert m is not None
        assert m.group(1, 2) == (toy["color"], toy["shape"])
        assert m.group(3) == name_of[toy["facts"][fact["relation"]]]
        assert toy["facts_in_text"]
        checked += 1
    assert checked > 20


def test_visual_cloze_names_the_shared_looks(shared):
    toys = _toys(shared)
    queries = visual_cloze_queries(shared.parent, seed=0, scenes=5)
    assert queries
    for q in queries:
        toy = toys[q["entity"]]
        sample = q["samples"][q["gold"]]
        assert sample["txt"].startswith(f"The {toy['color']} {toy['shape']} ")
        assert q["facts"] == ("text" if toy["facts_in_text"] else "graph")


@pytest.mark.parametrize("k", [0, 4, 7])
def test_bad_shared_looks_named(tmp_path, k):
    with pytest.raises(ValueError, match="shared_looks"):
        _generate(tmp_path / "tw", shared_looks=k)


def test_data_toyworld_flag(tmp_path, capsys):
    sizes = ["--n-train", "4", "--n-val", "2", "--n-test", "2"]
    argv = ["data", "toyworld", "--out", str(tmp_path / "tw"), *sizes, "--views", "knowledge",
            "--shared-looks", "2", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    manifest = json.loads((tmp_path / "tw" / "manifest.json").read_text())
    assert manifest["knowledge"]["shared_looks"] == 2
    toys = _toys(tmp_path / "tw" / "knowledge").values()
    assert len({_look(t) for t in toys}) == 30
    assert main([*argv[:-3], "--shared-looks", "4", "--no-progress"]) != 0
    assert "shared_looks must be one of" in capsys.readouterr().err


def test_later_views_keep_the_sections_they_did_not_write(tmp_path):
    """A later run writing other views into the same data set keeps the earlier knowledge
    view's shared_looks and the earlier speech view's voice; rewriting a kind replaces them."""
    out = tmp_path / "tw"
    small = {**SMALL, "languages": ("en",)}
    toyworld.generate(out, **small, views=("knowledge",), shared_looks=3)
    toyworld.generate(out, **small, views=("speech",), voice="builtin")

    def manifest() -> dict:
        return json.loads((out / "manifest.json").read_text())

    both = manifest()
    assert set(both["shards"]) == {"speech", "knowledge"}
    assert both["knowledge"]["shared_looks"] == 3
    assert both["audio"]["voice"] == "builtin"
    toyworld.generate(out, **small, views=("image_text",))  # neither kind: both kept
    third = manifest()
    assert set(third["shards"]) == {"image_text", "speech", "knowledge"}
    assert third["knowledge"] == both["knowledge"] and third["audio"] == both["audio"]
    toyworld.generate(out, **small, views=("knowledge",))  # rewritten at the default: gone
    assert "shared_looks" not in manifest()["knowledge"]
    assert manifest()["audio"]["voice"] == "builtin"
