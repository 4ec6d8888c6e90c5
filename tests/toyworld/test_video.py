"""toyworld video: clips, their captions and reversal, the pixels, features, QA and the views."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import av
import numpy as np
import pytest
import webdataset as wds

from mmptm import toyworld as tw
from mmptm.cli import main as cli_main
from mmptm.toyworld import motion

SMALL = {"n_train": 24, "n_val": 8, "n_test": 6, "image_size": 64, "shard_size": 10}
LANGS = ("en", "de", "fr", "ru", "es")
VIDEO = ("video", "video_features", "video_qa")


def _read(root: Path, paths: list[str]) -> list[dict]:
    return list(wds.WebDataset([str(root / p) for p in paths], shardshuffle=False))


def _decode(mp4: bytes) -> np.ndarray:
    with av.open(io.BytesIO(mp4)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*.tar"))
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("toyworld_video")
    return root, tw.generate(root, seed=5, languages=LANGS, views=VIDEO, **SMALL)


@pytest.fixture(scope="module")
def videos(world: tuple[Path, dict]) -> list[dict]:
    root, manifest = world
    return _read(root, [p for split in tw.SPLITS for p in manifest["shards"]["video"][split]])


def _clips(n: int, seed: int = 0, split: str = "train") -> list[tw.Clip]:
    return [tw.sample_clip(seed, split, i) for i in range(n)]


# ---------------------------------------------------------------------------------------------
# Clips and their reversal


def test_clips_depend_only_on_their_coordinates() -> None:
    assert _clips(30) == _clips(30)
    assert tw.sample_clip(0, "val", 3) == tw.sample_clip(0, "val", 3)
    assert tw.sample_clip(0, "val", 3) != tw.sample_clip(1, "val", 3)
    assert tw.sample_clip(0, "val", 3) != tw.sample_clip(0, "test", 3)
    for clip in _clips(50):  # clip i starts from image i's layout (to 2**-16 of the side)
        scene = tw.sample_scene(0, "train", clip.scene.index)
        start = np.array([(o.x, o.y, o.r) for o in clip.scene.objects])
        assert np.abs(start - [(o.x, o.y, o.r) for o in scene.objects]).max() <= 2**-16


def test_events_follow_the_stated_timing() -> None:
    counts = {k: 0 for k in tw.EVENT_KINDS}
    for clip in _clips(400):
        objects = [e.object for e in clip.events]
        assert len(set(objects)) == len(objects) and 1 <= len(objects) <= 2
        windows = [(e.start, e.end) for e in clip.events]
        assert windows in ([(0, 7)], [(0, 3), (4, 7)])
        for e in clip.events:
            counts[e.kind] += 1
    assert all(n >= 20 for n in counts.values()), counts  # every kind happens


def test_reversal_is_the_clip_played_backwards() -> None:
    for clip in _clips(60):
        back = tw.reverse_clip(clip)
        assert tw.reverse_clip(back) == clip
        frames = tw.render_clip(clip, 64)
        assert frames.shape == (8, 64, 64, 3) and frames.dtype == np.uint8
        np.testing.assert_array_equal(tw.render_clip(back, 64), frames[::-1])
        assert tw.object_states(back) == tw.object_states(clip)[::-1]


def test_reversed_caption_always_differs() -> None:
    for clip in _clips(1000):
        back = tw.reverse_clip(clip)
        for lang in LANGS:
            assert tw.narrate(clip, lang) != tw.narrate(back, lang), (clip, lang)


def _make(objs: list[tuple[str, str, str, float, float]], events: list[tuple]) -> tw.Clip:
    scene = tw.Scene(
        "train000000",
        "train",
        0,
        0,
        tuple(tw.Obj(s, c, z, x, y, tw.SIZES[z]) for s, c, z, x, y in objs),
    )
    return tw.Clip(scene, tuple(tw.Event(*e) for e in events))


def test_golden_captions() -> None:
    clip = _make(
        [("star", "green", "large", 0.5, 0.3), ("diamond", "blue", "small", 0.2, 0.7)],
        [("move_left", 0, 0, 3), ("grow", 1, 4, 7)],
    )
    assert tw.clip_captions(clip, LANGS) == {
        "en": "The green star moves left, then the blue diamond grows.",
        "de": "Der grüne Stern bewegt sich nach links, dann wächst die blaue Raute.",
        "fr": "L'étoile verte se déplace vers la gauche, puis le losange bleu grandit.",
        "ru": "Зелёная звезда движется влево, затем синий ромб увеличивается.",
        "es": "La estrella verde se mueve hacia la izquierda y luego el rombo azul crece.",
    }
    assert tw.clip_captions(tw.reverse_clip(clip), LANGS) == {
        "en": "The blue diamond shrinks, then the green star moves right.",
        "de": "Die blaue Raute schrumpft, dann bewegt sich der grüne Stern nach rechts.",
        "fr": "Le losange bleu rétrécit, puis l'étoile verte se déplace vers la droite.",
        "ru": "Синий ромб уменьшается, затем зелёная звезда движется вправо.",
        "es": "El rombo azul se encoge y luego la estrella verde se mueve hacia la derecha.",
    }
    lone = _make([("triangle", "purple", "small", 0.5, 0.5)], [("appear", 0, 0, 7)])
    assert tw.narrate(lone, "de") == "Das violette Dreieck erscheint."
    assert tw.narrate(tw.reverse_clip(lone), "ru") == "Фиолетовый треугольник исчезает."
    assert set(tw.MOTION_LEXICON) == set(tw.LANGUAGES)
    for lang, words in tw.MOTION_LEXICON.items():  # no two kinds read the same
        assert len({words["kinds"][k] for k in tw.EVENT_KINDS}) == len(tw.EVENT_KINDS), lang


# ---------------------------------------------------------------------------------------------
# Independent readings of the samples: events from the per-frame boxes, motion from the pixels

_WORDS = {"left": "moves left", "right": "moves right", "up": "moves up", "down": "moves down"}


def _events_from_boxes(objects: list[dict]) -> list[tuple[int, str, str]]:
    """(first frame that differs, object name, English verb) for every object that changes."""
    found = []
    for o in objects:
        boxes = o["boxes"]
        changed = [t for t in range(1, len(boxes)) if boxes[t] != boxes[t - 1]]
        if not changed:
            continue
        a, b = boxes[0], boxes[-1]
        if a is None or b is None:
            verb = "appears" if a is None else "disappears"
        else:
            (x0, y0), (x1, y1) = [((v[0] + v[2]) / 2, (v[1] + v[3]) / 2) for v in (a, b)]
            w0, w1 = a[2] - a[0], b[2] - b[0]
            if abs(x1 - x0) > 0.2:
                verb = _WORDS["right" if x1 > x0 else "left"]
            elif abs(y1 - y0) > 0.2:
                verb = _WORDS["down" if y1 > y0 else "up"]
            else:
                assert abs(w1 - w0) > 0.05
                verb = "grows" if w1 > w0 else "shrinks"
        found.append((changed[0], f"{o['color']} {o['shape']}", verb))
    return sorted(found)


def _english(events: list[tuple[int, str, str]]) -> str:
    text = ", then ".join(f"the {name} {verb}" for _, name, verb in events)
    return text[0].upper() + text[1:] + "."


def test_captions_match_the_tracks_forwards_and_backwards(videos: list[dict]) -> None:
    assert len(videos) == sum(SMALL[f"n_{s}"] for s in tw.SPLITS)
    for s in videos:
        meta = json.loads(s["json"])
        assert set(meta["captions"]) == set(LANGS) == set(meta["reversed_captions"])
        assert s["txt"].decode("utf-8") == meta["captions"]["en"]
        assert meta["captions"]["en"] == _english(_events_from_boxes(meta["objects"]))
        backwards = [{**o, "boxes": o["boxes"][::-1]} for o in meta["objects"]]
        assert meta["reversed_captions"]["en"] == _english(_events_from_boxes(backwards))
        for lang in LANGS:
            assert meta["captions"][lang] != meta["reversed_captions"][lang]
        kinds = [e["kind"] for e in meta["events"]]
        assert len(kinds) == len(_events_from_boxes(meta["objects"]))
        assert all(len(o["boxes"]) == meta["frames"] == 8 for o in meta["objects"])


def _mask(frames: np.ndarray, color: str) -> np.ndarray:
    """Pixels near ``color`` (not an edge blended with the background or a codec artefact)."""
    palette = np.array([*tw.COLORS.values(), tw.BACKGROUND], np.float64)  # [C,3]
    dist = ((frames[..., None, :].astype(np.float64) - palette) ** 2).sum(-1)
    i = list(tw.COLORS).index(color)
    return (dist.argmin(-1) == i) & (dist[..., i] < 60**2)


def test_decoded_frames_show_the_events(videos: list[dict]) -> None:
    checked = {k: 0 for k in ("move", "grow", "shrink", "appear", "disappear")}
    for s in videos:
        meta = json.loads(s["json"])
        frames = _decode(s["mp4"])
        assert frames.shape == (8, 64, 64, 3)
        colors = [o["color"] for o in meta["objects"]]
        for e in meta["events"]:
            color = colors[e["object"]]
            if colors.count(color) > 1:
                continue  # another object of that colour would blur the reading
            m = _mask(frames[[e["start"], e["end"]]], color)  # [2,H,W]
            area = m.sum((1, 2))
            kind = e["kind"]
            if kind.startswith("move"):
                ys, xs = np.mgrid[:64, :64]
                cx = [(xs * mi).sum() / mi.sum() for mi in m]
                cy = [(ys * mi).sum() / mi.sum() for mi in m]
                shift = {"move_left": cx[0] - cx[1], "move_right": cx[1] - cx[0],
                         "move_up": cy[0] - cy[1], "move_down": cy[1] - cy[0]}[kind]  # fmt: skip
                assert 12 < shift < 20, (meta["key"], kind, shift)  # 0.25 * 64 = 16 px
                kind = "move"
            elif kind == "grow":
                assert area[1] > 2.5 * area[0] > 0, (meta["key"], area)
            elif kind == "shrink":
                assert area[0] > 2.5 * area[1] > 0, (meta["key"], area)
            elif kind == "appear":
                assert area[0] < 3 and area[1] > 10, (meta["key"], area)
            else:
                assert area[1] < 3 and area[0] > 10, (meta["key"], area)
            checked[kind] += 1
    assert sum(checked.values()) >= 30, checked


# ---------------------------------------------------------------------------------------------
# Features


def test_features_view(world: tuple[Path, dict], videos: list[dict]) -> None:
    root, manifest = world
    feats = _read(
        root, [p for split in tw.SPLITS for p in manifest["shards"]["video_features"][split]]
    )
    assert [s["__key__"] for s in feats] == [s["__key__"] for s in videos]
    for f, v in zip(feats, videos):
        array = np.load(io.BytesIO(f["npy"]))
        assert array.shape == (8, tw.FRAME_FEATURES) and array.dtype == np.float16
        assert np.isfinite(array).all()
        assert json.loads(f["json"]) == json.loads(v["json"]) and f["txt"] == v["txt"]
        # features of the frames as rendered (before the lossy mp4)
        clip = tw.sample_clip(5, *_split_index(f["__key__"]))
        np.testing.assert_array_equal(array, tw.frame_features(tw.render_clip(clip, 64)))


def _split_index(key: str) -> tuple[str, int]:
    split = key.rstrip("0123456789")
    return split, int(key[len(split) :])


def _probe_clips(rows: list, labels: list, groups: list) -> None:
    """Each object of 160 scenes moved left and right (where it fits), features' last - first."""
    for i in range(160):
        scene = tw.sample_clip(2, "train", i).scene
        for j in range(len(scene.objects)):
            for kind, label in (("move_left", 0), ("move_right", 1)):
                if not motion._feasible(list(scene.objects), j, kind):
                    continue
                clip = tw.Clip(scene, (tw.Event(kind, j, 0, 7),))
                f = tw.frame_features(tw.render_clip(clip, 64)).astype(np.float64)
                rows.append(f[-1] - f[0])
                labels.append(label)
                groups.append(i)


def test_features_separate_left_from_right_linearly() -> None:
    """A ridge classifier of (last - first frame features) tells left from right moves."""
    rows, labels, groups = [], [], []
    with tw.one_thread():
        _probe_clips(rows, labels, groups)
    x, y, g = np.array(rows), np.array(labels), np.array(groups)
    train, test = g < 100, g >= 100  # held out by scene
    assert train.sum() > 150 and test.sum() > 80 and 0.3 < y.mean() < 0.7
    mean = x[train].mean(0)
    a = x[train] - mean
    w = np.linalg.solve(a.T @ a + np.eye(a.shape[1]), a.T @ (2.0 * y[train] - 1))
    accuracy = (((x[test] - mean) @ w > 0) == y[test]).mean()
    assert accuracy >= 0.95, accuracy


def test_frame_features_see_colour_and_size() -> None:
    base = [("circle", "red", "small", 0.5, 0.5)]
    frames = {
        name: tw.frame_features(tw.render_clip(_make(objs, [("grow", 0, 0, 7)]), 64))
        for name, objs in {"red": base, "blue": [("circle", "blue", "small", 0.5, 0.5)]}.items()
    }
    red, blue = frames["red"].astype(np.float64), frames["blue"].astype(np.float64)
    assert np.abs(red[0] - blue[0]).max() > 0.05  # colour
    assert np.linalg.norm(red[-1]) > 1.5 * np.linalg.norm(red[0])  # a larger object adds more
    empty = tw.frame_features(np.full((2, 64, 64, 3), tw.BACKGROUND, np.uint8))
    assert np.abs(empty.astype(np.float64)).max() == 0.0
    with pytest.raises(ValueError, match="multiple of 16"):
        tw.frame_features(np.zeros((2, 40, 40, 3), np.uint8))


# ---------------------------------------------------------------------------------------------
# Video QA


def test_video_qa_answers_follow_from_the_clip(world: tuple[Path, dict]) -> None:
    root, manifest = world
    paths = [p for split in tw.SPLITS for p in manifest["shards"]["video_qa"][split]]
    samples = _read(root, paths)
    by_clip: dict[str, list[dict]] = {}
    for s in samples:
        by_clip.setdefault(json.loads(s["json"])["video_id"], []).append(s)
    assert len(by_clip) == sum(SMALL[f"n_{s}"] for s in tw.SPLITS)
    for key, qs in by_clip.items():
        split, index = _split_index(key)
        clip = tw.sample_clip(5, split, index)
        assert 2 <= len(qs) <= 3
        np.testing.assert_array_equal(_decode(qs[0]["mp4"]).shape, (8, 64, 64, 3))
        for s in qs:
            q = json.loads(s["json"])
            assert s["__key__"] == str(q["question_id"]) and q["question_id"] // 10 == index
            assert q["language"] == "en" and len(q["answers"]) == 10
            assert q["answers"].count(q["multiple_choice_answer"]) >= 6
            assert q["multiple_choice_answer"] == _truth(q["question"], clip)
            assert q["answer_type"] in tw.ANSWER_TYPES


def _truth(question: str, clip: tw.Clip) -> str:
    """The answer, read off the object states (not the events' names)."""
    names = {f"{o.color} {o.shape}": i for i, o in enumerate(clip.scene.objects)}
    states = tw.object_states(clip)

    def track(name: str) -> list:
        return [row[names[name]] for row in states]

    def changes(name: str) -> int | None:
        t = track(name)
        return next((k for k in range(1, len(t)) if t[k] != t[k - 1]), None)

    if question.startswith("Which way does the "):
        t = track(question.removeprefix("Which way does the ").removesuffix(" move?"))
        dx, dy = t[-1].x - t[0].x, t[-1].y - t[0].y
        if abs(dx) > abs(dy):
            return "right" if dx > 0 else "left"
        return "down" if dy > 0 else "up"
    if question.startswith("What happens to the "):
        t = track(question.removeprefix("What happens to the ").removesuffix("?"))
        if t[0] is None or t[-1] is None:
            return "appears" if t[0] is None else "disappears"
        if (t[0].x, t[0].y) != (t[-1].x, t[-1].y):
            return "moves"
        return "grows" if t[-1].r > t[0].r else "shrinks" if t[-1].r < t[0].r else "nothing"
    if question.startswith("Does the "):
        a, b = question.removeprefix("Does the ").removesuffix("?").split(" change before the ")
        return "yes" if changes(a) < changes(b) else "no"
    assert question.startswith("How many shapes are there at the ")
    row = states[0] if question.endswith("start?") else states[-1]
    return str(sum(o is not None for o in row))


def test_video_question_kinds_all_occur() -> None:
    kinds: dict[str, set[str]] = {}
    for clip in _clips(300):
        for q in tw.video_questions(clip):
            kinds.setdefault(q.question_type, set()).add(q.answer)
    assert set(kinds) == {"which way does the", "what happens to the", "does the", "how many"}
    assert kinds["which way does the"] == {"left", "right", "up", "down"}
    assert kinds["what happens to the"] == {
        "moves", "grows", "shrinks", "appears", "disappears", "nothing"
    }  # fmt: skip
    assert kinds["does the"] == {"yes", "no"}


# ---------------------------------------------------------------------------------------------
# generate(): determinism, opt-in views, manifest merge


def test_video_shards_are_reproducible(world: tuple[Path, dict], tmp_path: Path) -> None:
    root, manifest = world
    tw.generate(tmp_path, seed=5, languages=LANGS, views=VIDEO, **{**SMALL, "n_train": 13})
    first, again = _hashes(root), _hashes(tmp_path)
    for view in VIDEO:
        for split in ("val", "test"):  # val/test do not depend on n_train
            for path in manifest["shards"][view][split]:
                assert first[path] == again[path]
    for view in ("video", "video_features"):  # the first 10 clips, again
        assert first[f"{view}/train-000000.tar"] == again[f"{view}/train-000000.tar"]
        assert first[f"{view}/train-000001.tar"] != again[f"{view}/train-000001.tar"]


def test_manifest_of_the_video_views(world: tuple[Path, dict]) -> None:
    root, manifest = world
    assert json.loads((root / "manifest.json").read_text("utf-8")) == manifest
    assert list(manifest["shards"]) == list(VIDEO)
    for split in tw.SPLITS:
        n = SMALL[f"n_{split}"]
        assert manifest["samples"]["video"][split] == n
        assert manifest["samples"]["video_features"][split] == n
        qa = sum(len(tw.video_questions(tw.sample_clip(5, split, i))) for i in range(n))
        assert manifest["samples"]["video_qa"][split] == qa
    assert manifest["video"]["frames"] == 8 and manifest["video"]["feature_dim"] == 256


def test_views_merge_into_the_manifest(tmp_path: Path) -> None:
    args = {"n_train": 4, "n_val": 2, "n_test": 2, "languages": ("en", "ru"), "shard_size": 3}
    first = tw.generate(tmp_path, **args)
    assert list(first["shards"]) == list(tw.VIEWS) and "video" not in first
    images = _hashes(tmp_path)
    both = tw.generate(tmp_path, views=("video",), **args)
    assert list(both["shards"]) == [*tw.VIEWS, "video"]
    assert {k: both["shards"][k] for k in tw.VIEWS} == first["shards"]
    assert all(_hashes(tmp_path)[p] == h for p, h in images.items())  # untouched
    again = tw.generate(tmp_path, **args)
    assert again == both  # the default views again: the video view stays listed
    other = tw.generate(tmp_path, views=("video_qa",), **{**args, "n_train": 5})
    assert list(other["shards"]) == ["video_qa"]  # other settings: the rest is another data set


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"views": ("video", "nope")}, "nope"),
        ({"views": ()}, "view"),
        ({"views": ("video", "video")}, "repeat"),
        ({"views": ("video",), "image_size": 40}, "multiple of 16"),
    ],
)
def test_bad_views(tmp_path: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tw.generate(tmp_path, n_train=2, n_val=0, n_test=0, **kwargs)
    assert not (tmp_path / "manifest.json").exists()


def test_cli_views(tmp_path: Path) -> None:
    out = tmp_path / "tw"
    common = ["data", "toyworld", "--out", str(out), "--n-train", "3", "--n-val", "1",
              "--n-test", "1", "--languages", "en"]  # fmt: skip
    assert cli_main([*common, "--views", "video_qa,video_features"]) == 0
    manifest = json.loads((out / "manifest.json").read_text("utf-8"))
    assert list(manifest["shards"]) == ["video_features", "video_qa"]
    assert cli_main([*common, "--views", "default,video"]) == 0
    manifest = json.loads((out / "manifest.json").read_text("utf-8"))
    assert list(manifest["shards"]) == [*tw.VIEWS, *tw.VIDEO_VIEWS]
    assert cli_main([*common, "--views", "vidoe"]) == 2
