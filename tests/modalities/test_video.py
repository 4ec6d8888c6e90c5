"""The video plug-in: which frames a clip gives (train / eval, segments, stride, fps), that
decoding stops early and jumps on long clips, resizing, padding, images as 1-frame clips,
bad clips, and the plug-in inside the real pipeline with loader workers.

Clips come from :func:`encode_video`; each frame shows its own index as 12 bits (a 4×4 grid
of black/white cells, the last 4 cells always white as a check), so which frames were
taken is read off the pixels, independently of the code under test.
"""

from __future__ import annotations

import io
import random
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from mmptm.data.decode import Decoder
from mmptm.data.pipeline import Loader, stream_config
from mmptm.data.shards import ShardWriter
from mmptm.modalities import DataContext, Need, build_modalities
from mmptm.modalities.image import random_resized_crop
from mmptm.modalities.regions import regions_npz_bytes
from mmptm.modalities.video import DecodeStats, VideoData, clip_times, decode_clip, encode_video
from mmptm.recipe import DataConfig

SIDE = 64  # px; cells of 16 px survive x264 and a resize to 32 px
MEAN, STD = [0.5, 0.5, 0.5], [0.25, 0.25, 0.25]


def index_frames(n: int, side: int = SIDE) -> np.ndarray:
    """uint8 [n,side,side,3]: frame i shows i in binary (cells 0..11) and 4 white cells."""
    cell = side // 4
    out = np.zeros((n, side, side, 3), np.uint8)
    for i in range(n):
        bits = [(i >> b) & 1 for b in range(12)] + [1, 1, 1, 1]
        for c, bit in enumerate(bits):
            r, q = divmod(c, 4)
            out[i, r * cell : (r + 1) * cell, q * cell : (q + 1) * cell] = 255 * bit
    return out


def read_index(frame_HWC: np.ndarray) -> int:
    """The index a decoded frame shows (asserts the check cells are white)."""
    side = frame_HWC.shape[0]
    cell = side // 4
    gray = frame_HWC.astype(np.float32).mean(axis=-1)
    means = [gray[r * cell + cell // 4 : (r + 1) * cell - cell // 4,
                  q * cell + cell // 4 : (q + 1) * cell - cell // 4].mean()
             for r in range(4) for q in range(4)]  # fmt: skip
    assert all(m > 200 for m in means[12:]), means
    return sum(1 << b for b in range(12) if means[b] > 128)


def indices(frames_THWC: np.ndarray) -> list[int]:
    return [read_index(f) for f in frames_THWC]


def denormalise(x_TCHW: torch.Tensor) -> np.ndarray:
    """Normalised frames back to uint8 [T,H,W,3]."""
    x = x_TCHW * torch.tensor(STD).view(3, 1, 1) + torch.tensor(MEAN).view(3, 1, 1)
    return (x.clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).numpy()


def plugin(view: str = "video", needs=None, **cfg) -> VideoData:
    settings = VideoData.Config(**{"size": SIDE, "mean": MEAN, "std": STD, **cfg})
    return VideoData(settings, views=[view], context=DataContext(needs=needs or {}))


@pytest.fixture(scope="module")
def clips() -> dict[str, bytes]:
    """16 frames at 8 fps in each container; 17 frames at 10 fps; 3 frames."""
    frames = index_frames(17)
    out = {c: encode_video(frames[:16], 8.0, c) for c in ("mp4", "webm", "mkv")}
    out["17"] = encode_video(frames, 10.0, "mp4")
    out["3"] = encode_video(frames[:3], 8.0, "mp4")
    return out


# -- which frames ------------------------------------------------------------------------------


@pytest.mark.parametrize("container", ["mp4", "webm", "mkv"])
def test_evaluation_takes_the_centre_frame_of_each_segment(clips, container):
    x = plugin(frames=8).read({container: clips[container]}, None)
    assert x.shape == (8, SIDE, SIDE, 3) and x.dtype == np.uint8
    assert indices(x) == [int((k + 0.5) * 16 / 8) for k in range(8)]  # 1, 3, ..., 15


@pytest.mark.parametrize("container", ["mp4", "webm"])
def test_training_takes_a_seeded_random_frame_of_each_segment(clips, container):
    p = plugin(frames=4)  # segments of 4 frames
    drawn = [
        tuple(indices(p.read({container: clips[container]}, random.Random(s)))) for s in range(6)
    ]
    for idx in drawn:
        assert [i // 4 for i in idx] == [0, 1, 2, 3]  # one frame in each segment
    assert len(set(drawn)) > 1  # the offsets are random...
    again = indices(p.read({container: clips[container]}, random.Random(3)))
    assert tuple(again) == drawn[3]  # ...and seeded


def test_stride_and_fps_take_a_centred_window_when_evaluating(clips):
    # 17 frames: a window of 4 frames 2 apart spans 7, leaving 10 → starts at frame 5
    assert indices(plugin(frames=4, stride=2).read({"mp4": clips["17"]}, None)) == [5, 7, 9, 11]
    # 5 fps from a 10 fps clip is every 2nd frame too
    assert indices(plugin(frames=4, fps=5.0).read({"mp4": clips["17"]}, None)) == [5, 7, 9, 11]


def test_stride_and_fps_windows_move_when_training(clips):
    for cfg in ({"stride": 3}, {"fps": 10 / 3}):
        starts = set()
        for seed in range(8):
            idx = indices(plugin(frames=4, **cfg).read({"mp4": clips["17"]}, random.Random(seed)))
            assert np.diff(idx).tolist() == [3, 3, 3] and 0 <= idx[0] and idx[-1] <= 16
            starts.add(idx[0])
        assert len(starts) > 1


def test_clip_times_never_ask_past_the_last_frame():
    for n in range(1, 40):
        for kw in ({}, {"stride": 3}, {"fps": 7.0}, {"fps": 30.0}):
            for rng in (None, random.Random(n)):
                times = clip_times(n, 10.0, 8, rng=rng, **kw)
                assert 1 <= len(times) <= 8 and times == sorted(times)
                assert 0 <= times[0] and times[-1] <= (n - 1) / 10 + 0.05


# -- padding, images, resizing ----------------------------------------------------------------


def test_a_short_clip_is_padded_with_zero_frames_and_masked(clips):
    p = plugin(frames=8)
    short = p.decode({"__key__": "a", "mp4": clips["3"]}, {}, None)["frames"]
    full = p.decode({"__key__": "b", "mp4": clips["mp4"]}, {}, None)["frames"]
    assert indices(denormalise(short)) == [0, 1, 2]
    batch = p.collate([{"frames": short}, {"frames": full}])
    assert batch["frames"].shape == (2, 8, 3, SIDE, SIDE)
    assert batch["frames_mask"].tolist() == [[True] * 3 + [False] * 5, [True] * 8]
    assert not batch["frames"][0, 3:].any()  # padding is 0
    torch.testing.assert_close(batch["frames"][0, :3], short)


def test_an_image_is_a_one_frame_clip_and_batches_with_clips(clips):
    buf = io.BytesIO()
    Image.new("RGB", (80, 40), (10, 200, 30)).save(buf, format="PNG")
    p = plugin(frames=8, size=16)
    x = p.decode({"png": buf.getvalue()}, {}, None)["frames"]
    assert x.shape == (1, 3, 16, 16)
    want = (torch.tensor([10, 200, 30]) / 255.0 - 0.5) / 0.25  # a flat colour stays flat
    torch.testing.assert_close(x.mean(dim=(0, 2, 3)), want, atol=0.02, rtol=0)
    clip = p.decode({"mp4": clips["mp4"]}, {}, None)["frames"]
    batch = p.collate([{"frames": x}, {"frames": clip}])
    assert batch["frames_mask"][0].tolist() == [True] + [False] * 7
    with pytest.raises(ValueError, match=r"no video member \(one of .*mp4.*\); has \['png'\]"):
        plugin(images=False).decode({"png": buf.getvalue()}, {}, None)


def test_frames_are_resized_by_the_short_side_and_centre_cropped():
    # 32 high, 96 wide: thirds red | green | blue → size 16 keeps only the green middle
    frame = np.zeros((2, 32, 96, 3), np.uint8)
    frame[:, :, :32, 0] = frame[:, :, 32:64, 1] = frame[:, :, 64:, 2] = 255
    clip = encode_video(frame, 8.0, "mp4")
    x = decode_clip(clip, lambda n, r: [0.0], size=16)
    assert x.shape == (1, 16, 16, 3)
    mean = x.reshape(-1, 3).mean(0)
    assert mean[1] > 230 and mean[0] < 25 and mean[2] < 25, mean
    buf = io.BytesIO()
    Image.fromarray(frame[0]).save(buf, format="PNG")  # an image: the same geometry
    y = plugin(size=16).read({"png": buf.getvalue()}, None)[0]
    assert np.abs(y.astype(int) - x[0].astype(int)).mean() < 8


def test_crop_augmentation_cuts_the_same_box_from_every_frame(clips):
    p = plugin(frames=8, crop_scale=[0.2, 0.5])
    item = p.decode({"mp4": clips["mp4"]}, {}, None)
    x_TCHW = item["frames"]
    out = p.augment(dict(item), random.Random(5))["frames"]
    assert out.shape == x_TCHW.shape and not torch.equal(out, x_TCHW)
    for t in range(8):  # frame by frame with the same draw: the same box on each
        alone = random_resized_crop(x_TCHW[t : t + 1], [0.2, 0.5], "bicubic", random.Random(5))
        torch.testing.assert_close(out[t : t + 1], alone)
    assert torch.equal(plugin().augment(dict(item), random.Random(5))["frames"], x_TCHW)


def test_another_view_name_prefixes_the_keys(clips):
    p = plugin(view="clip")
    item = p.decode({"mp4": clips["3"]}, {}, None)
    assert set(item) == {"clip_frames"}
    assert set(p.collate([item])) == {"clip_frames", "clip_frames_mask"} == set(p.view_keys("clip"))


# -- long clips: decode only what is needed ---------------------------------------------------


@pytest.fixture(scope="module")
def long_clip() -> bytes:
    """60 s at 30 fps (1800 frames), a key frame every second."""
    return encode_video(index_frames(1800, side=32), 30.0, "mp4", quality=23, options={"g": "30"})


def test_a_long_clip_decodes_a_few_groups_of_pictures_not_the_whole_clip(long_clip):
    for rng in (None, random.Random(0)):
        stats = DecodeStats()
        times = lambda n, r, rng=rng: clip_times(n, r, 8, rng=rng)  # noqa: E731
        x = decode_clip(long_clip, times, size=32, stats=stats)
        want = [
            round(t * 30) for t in clip_times(1800, 30.0, 8, rng=random.Random(0) if rng else None)
        ]
        assert indices(x) == want
        # each target costs at most its group of pictures (30 frames) plus decoder delay
        assert stats.decoded <= 8 * 32, stats
        assert stats.seeks >= 4 and stats.packets < 1800 // 3, stats


def test_a_window_at_the_start_stops_demultiplexing_after_it(long_clip):
    stats = DecodeStats()
    x = decode_clip(long_clip, lambda n, r: [k / 30 for k in range(40, 48)], size=32, stats=stats)
    assert indices(x) == list(range(40, 48))
    assert stats.packets < 70 and stats.decoded < 40, stats  # the 2nd second only


def test_default_x264_groups_of_250_frames_still_give_the_right_frames():
    clip = encode_video(index_frames(600, side=32), 30.0, "mp4", quality=23)  # 20 s
    times = lambda n, r: clip_times(n, r, 8, rng=random.Random(1))  # noqa: E731
    x = decode_clip(clip, times, size=32)
    assert indices(x) == [round(t * 30) for t in clip_times(600, 30.0, 8, rng=random.Random(1))]


# -- bad clips ---------------------------------------------------------------------------------


def test_bad_clips_raise_value_errors_that_name_the_member(clips):
    p = plugin()
    mp4, webm = clips["mp4"], clips["webm"]
    cases = {
        "empty": {"mp4": b""},
        "garbage": {"mp4": b"not a video at all" * 10},
        "truncated mp4": {"mp4": mp4[: len(mp4) // 2]},  # the index (moov) is at the end
        "truncated webm": {"webm": webm[: int(len(webm) * 0.4)]},  # decodes, but too short
        "cut header": {"mkv": clips["mkv"][:40]},
    }
    for name, sample in cases.items():
        with pytest.raises(ValueError, match=r"^(mp4|webm|mkv): ") as e:
            p.read(sample, None)
        assert "\n" not in str(e.value), name


def test_no_video_stream_and_size_and_duration_guards(clips):
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as out:  # audio only
        stream = out.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(
            np.zeros((1, 800), np.int16), format="s16", layout="mono"
        )
        frame.sample_rate = 8000
        for packet in [*stream.encode(frame), *stream.encode()]:
            out.mux(packet)
    with pytest.raises(ValueError, match="mkv: no video stream"):
        plugin().read({"mkv": buf.getvalue()}, None)
    with pytest.raises(ValueError, match="frame size 64x64 is not within 1..32"):
        plugin(max_side=32).read({"mp4": clips["mp4"]}, None)
    with pytest.raises(ValueError, match="clip lasts 2 s, over max_duration_s=1"):
        plugin(max_duration_s=1).read({"mp4": clips["mp4"]}, None)
    with pytest.raises(ValueError, match="png: cannot decode the image"):
        plugin().read({"png": b"\x89PNG\r\n\x1a\n broken"}, None)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="set fps .* or stride .*, not both"):
        plugin(fps=2.0, stride=2)
    with pytest.raises(ValueError, match="frames must be >= 1"):
        plugin(frames=0)
    with pytest.raises(ValueError, match="video frame size"):
        plugin(size=0)


def test_importing_the_module_does_not_import_av():
    code = "import sys, mmptm.modalities.video; print('av' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- in the pipeline ---------------------------------------------------------------------------


def test_video_image_and_regions_plug_ins_read_one_sample_together(clips):
    buf = io.BytesIO()
    Image.new("RGB", (20, 20), (255, 0, 0)).save(buf, format="JPEG")
    needs = {
        "image": Need("image", {"size": 16, "mean": MEAN, "std": STD}),
        "video": Need("video", {"size": 32, "mean": MEAN, "std": STD}),
        "regions": Need("regions"),
    }
    modalities = build_modalities(needs, {"video": {"type": "video", "frames": 4}}, DataContext())
    regions = regions_npz_bytes({"features": np.ones((2, 5)), "boxes": np.full((2, 4), 0.5),
                                 "image_size": [20, 20]})  # fmt: skip
    sample = {"__key__": "k", "jpg": buf.getvalue(), "mp4": clips["mp4"], "regions.npz": regions}
    out = Decoder(modalities, train=False)(sample)
    assert out["pixels"].shape == (3, 16, 16) and out["frames"].shape == (4, 3, 32, 32)
    assert out["region_feats"].shape == (2, 5)


def _video_shards(tmp_path, clips, corrupt_at: int) -> list[str]:
    with ShardWriter(str(tmp_path / "v-%06d.tar"), 4) as w:
        for i in range(9):
            clip = clips["mp4"] if i != corrupt_at else clips["mp4"][:300]
            w.write({"__key__": f"k{i}", "mp4": clip, "txt": f"clip {i}"})
    return w.shards


@pytest.mark.parametrize("workers", [0, 2])
def test_a_corrupt_clip_is_skipped_and_counted_and_the_others_all_arrive(tmp_path, clips, workers):
    urls = _video_shards(tmp_path, clips, corrupt_at=5)
    needs = {"video": Need("video", {"size": 32, "mean": MEAN, "std": STD})}
    cfg = DataConfig(
        train=",".join(urls), batch_size=2, modalities={"video": {"type": "video", "frames": 4}}
    )
    cfg = stream_config(cfg, None, needs=needs)
    sc = replace(cfg, shuffle=False, shuffle_buffer=1, drop_last=False)
    loader = Loader(sc, num_workers=workers)
    batches = list(loader._epoch_batches())
    keys = sorted(k for b in batches for k in b["__key__"])
    assert keys == sorted(f"k{i}" for i in range(9) if i != 5)
    assert loader.skipped == 1
    for b in batches:
        assert b["frames"].shape[1:] == (4, 3, 32, 32) and b["frames_mask"].all()
        first = denormalise(b["frames"][0])
        assert [i // 4 for i in indices(first)] == [0, 1, 2, 3]  # a frame per segment
