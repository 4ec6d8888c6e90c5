"""toyworld: determinism, shards, boxes against pixels, relations, captions, text and VL views."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

from mmptm import toyworld as tw
from mmptm.converters.text import XNLI_COLUMNS, convert_xnli
from mmptm.converters.vl import convert_vqa, load_regions, write_butd_tsv

SMALL = {"n_train": 40, "n_val": 12, "n_test": 8, "image_size": 64, "shard_size": 16}
LANGS = ("en", "de", "fr", "ru", "es")


def _hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _read(root: Path, paths: list[str]) -> list[dict]:
    return list(wds.WebDataset([str(root / p) for p in paths], shardshuffle=False))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("toyworld")
    return root, tw.generate(root, seed=3, languages=LANGS, **SMALL)


@pytest.fixture(scope="module")
def image_text(world: tuple[Path, dict]) -> list[dict]:
    root, manifest = world
    paths = [p for split in tw.SPLITS for p in manifest["shards"]["image_text"][split]]
    return _read(root, paths)


def test_same_seed_gives_identical_bytes(world: tuple[Path, dict], tmp_path: Path) -> None:
    root, _ = world
    tw.generate(tmp_path, seed=3, languages=LANGS, **SMALL)
    first, again = _hashes(root), _hashes(tmp_path)
    assert len(first) > 10 and first == again


def test_different_seed_gives_different_data(world: tuple[Path, dict], tmp_path: Path) -> None:
    root, manifest = world
    tw.generate(tmp_path, seed=4, languages=LANGS, **SMALL)
    first, other = _hashes(root), _hashes(tmp_path)
    for path in manifest["shards"]["image_text"]["train"]:
        assert first[path] != other[path]
    assert first["text/en.txt"] != other["text/en.txt"]


def test_val_and_test_do_not_depend_on_n_train(world: tuple[Path, dict], tmp_path: Path) -> None:
    root, manifest = world
    tw.generate(tmp_path, seed=3, languages=LANGS, **{**SMALL, "n_train": 23})
    first, other = _hashes(root), _hashes(tmp_path)
    for view in tw.VIEWS:
        for split in ("val", "test"):
            for path in manifest["shards"][view][split]:
                assert first[path] == other[path]
    assert first["image_text/train-000001.tar"] != other["image_text/train-000001.tar"]


def test_splits_draw_different_scenes() -> None:
    for i in range(20):
        scenes = [tw.sample_scene(0, split, i) for split in tw.SPLITS]
        assert len({s.objects for s in scenes}) == 3
        assert [s.key for s in scenes] == [f"train{i:06d}", f"val{i:06d}", f"test{i:06d}"]


def test_samples_are_img2dataset_style(world: tuple[Path, dict], image_text: list[dict]) -> None:
    assert len(image_text) == SMALL["n_train"] + SMALL["n_val"] + SMALL["n_test"]
    keys = [s["__key__"] for s in image_text]
    assert len(set(keys)) == len(keys) and not any("." in k for k in keys)
    for s in image_text:
        assert {"jpg", "txt", "json"} <= set(s)
        img = Image.open(io.BytesIO(s["jpg"]))
        assert img.format == "JPEG" and img.mode == "RGB" and img.size == (64, 64)
        meta = json.loads(s["json"])
        assert meta["key"] == s["__key__"] and meta["key"].startswith(meta["split"])
        assert (meta["width"], meta["height"]) == (64, 64)
        assert s["txt"].decode("utf-8") == meta["captions"]["en"]
        assert set(meta["captions"]) == set(LANGS)
        assert 1 <= len(meta["objects"]) <= 4
        scene = tw.sample_scene(3, meta["split"], int(meta["key"][len(meta["split"]) :]))
        assert {k: meta[k] for k in ("object_captions", "pair_captions", "list_captions")} == (
            tw.granular_captions(scene, LANGS)
        )


def _nearest_color(rgb: np.ndarray) -> str:
    palette = {**tw.COLORS, "background": tw.BACKGROUND}
    return min(palette, key=lambda c: float(np.sum((rgb - np.array(palette[c])) ** 2)))


def test_boxes_agree_with_pixels(image_text: list[dict]) -> None:
    """Independent check: the colour at and just outside each box comes from the image."""
    checked = 0
    for s in image_text:
        pixels = np.asarray(Image.open(io.BytesIO(s["jpg"])).convert("RGB"), dtype=np.float64)
        size = pixels.shape[0]
        for obj in json.loads(s["json"])["objects"]:
            x1, y1, x2, y2 = obj["box"]
            assert 0 <= x1 < x2 <= 1 and 0 <= y1 < y2 <= 1
            assert obj["label"] == tw.SHAPES.index(obj["shape"])
            assert obj["color_label"] == list(tw.COLORS).index(obj["color"])
            cx, cy = (x1 + x2) / 2 * size, (y1 + y2) / 2 * size
            assert _nearest_color(pixels[int(cy), int(cx)]) == obj["color"], (s["__key__"], obj)
            # 2 px beyond each side, along the centre lines: background if the box is not
            # cut too tight (shapes keep a wider gap than that to each other)
            outside = [
                (cx, y1 * size - 2),
                (cx, y2 * size + 2),
                (x1 * size - 2, cy),
                (x2 * size + 2, cy),
            ]
            for px, py in outside:
                if 0 <= px < size and 0 <= py < size:
                    assert _nearest_color(pixels[int(py), int(px)]) == "background"
            if obj["shape"] in ("circle", "square"):  # these reach their box edge on axes
                for px, py in [(x1 * size + 1.5, cy), (x2 * size - 1.5, cy)]:
                    assert _nearest_color(pixels[int(py), int(px)]) == obj["color"]
            checked += 1
    assert checked > 100


def test_box_size_follows_size_attribute(image_text: list[dict]) -> None:
    for s in image_text:
        for obj in json.loads(s["json"])["objects"]:
            width = obj["box"][2] - obj["box"][0]
            assert (width > 0.17) == (obj["size"] == "large"), obj  # small <= 0.14 < 0.19 <= large


def test_relations_agree_with_geometry(image_text: list[dict]) -> None:
    seen = set()
    for s in image_text:
        meta = json.loads(s["json"])
        centres = [
            ((b[0] + b[2]) / 2, (b[1] + b[3]) / 2) for b in (o["box"] for o in meta["objects"])
        ]
        assert [c[0] for c in centres] == sorted(c[0] for c in centres)  # left to right
        assert len(meta["relations"]) == len(centres) - 1
        for i, rel in enumerate(meta["relations"]):
            assert (rel["subject"], rel["object"]) == (i, i + 1)
            (ax, ay), (bx, by) = centres[i], centres[i + 1]
            dx, dy = bx - ax, by - ay
            horizontal = abs(dx) > 1.2 * abs(dy)
            vertical = abs(dy) > 1.2 * abs(dx)
            expected = {
                "left_of": horizontal and dx > 0,
                "right_of": horizontal and dx < 0,
                "above": vertical and dy > 0,
                "below": vertical and dy < 0,
            }
            assert expected[rel["relation"]], (s["__key__"], rel, centres)
            seen.add(rel["relation"])
    assert {"left_of", "above", "below"} <= seen


def _tokens(text: str) -> list[str]:
    return re.findall(r"[\w'-]+", text.lower())


def _reverse(lang: str, table: str) -> dict[str, str]:
    """Surface form -> attribute, asserting no form names two attributes."""
    out: dict[str, str] = {}
    for name, entry in tw.LEXICON[lang][table].items():
        entry = entry[1] if table == "nouns" else entry
        for form in [entry] if isinstance(entry, str) else entry.values():
            assert out.setdefault(form.lower(), name) == name, (lang, form)
    return out


def _scenes(n: int, seed: int = 0) -> list[tw.Scene]:
    return [tw.sample_scene(seed, "train", i) for i in range(n)]


@pytest.mark.parametrize("lang", LANGS)
def test_captions_name_every_object_in_order(lang: str) -> None:
    colors, shapes, sizes = (_reverse(lang, t) for t in ("colors", "nouns", "sizes"))
    assert set(colors).isdisjoint(shapes) and set(colors).isdisjoint(sizes)
    assert tw.lexicon_forms(lang, "colors") == set(colors)
    noun_first = lang in ("fr", "es")
    for scene in _scenes(300):
        tokens = _tokens(tw.describe(scene, lang))
        said = [colors[t] for t in tokens if t in colors]
        assert said == [o.color for o in scene.objects], (lang, tokens)
        assert [shapes[t] for t in tokens if t in shapes] == [o.shape for o in scene.objects]
        assert [sizes[t] for t in tokens if t in sizes] == [o.size for o in scene.objects]
        for i, t in enumerate(tokens):
            if t in colors:  # word order: "cercle rouge" but "roter Kreis"
                neighbour = tokens[i - 1] if noun_first else tokens[i + 1]
                assert neighbour in shapes, (lang, tokens)


def test_golden_captions() -> None:
    """Hand-written translations: agreement, cases, elision and word order per language."""
    objs = (
        tw.Obj("circle", "red", "large", 0.15, 0.5, 0.14),
        tw.Obj("star", "blue", "small", 0.45, 0.3, 0.07),
        tw.Obj("diamond", "purple", "small", 0.5, 0.7, 0.07),
        tw.Obj("square", "green", "large", 0.85, 0.75, 0.14),
    )
    chain = tw.Scene("train000000", "train", 0, 0, objs)
    assert tw.captions(chain, LANGS) == {
        "en": "A large red circle is to the left of a small blue star, which is above a small "
        "purple diamond, which is to the left of a large green square.",
        "de": "Ein großer roter Kreis ist links von einem kleinen blauen Stern, der über einer "
        "kleinen violetten Raute ist, die links von einem großen grünen Quadrat ist.",
        "fr": "Un grand cercle rouge est à gauche d'une petite étoile bleue, qui est au-dessus "
        "d'un petit losange violet, qui est à gauche d'un grand carré vert.",
        "ru": "Большой красный круг находится слева от маленькой синей звезды, которая находится "
        "над маленьким фиолетовым ромбом, который находится слева от большого зелёного квадрата.",
        "es": "Un círculo rojo grande está a la izquierda de una estrella azul pequeña, que está "
        "encima de un rombo morado pequeño, que está a la izquierda de un cuadrado verde grande.",
    }
    lone = tw.Scene(
        "val000001", "val", 1, 0, (tw.Obj("diamond", "yellow", "small", 0.15, 0.85, 0.07),)
    )
    assert tw.captions(lone, LANGS) == {
        "en": "A small yellow diamond in the bottom left corner.",
        "de": "Eine kleine gelbe Raute in der unteren linken Ecke.",
        "fr": "Un petit losange jaune dans le coin inférieur gauche.",
        "ru": "Маленький жёлтый ромб в левом нижнем углу.",
        "es": "Un rombo amarillo pequeño en la esquina inferior izquierda.",
    }


def test_golden_granular_captions() -> None:
    """Hand-checked: each object as a query is typed, each neighbouring pair both ways (the
    related object in the case its preposition governs)."""
    objs = (
        tw.Obj("circle", "red", "large", 0.15, 0.5, 0.14),
        tw.Obj("star", "blue", "small", 0.45, 0.3, 0.07),
        tw.Obj("diamond", "purple", "small", 0.5, 0.7, 0.07),
        tw.Obj("square", "green", "large", 0.85, 0.75, 0.14),
    )
    got = tw.granular_captions(tw.Scene("train000000", "train", 0, 0, objs), LANGS)
    assert list(got) == ["object_captions", "pair_captions", "list_captions"]
    # every object listed, once starting from each (the first in scene order)
    assert {lang: lists[0] for lang, lists in got["list_captions"].items()} == {
        "en": "a large red circle, a small blue star, a small purple diamond and a large green "
        "square",
        "de": "ein großer roter Kreis, ein kleiner blauer Stern, eine kleine violette Raute und "
        "ein großes grünes Quadrat",
        "fr": "un grand cercle rouge, une petite étoile bleue, un petit losange violet et un "
        "grand carré vert",
        "ru": "большой красный круг, маленькая синяя звезда, маленький фиолетовый ромб и "
        "большой зелёный квадрат",
        "es": "un círculo rojo grande, una estrella azul pequeña, un rombo morado pequeño y un "
        "cuadrado verde grande",
    }
    assert got["list_captions"]["ru"][2] == (
        "маленький фиолетовый ромб, большой зелёный квадрат, большой красный круг и маленькая "
        "синяя звезда"
    )
    assert len(got["list_captions"]["en"]) == 4
    assert got["object_captions"] == {
        "en": ["a large red circle", "a small blue star", "a small purple diamond",
               "a large green square"],
        "de": ["ein großer roter Kreis", "ein kleiner blauer Stern", "eine kleine violette Raute",
               "ein großes grünes Quadrat"],
        "fr": ["un grand cercle rouge", "une petite étoile bleue", "un petit losange violet",
               "un grand carré vert"],
        "ru": ["большой красный круг", "маленькая синяя звезда", "маленький фиолетовый ромб",
               "большой зелёный квадрат"],
        "es": ["un círculo rojo grande", "una estrella azul pequeña", "un rombo morado pequeño",
               "un cuadrado verde grande"],
    }  # fmt: skip
    pairs = got["pair_captions"]
    assert pairs["en"] == [
        "A large red circle is to the left of a small blue star.",
        "A small blue star is to the right of a large red circle.",
        "A small blue star is above a small purple diamond.",
        "A small purple diamond is below a small blue star.",
        "A small purple diamond is to the left of a large green square.",
        "A large green square is to the right of a small purple diamond.",
    ]
    assert pairs["de"] == [
        "Ein großer roter Kreis ist links von einem kleinen blauen Stern.",
        "Ein kleiner blauer Stern ist rechts von einem großen roten Kreis.",
        "Ein kleiner blauer Stern ist über einer kleinen violetten Raute.",
        "Eine kleine violette Raute ist unter einem kleinen blauen Stern.",
        "Eine kleine violette Raute ist links von einem großen grünen Quadrat.",
        "Ein großes grünes Quadrat ist rechts von einer kleinen violetten Raute.",
    ]
    assert pairs["ru"] == [
        "Большой красный круг находится слева от маленькой синей звезды.",
        "Маленькая синяя звезда находится справа от большого красного круга.",
        "Маленькая синяя звезда находится над маленьким фиолетовым ромбом.",
        "Маленький фиолетовый ромб находится под маленькой синей звездой.",
        "Маленький фиолетовый ромб находится слева от большого зелёного квадрата.",
        "Большой зелёный квадрат находится справа от маленького фиолетового ромба.",
    ]
    assert pairs["fr"][:4] == [
        "Un grand cercle rouge est à gauche d'une petite étoile bleue.",
        "Une petite étoile bleue est à droite d'un grand cercle rouge.",
        "Une petite étoile bleue est au-dessus d'un petit losange violet.",
        "Un petit losange violet est en dessous d'une petite étoile bleue.",
    ]
    assert pairs["es"][:4] == [
        "Un círculo rojo grande está a la izquierda de una estrella azul pequeña.",
        "Una estrella azul pequeña está a la derecha de un círculo rojo grande.",
        "Una estrella azul pequeña está encima de un rombo morado pequeño.",
        "Un rombo morado pequeño está debajo de una estrella azul pequeña.",
    ]
    lone = tw.Scene("val000001", "val", 1, 0, objs[:1])
    assert tw.granular_captions(lone, ["ru"]) == {
        "object_captions": {"ru": ["большой красный круг"]},
        "pair_captions": {"ru": []},
        "list_captions": {"ru": ["большой красный круг"]},
    }


@pytest.mark.parametrize("lang", LANGS)
def test_granular_captions_name_their_objects(lang: str) -> None:
    """Every object caption names its object's attributes alone and is typed as a query;
    the list names every object in order; a pair of two objects says what the scene caption
    of those two says."""
    colors, shapes, sizes = (_reverse(lang, t) for t in ("colors", "nouns", "sizes"))
    for scene in _scenes(300):
        got = tw.granular_captions(scene, [lang])
        said = got["object_captions"][lang]
        assert len(said) == len(scene.objects)
        for phrase, o in zip(said, scene.objects):
            tokens = _tokens(phrase)
            assert [colors[t] for t in tokens if t in colors] == [o.color], phrase
            assert [shapes[t] for t in tokens if t in shapes] == [o.shape], phrase
            assert [sizes[t] for t in tokens if t in sizes] == [o.size], phrase
            assert phrase == phrase.strip() and not phrase[0].isupper() and "." not in phrase
        lists = got["list_captions"][lang]
        assert len(lists) == len(scene.objects)
        for i, listed in enumerate(lists):  # from object i on, round to the ones before it
            order = [*scene.objects[i:], *scene.objects[:i]]
            tokens = _tokens(listed)
            assert [colors[t] for t in tokens if t in colors] == [o.color for o in order]
            assert [shapes[t] for t in tokens if t in shapes] == [o.shape for o in order]
            assert listed.startswith(said[i]) and listed.endswith(said[i - 1])
        pairs = got["pair_captions"][lang]
        assert len(pairs) == 2 * (len(scene.objects) - 1)
        for k, (i, _, j) in enumerate(tw.relations(scene)):
            two = dataclasses.replace(scene, objects=scene.objects[i : j + 1])
            assert pairs[2 * k] == tw.describe(two, lang)
            back = _tokens(pairs[2 * k + 1])
            assert [colors[t] for t in back if t in colors] == [
                scene.objects[j].color, scene.objects[i].color
            ]  # fmt: skip


def test_caption_scripts_and_single_object_locations() -> None:
    cyrillic, latin = re.compile("[а-яё]", re.I), re.compile("[a-z]", re.I)
    for scene in _scenes(100):
        caps = tw.captions(scene, LANGS)
        assert cyrillic.search(caps["ru"]) and not latin.search(caps["ru"])
        assert not cyrillic.search(caps["en"] + caps["de"] + caps["fr"] + caps["es"])
        assert len(set(caps.values())) == len(caps)
        assert all(c[0].isupper() and c.endswith(".") for c in caps.values())
        if len(scene.objects) == 1:
            where = tw.location(scene.objects[0])
            for lang, cap in caps.items():
                assert tw.LEXICON[lang]["locations"][where] in cap


def test_captions_are_near_unique() -> None:
    scenes = _scenes(1000, seed=0)
    for lang in LANGS:
        caps = [tw.describe(s, lang) for s in scenes]
        assert len(set(caps)) >= 950, lang


def test_layouts_keep_shapes_apart_and_inside() -> None:
    for scene in _scenes(300, seed=1):
        objs = scene.objects
        for o in objs:
            assert o.r <= o.x <= 1 - o.r and o.r <= o.y <= 1 - o.r
        for a, b in itertools.combinations(objs, 2):
            assert np.hypot(a.x - b.x, a.y - b.y) >= a.r + b.r + tw.GAP - 1e-9
        assert len({(o.shape, o.color) for o in objs}) == len(objs)


def test_parallel_view_pairs_every_language(
    world: tuple[Path, dict], image_text: list[dict]
) -> None:
    root, manifest = world
    pairs = list(itertools.combinations(LANGS, 2))
    by_scene = {s["__key__"]: json.loads(s["json"])["captions"] for s in image_text}
    scenes = {s.key: s for split in tw.SPLITS for s in _scenes_of(manifest, split)}
    got: dict[str, list[tuple[str, ...]]] = {}
    for split in tw.SPLITS:
        for s in _read(root, manifest["shards"]["parallel"][split]):
            rec = json.loads(s["json"])
            a, b = rec["languages"]
            if s["__key__"].endswith("_statements"):  # train only: the scene's facts
                assert split == "train"
                scene = scenes[rec["scene"]]
                assert rec["texts"] == [tw.statements(scene, a), tw.statements(scene, b)]
                continue
            caps = by_scene[rec["scene"]]
            assert rec["texts"] == [caps[a], caps[b]]
            got.setdefault(rec["scene"], []).append((a, b))
    assert set(got) == set(by_scene)
    assert all(v == pairs for v in got.values())


def _scenes_of(manifest: dict, split: str) -> list[tw.Scene]:
    return [tw.sample_scene(manifest["seed"], split, i) for i in range(manifest["counts"][split])]


def test_manifest_matches_files(world: tuple[Path, dict]) -> None:
    root, manifest = world
    assert json.loads((root / "manifest.json").read_text("utf-8")) == manifest
    assert manifest["seed"] == 3 and manifest["languages"] == list(LANGS)
    assert manifest["counts"] == {"train": 40, "val": 12, "test": 8}
    n_pairs = len(LANGS) * (len(LANGS) - 1) // 2
    assert set(manifest["shards"]) == {"image_text", "parallel", "mono", "nli", "regions", "vqa"}
    assert set(manifest["by_language"]) == {"mono", "nli"}
    for view, per_split in manifest["shards"].items():
        on_disk = sorted(p.relative_to(root).as_posix() for p in (root / view).glob("*.tar"))
        assert sorted(itertools.chain(*per_split.values())) == on_disk
        for split, paths in per_split.items():
            n = len(_read(root, paths))
            assert n == manifest["samples"][view][split]
            scenes = _scenes_of(manifest, split)
            texts = 2 if split == "train" else 1  # captions, and statements for train
            expected = {
                "image_text": len(scenes),
                "parallel": n_pairs * len(scenes) * texts,
                "mono": len(LANGS) * len(scenes) * texts,
                "nli": len(LANGS) * sum(len(tw.nli_pairs(s)) for s in scenes),
                "regions": len(scenes),
                "vqa": sum(len(tw.vqa_questions(s)) for s in scenes),
            }
            assert n == expected[view]
            shard_sets = manifest["by_language"][view][split] if view in ("mono", "nli") else {}
            if shard_sets:
                assert list(shard_sets) == list(LANGS)
                assert list(itertools.chain(*(v["shards"] for v in shard_sets.values()))) == paths
                for lang, got in shard_sets.items():
                    assert got["samples"] == n // len(LANGS)
                    assert len(got["shards"]) == -(-got["samples"] // SMALL["shard_size"])
                    assert all(p.startswith(f"{view}/{split}-{lang}-") for p in got["shards"])
            else:
                assert len(paths) == -(-n // SMALL["shard_size"])
    for split in tw.SPLITS:
        assert (root / manifest["nli"]["xnli"][split]).is_file()
        assert (root / manifest["vqa"]["questions"][split]).is_file()
        assert (root / manifest["vqa"]["annotations"][split]).is_file()
    assert manifest["detector"]["classes"] == list(tw.SHAPES)
    assert manifest["caption_fields"] == {
        "object": "object_captions", "pair": "pair_captions", "list": "list_captions",
        "scene": "captions",
    }  # fmt: skip
    for lang in LANGS:
        lines = (root / manifest["text"][lang]).read_text("utf-8").splitlines()
        assert lines == [tw.describe(s, lang) for s in _scenes(40, seed=3)]


def test_rerun_with_fewer_scenes_drops_stale_shards(tmp_path: Path) -> None:
    tw.generate(tmp_path, n_train=40, n_val=0, n_test=0, shard_size=16, languages=("en",))
    manifest = tw.generate(tmp_path, n_train=10, n_val=0, n_test=0, shard_size=16)
    assert [p.name for p in (tmp_path / "image_text").glob("*.tar")] == ["train-000000.tar"]
    assert manifest["shards"]["image_text"] == {
        "train": ["image_text/train-000000.tar"],
        "val": [],
        "test": [],
    }


def test_primary_caption_without_english(tmp_path: Path) -> None:
    manifest = tw.generate(tmp_path, n_train=3, n_val=0, n_test=0, languages=("fr", "ru"))
    for s in _read(tmp_path, manifest["shards"]["image_text"]["train"]):
        assert s["txt"].decode("utf-8") == json.loads(s["json"])["captions"]["fr"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"languages": ("en", "xx")}, "xx"),
        ({"languages": ("en", "en")}, "repeat"),
        ({"languages": ()}, "language"),
        ({"n_val": -1}, "n_val"),
        ({"image_size": 8}, "image_size"),
        ({"shard_size": 0}, "shard_size"),
    ],
)
def test_bad_arguments(tmp_path: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tw.generate(tmp_path, **kwargs)
    assert not (tmp_path / "manifest.json").exists()


# ---------------------------------------------------------------------------------------------
# mono and NLI views


def test_mono_view(world: tuple[Path, dict]) -> None:
    root, manifest = world
    for split in tw.SPLITS:
        scenes = _scenes_of(manifest, split)
        for lang in LANGS:
            paths = manifest["by_language"]["mono"][split][lang]["shards"]
            samples = _read(root, paths)
            expected = [(f"{s.key}_{lang}", tw.describe(s, lang)) for s in scenes]
            if split == "train":
                expected = [
                    item
                    for s, caption in zip(scenes, expected)
                    for item in (caption, (f"{s.key}_{lang}_statements", tw.statements(s, lang)))
                ]
            assert [(s["__key__"], s["txt"].decode()) for s in samples] == expected
            assert all(json.loads(s["json"]) == {"language": lang} for s in samples)


_RELATION_RE = re.compile(r"to the left of|to the right of|above|below")
_EN_RELATIONS = {"to the left of": "left_of", "to the right of": "right_of"}


def _objects(text: str, lang: str) -> list[tuple[str, str]]:
    """(colour, shape) of each object named in the text, in order."""
    colors, shapes = _reverse(lang, "colors"), _reverse(lang, "nouns")
    words = re.findall(r"\w+", text.lower())
    return list(
        zip([colors[w] for w in words if w in colors], [shapes[w] for w in words if w in shapes])
    )


def _sizes(text: str, lang: str) -> list[str]:
    sizes = _reverse(lang, "sizes")
    predicative = tw.LEXICON[lang]["definite"].get("sizes", {})
    sizes |= {form.lower(): name for name, form in predicative.items()}
    return [sizes[w] for w in re.findall(r"\w+", text.lower()) if w in sizes]


def _relations(text: str, lang: str) -> list[str]:
    # undo the contractions "vom" (de) and "del" (es)
    text = text.lower().replace(" vom ", " von dem ").replace(" del ", " de el ")
    found = []
    for rel, (phrase, _) in tw.LEXICON[lang]["relations"].items():
        found += [(m.start(), rel) for m in re.finditer(rf"(?<!\w){re.escape(phrase)}(?!\w)", text)]
    return [rel for _, rel in sorted(found)]


def _claim(text: str, lang: str) -> tuple:
    """A hypothesis read back from its words: ((colour, shape), size) or (a, relation, b)."""
    objs, sizes, rels = _objects(text, lang), _sizes(text, lang), _relations(text, lang)
    if len(objs) == 1:
        assert len(sizes) == 1 and not rels, (lang, text)
        return (objs[0], sizes[0])
    assert len(objs) == 2 and len(rels) == 1 and not sizes, (lang, text)
    return (objs[0], rels[0], objs[1])


def _holds(scene: tw.Scene, a: tuple[str, str], rel: str, b: tuple[str, str]) -> bool:
    """Geometry, without tw.relation: the larger centre offset decides the axis."""
    at = {(o.shape, o.color): o for o in scene.objects}
    pa, pb = at[a[::-1]], at[b[::-1]]
    dx, dy = pb.x - pa.x, pb.y - pa.y
    horizontal = abs(dx) >= abs(dy)
    return {
        "left_of": horizontal and dx > 0,
        "right_of": horizontal and dx < 0,
        "above": not horizontal and dy > 0,
        "below": not horizontal and dy < 0,
    }[rel]


_OPP = {"left_of": "right_of", "right_of": "left_of", "above": "below", "below": "above"}


def _expected_label(scene: tw.Scene, premise: str, claim: tuple) -> str:
    """Label from what the English premise says, checked against the scene."""
    named = _objects(premise, "en")
    sizes = dict(zip(named, _sizes(premise, "en")))
    rels = [_EN_RELATIONS.get(r, r) for r in _RELATION_RE.findall(premise)]
    assert len(sizes) == len(named) and len(rels) == len(named) - 1, premise
    attrs = {(o.color, o.shape): o.size for o in scene.objects}
    assert all(attrs[o] == size for o, size in sizes.items())  # the premise is true
    said = set()
    for a, rel, b in zip(named, rels, named[1:]):
        assert _holds(scene, a, rel, b), (premise, a, rel, b)
        said |= {(a, rel, b), (b, _OPP[rel], a)}
    mentioned = [o for o in claim if isinstance(o, tuple)]
    if not set(mentioned) <= set(named):
        return "neutral"
    if len(claim) == 2:
        return "entailment" if sizes[claim[0]] == claim[1] else "contradiction"
    a, rel, b = claim
    if (a, rel, b) in said:
        return "entailment"
    assert (a, _OPP[rel], b) in said, (premise, claim)
    return "contradiction"


def test_nli_labels_follow_from_the_premise() -> None:
    """Independent check: read premise and hypothesis back, decide the label from the scene."""
    kinds = set()
    for scene in _scenes(400, seed=5):
        pairs = tw.nli_pairs(scene)
        assert 1 <= len(pairs) <= 3 and len({p.label for p in pairs}) == len(pairs)
        if len(scene.objects) == 1:
            assert [p.label for p in pairs] in (["entailment"], ["contradiction"])
        for pair in pairs:
            premise, hypothesis = tw.nli_text(scene, pair, "en")
            claim = _claim(hypothesis, "en")
            assert _expected_label(scene, premise, claim) == pair.label, (premise, hypothesis)
            if pair.label != "neutral":  # closed world: entailed facts hold, contradicted do not
                attrs = {(o.color, o.shape): o.size for o in scene.objects}
                true = attrs[claim[0]] == claim[1] if len(claim) == 2 else _holds(scene, *claim)
                assert true == (pair.label == "entailment")
            kinds.add((pair.label, len(claim)))
            for lang in LANGS[1:]:  # translations: the same objects, sizes and relation
                prem, hypo = tw.nli_text(scene, pair, lang)
                assert _claim(hypo, lang) == claim, (lang, hypo, hypothesis)
                assert _objects(prem, lang) == _objects(premise, "en")
                assert hypo[0].isupper() and hypo.endswith(".")
    assert kinds == {(label, n) for label in tw.NLI_LABELS for n in (2, 3)}


def test_statements_are_true_claims_in_every_language() -> None:
    """Read each statement back and check it against the geometry (not tw.relation)."""
    kinds = set()
    for scene in _scenes(300, seed=6):
        claims = tw.facts(scene)
        assert 1 <= len(claims) <= tw.MAX_STATEMENTS
        attrs = {(o.color, o.shape): o.size for o in scene.objects}
        per_lang = {}
        for lang in LANGS:
            text = tw.statements(scene, lang)
            sentences = re.split(r"(?<=\.) ", text)
            assert len(sentences) == len(claims), (lang, text)
            per_lang[lang] = [_claim(sent, lang) for sent in sentences]
        for claim in per_lang["en"]:
            true = attrs[claim[0]] == claim[1] if len(claim) == 2 else _holds(scene, *claim)
            assert true, (tw.statements(scene, "en"), claim)
            kinds.add(len(claim))
        assert all(c == per_lang["en"] for c in per_lang.values()), per_lang
    assert kinds == {2, 3}


def test_nli_labels_are_balanced() -> None:
    labels = [p.label for s in _scenes(1500, seed=2) for p in tw.nli_pairs(s)]
    assert len(labels) > 2500
    for label in tw.NLI_LABELS:
        assert 0.30 <= labels.count(label) / len(labels) <= 0.37, label


def test_golden_nli_hypotheses() -> None:
    """Hand-written: definite articles, contractions, elision, agreement and case."""
    objs = (
        tw.Obj("circle", "red", "large", 0.15, 0.5, 0.14),
        tw.Obj("star", "blue", "small", 0.45, 0.3, 0.07),
        tw.Obj("diamond", "purple", "small", 0.5, 0.7, 0.07),
        tw.Obj("square", "green", "large", 0.85, 0.75, 0.14),
    )
    scene = tw.Scene("train000000", "train", 0, 0, objs)
    claims = [
        tw.Claim(1, size="small"),
        tw.Claim(1, relation="right_of", object=0),
        tw.Claim(2, relation="below", object=1),
        tw.Claim(3, relation="left_of", object=2),
    ]
    got = {lang: [tw.state(scene, c, lang) for c in claims] for lang in LANGS}
    assert got == {
        "en": [
            "The blue star is small.",
            "The blue star is to the right of the red circle.",
            "The purple diamond is below the blue star.",
            "The green square is to the left of the purple diamond.",
        ],
        "de": [
            "Der blaue Stern ist klein.",
            "Der blaue Stern ist rechts vom roten Kreis.",
            "Die violette Raute ist unter dem blauen Stern.",
            "Das grüne Quadrat ist links von der violetten Raute.",
        ],
        "fr": [
            "L'étoile bleue est petite.",
            "L'étoile bleue est à droite du cercle rouge.",
            "Le losange violet est en dessous de l'étoile bleue.",
            "Le carré vert est à gauche du losange violet.",
        ],
        "ru": [
            "Синяя звезда маленькая.",
            "Синяя звезда находится справа от красного круга.",
            "Фиолетовый ромб находится под синей звездой.",
            "Зелёный квадрат находится слева от фиолетового ромба.",
        ],
        "es": [
            "La estrella azul es pequeña.",
            "La estrella azul está a la derecha del círculo rojo.",
            "El rombo morado está debajo de la estrella azul.",
            "El cuadrado verde está a la izquierda del rombo morado.",
        ],
    }
    pair = tw.NliPair("train000000_0", 2, claims[1], "entailment")
    assert (
        tw.nli_text(scene, pair, "en")[0]
        == "A large red circle is to the left of a small blue star."
    )


def _nli_shards(root: Path, manifest: dict, split: str, lang: str) -> list[dict]:
    paths = manifest["by_language"]["nli"][split][lang]["shards"]
    return [json.loads(s["json"]) for s in _read(root, paths)]


def test_nli_view_shards_share_pair_ids_across_languages(world: tuple[Path, dict]) -> None:
    root, manifest = world
    for split in tw.SPLITS:
        scenes = [tw.sample_scene(3, split, i) for i in range(manifest["counts"][split])]
        expected = [(s, p) for s in scenes for p in tw.nli_pairs(s)]
        by_lang = {lang: _nli_shards(root, manifest, split, lang) for lang in LANGS}
        ids = [r["pair_id"] for r in by_lang["en"]]
        assert ids == [p.pair_id for _, p in expected] and len(set(ids)) == len(ids)
        for lang, records in by_lang.items():
            assert [r["pair_id"] for r in records] == ids
            assert [r["label"] for r in records] == [p.label for _, p in expected]
            assert all(r["language"] == lang for r in records)
            texts = [tw.nli_text(s, p, lang) for s, p in expected]
            assert [(r["premise"], r["hypothesis"]) for r in records] == texts


def test_nli_tsvs_convert_back_to_the_same_pairs(world: tuple[Path, dict], tmp_path: Path) -> None:
    """The MultiNLI and XNLI-MT files toyworld writes give the pairs of its (XNLI) shards."""
    root, manifest = world
    header = (root / "nli" / "xnli.val.tsv").read_text("utf-8").splitlines()[0]
    assert header.split("\t") == list(XNLI_COLUMNS)
    shards = {lang: _nli_shards(root, manifest, "train", lang) for lang in LANGS}

    def triples(records: list[dict]) -> list[tuple[str, str, str]]:
        return [(r["premise"], r["hypothesis"], r["label"]) for r in records]

    def records(stats: dict) -> list[dict]:
        return [json.loads(s["json"]) for s in _read(Path("/"), stats["shards"])]

    mnli = convert_xnli(root / manifest["nli"]["multinli"], tmp_path / "mnli", split="train")
    assert mnli["format"] == "multinli" and mnli["skipped"] == {}
    assert records(mnli) == shards["en"]  # pair ids included
    raw = (root / manifest["nli"]["translate_train"]["de"]).read_text("utf-8")
    assert "\tcontradictory\n" in raw and "\tcontradiction\n" not in raw
    for lang, path in manifest["nli"]["translate_train"].items():
        stats = convert_xnli(root / path, tmp_path / "mt", split="train", language=lang)
        assert stats["format"] == "xnli-mt" and stats["skipped"] == {}
        assert triples(records(stats)) == triples(shards[lang])


# ---------------------------------------------------------------------------------------------
# regions and VQA views


def _by_key(samples: list[dict]) -> dict[str, dict]:
    return {s["__key__"]: s for s in samples}


@pytest.fixture(scope="module")
def regions(world: tuple[Path, dict]) -> list[dict]:
    root, manifest = world
    return _read(root, [p for split in tw.SPLITS for p in manifest["shards"]["regions"][split]])


def test_regions_view_extends_image_text(image_text: list[dict], regions: list[dict]) -> None:
    assert [s["__key__"] for s in regions] == [s["__key__"] for s in image_text]
    hits = total = 0
    for plain, s in zip(image_text, regions):
        assert set(s) - {"__url__", "__local_path__"} == {
            "__key__",
            "jpg",
            "txt",
            "json",
            "regions.npz",
        }
        assert all(s[m] == plain[m] for m in ("jpg", "txt"))
        # the json is image_text's but for the finer captions, which only image_text has
        finer = set(tw.CAPTION_FIELDS.values()) - {"captions"}
        plain_meta = json.loads(plain["json"])
        assert finer <= set(plain_meta) and finer.isdisjoint(json.loads(s["json"]))
        assert json.loads(s["json"]) == {k: v for k, v in plain_meta.items() if k not in finer}
        objects = json.loads(s["json"])["objects"]
        arrays = load_regions(s["regions.npz"])
        assert list(arrays) == ["features", "boxes", "image_size", "probs", "labels"]
        r = len(objects)
        assert arrays["features"].shape == (r, tw.DETECTOR_FEATURES)
        assert arrays["features"].dtype == arrays["boxes"].dtype == np.float32
        assert arrays["probs"].shape == (r, len(tw.SHAPES)) and arrays["probs"].dtype == np.float32
        assert arrays["labels"].dtype == np.int64 and arrays["image_size"].tolist() == [64, 64]
        np.testing.assert_array_equal(arrays["boxes"], np.float32([o["box"] for o in objects]))
        assert arrays["labels"].tolist() == [o["label"] for o in objects]
        np.testing.assert_allclose(arrays["probs"].sum(1), 1.0, atol=1e-5)
        assert (arrays["probs"] > 0).all() and np.isfinite(arrays["features"]).all()
        hits += int((arrays["probs"].argmax(1) == arrays["labels"]).sum())
        total += r
    assert 0.8 < hits / total < 1.0  # mostly right, not an oracle


def test_region_features_are_deterministic_and_see_the_image() -> None:
    scenes = [tw.sample_scene(7, "val", i) for i in range(30)]
    first = tw.detect(scenes, 64)
    again = tw.detect(scenes[5:], 64)  # other batch composition, same bits
    for a, b in zip(first[5:], again):
        assert a["jpg"] == b["jpg"]
        np.testing.assert_array_equal(a["features"], b["features"])
        np.testing.assert_array_equal(a["probs"], b["probs"])
    feats = np.concatenate([r["features"] for r in first])
    assert feats.std(0).min() > 0  # every channel varies with the content
    # same shape and colour, other scene: features close; other colour: further apart
    by_kind: dict[tuple[str, str], list[np.ndarray]] = {}
    for scene, rec in zip(scenes, first):
        for obj, f in zip(scene.objects, rec["features"]):
            by_kind.setdefault((obj.color, obj.shape), []).append(f)
    centres = {k: np.mean(v, 0) for k, v in by_kind.items()}
    within = np.mean([np.linalg.norm(f - centres[k]) for k, v in by_kind.items() for f in v])
    keys = list(centres)
    between = np.mean(
        [np.linalg.norm(centres[a] - centres[b]) for a, b in itertools.pairwise(keys)]
    )
    assert between > within


_QUESTION_RES = {
    "color": re.compile(r"What color is the (\w+)\?"),
    "shape": re.compile(r"What shape is the (\w+) object\?"),
    "count_all": re.compile(r"How many shapes are there\?"),
    "count": re.compile(r"How many (\w+)s are there\?"),
    "exists": re.compile(r"Is there a (\w+) (\w+)\?"),
    "spatial": re.compile(
        r"What is (to the left of|to the right of|above|below) the (\w+) (\w+)\?"
    ),
}


def _truth(scene: tw.Scene, question: str) -> tuple[str, str, str]:
    """(kind, answer, answer type) worked out from the scene without the generator's code."""
    objs = scene.objects
    # first match wins: "How many shapes" also fits the per-shape pattern
    found = [(k, m) for k, p in _QUESTION_RES.items() if (m := p.fullmatch(question))]
    assert found, f"unknown question {question!r}"
    kind, m = found[0]
    if kind == "color":
        (match,) = [o for o in objs if o.shape == m[1]]  # asked only when unambiguous
        return kind, match.color, "other"
    if kind == "shape":
        (match,) = [o for o in objs if o.color == m[1]]
        return kind, match.shape, "other"
    if kind == "count_all":
        return kind, str(len(objs)), "number"
    if kind == "count":
        return kind, str(sum(o.shape == m[1] for o in objs)), "number"
    if kind == "exists":
        there = any(o.color == m[1] and o.shape == m[2] for o in objs)
        return kind, "yes" if there else "no", "yes/no"
    (ref,) = [o for o in objs if (o.color, o.shape) == (m[2], m[3])]
    axis, sign = {"to the left of": (0, -1), "to the right of": (0, 1), "above": (1, -1),
                  "below": (1, 1)}[m[1]]  # fmt: skip
    pos = lambda o: (o.x, o.y)  # noqa: E731
    (other,) = [o for o in objs if o is not ref and sign * (pos(o)[axis] - pos(ref)[axis]) > 0]
    offset = [abs(pos(other)[a] - pos(ref)[a]) for a in (0, 1)]
    assert offset[axis] >= offset[1 - axis], question  # the asked axis dominates
    return kind, other.shape, "other"


def test_vqa_answers_follow_from_the_scene() -> None:
    kinds: dict[str, int] = {}
    answers_seen: dict[str, set[str]] = {}
    noisy = yes = yes_no = 0
    for scene in _scenes(400, seed=2):
        questions = tw.vqa_questions(scene)
        assert 2 <= len(questions) <= 3
        assert [q.question_id for q in questions] == [
            scene.index * 10 + k for k in range(len(questions))
        ]
        got = [_truth(scene, q.question) for q in questions]
        assert len({k.removesuffix("_all") for k, _, _ in got}) == len(got)  # kinds differ
        for q, (kind, answer, answer_type) in zip(questions, got):
            assert (q.answer, q.answer_type) == (answer, answer_type), (scene, q)
            assert len(q.answers) == 10 and len(q.confidences) == 10
            counts = {a: q.answers.count(a) for a in q.answers}
            assert max(counts, key=counts.get) == answer and counts[answer] >= 7
            noisy += counts[answer] < 10
            kinds[kind] = kinds.get(kind, 0) + 1
            answers_seen.setdefault(kind, set()).add(answer)
            if kind == "exists":
                yes_no += 1
                yes += answer == "yes"
    assert set(kinds) == set(_QUESTION_RES)
    assert 0.4 < yes / yes_no < 0.6
    assert 0.4 < noisy / sum(kinds.values()) < 0.8  # soft scores are not all 1
    assert "0" in answers_seen["count"] and "two" not in answers_seen["count_all"]


def test_vqa_view_matches_its_json_files(world: tuple[Path, dict], regions: list[dict]) -> None:
    root, manifest = world
    media = _by_key(regions)
    for split in tw.SPLITS:
        questions = json.loads((root / manifest["vqa"]["questions"][split]).read_text("utf-8"))
        annotations = json.loads((root / manifest["vqa"]["annotations"][split]).read_text("utf-8"))
        assert questions["data_subtype"] == annotations["data_subtype"] == split
        assert questions["task_type"] == "Open-Ended"
        anns = {a["question_id"]: a for a in annotations["annotations"]}
        assert len(anns) == len(questions["questions"])
        samples = _read(root, manifest["shards"]["vqa"][split])
        assert [s["__key__"] for s in samples] == [
            str(q["question_id"]) for q in questions["questions"]
        ]
        for q, s in zip(questions["questions"], samples):
            assert set(q) == {"image_id", "question", "question_id"}
            ann = anns[q["question_id"]]
            assert set(ann) == {
                "question_id", "image_id", "answers", "multiple_choice_answer", "answer_type",
                "question_type",
            }  # fmt: skip
            assert ann["image_id"] == q["image_id"] and ann["answer_type"] in tw.ANSWER_TYPES
            assert [a["answer_id"] for a in ann["answers"]] == list(range(1, 11))
            assert all(a["answer_confidence"] in ("yes", "maybe") for a in ann["answers"])
            meta = json.loads(s["json"])
            assert meta == {
                "question": q["question"],
                "question_id": q["question_id"],
                "image_id": q["image_id"],
                "answers": [a["answer"] for a in ann["answers"]],
                "answer_type": ann["answer_type"],
                "question_type": ann["question_type"],
                "multiple_choice_answer": ann["multiple_choice_answer"],
            }
            image = media[f"{split}{q['image_id']:06d}"]
            assert s["jpg"] == image["jpg"] and s["regions.npz"] == image["regions.npz"]


def test_convert_vqa_reproduces_the_vqa_view(
    world: tuple[Path, dict], regions: list[dict], tmp_path: Path
) -> None:
    """The VQA v2 files + the images + a BUTD TSV, through convert_vqa, give the view's samples."""
    root, manifest = world
    images, split = tmp_path / "images", "val"
    images.mkdir()
    records = []
    for s in regions:
        if s["__key__"].startswith(split):
            index = int(s["__key__"][len(split) :])
            (images / f"toy_{index:06d}.jpg").write_bytes(s["jpg"])
            records.append({"image_id": index, **load_regions(s["regions.npz"])})
    write_butd_tsv(tmp_path / "regions.tsv", records, layout="lxmert")
    stats = convert_vqa(
        root / manifest["vqa"]["questions"][split],
        root / manifest["vqa"]["annotations"][split],
        images,
        tmp_path / "out",
        split=split,
        regions_tsv=tmp_path / "regions.tsv",
        image_name="toy_{image_id:06d}.jpg",
    )
    assert stats["skipped"] == {}
    ours = _read(root, manifest["shards"]["vqa"][split])
    theirs = _read(Path("/"), stats["shards"])
    assert [s["__key__"] for s in theirs] == [s["__key__"] for s in ours]
    for a, b in zip(ours, theirs):
        assert a["json"] == b["json"] and a["jpg"] == b["jpg"]
        mine, back = load_regions(a["regions.npz"]), load_regions(b["regions.npz"])
        assert "probs" not in back  # BUTD TSVs keep no class distribution
        for name in ("features", "boxes", "image_size", "labels"):
            np.testing.assert_array_equal(mine[name], back[name])
