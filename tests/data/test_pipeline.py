"""The data pipeline's stages: shard resolution, skip-and-count, splitting, batching, resume."""

from __future__ import annotations

import collections
import copy
import io
import json
import logging
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from PIL import Image

from mmptm.config import from_dict
from mmptm.data.decode import Collate
from mmptm.data.pipeline import (
    DataError,
    DataState,
    Loader,
    ShardStream,
    batched,
    expand_shards,
    mixture,
    shard_order,
    shuffle_buffer,
    split_round_robin,
    stream_config,
)
from mmptm.data.shards import ShardWriter
from mmptm.encoders.base import VocabInfo
from mmptm.modalities import DataContext, Need
from mmptm.modalities.text import TextData
from mmptm.models.pretrain import data_transforms
from mmptm.recipe import DataConfig, ModelConfig, SourceConfig


def _jpg(color=(200, 30, 30), size=16) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), color).save(buf, format="JPEG")
    return buf.getvalue()


def _sample(key: str, caption: str = "a red circle") -> dict:
    return {
        "__key__": key,
        "jpg": _jpg(),
        "txt": caption,
        "json": {"captions": {"en": caption, "de": "ein roter Kreis"}},
    }


def _write(path_pattern: Path, samples: list[dict], per_shard: int) -> list[str]:
    with ShardWriter(str(path_pattern), per_shard) as w:
        for s in samples:
            w.write(s)
    return list(w.shards)


#: what an image encoder of input size 16 and a text encoder declare
NEEDS = {
    "image": Need("image", {"size": 16, "mean": [0.5] * 3, "std": [0.5] * 3}),
    "text": Need("text"),
}


def _stream(urls, tokenizer, **kw):
    cfg = DataConfig(train=",".join(urls), batch_size=kw.pop("batch_size", 4))
    sc = stream_config(cfg, tokenizer, split="train", needs=NEEDS, seed=kw.pop("seed", 0))
    return replace(sc, **kw)


def _keys(batches) -> list[str]:
    return [k for b in batches if "__key__" in b for k in b["__key__"]]


# -- shard lists ------------------------------------------------------------------------------


def test_expand_shards_glob_brace_dir_and_comma(tmp_path):
    for i in range(3):
        (tmp_path / f"s-{i:06d}.tar").write_bytes(b"")
    (tmp_path / "other.txt").write_text("x")
    expected = [str(tmp_path / f"s-{i:06d}.tar") for i in range(3)]
    assert expand_shards(str(tmp_path / "s-*.tar")) == expected
    assert expand_shards(str(tmp_path / "s-{000000..000002}.tar")) == expected
    assert expand_shards(str(tmp_path)) == expected
    assert expand_shards(f"{expected[2]},{expected[0]}") == [expected[2], expected[0]]


def test_expand_shards_errors_name_the_missing_shard(tmp_path):
    (tmp_path / "s-000008.tar").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="s-000009.tar"):
        expand_shards(str(tmp_path / "s-{000008..000009}.tar"))
    with pytest.raises(FileNotFoundError, match=r"nothing-\*\.tar"):
        expand_shards(str(tmp_path / "nothing-*.tar"))
    with pytest.raises(ValueError, match="no shards"):
        expand_shards("")


def test_shard_order_is_a_seeded_per_epoch_permutation():
    urls = [f"u{i:02d}" for i in range(20)]
    e0, e1 = shard_order(urls, 0, 0), shard_order(urls, 0, 1)
    assert sorted(e0) == urls and sorted(e1) == urls
    assert e0 != e1  # reshuffled each epoch
    assert e0 == shard_order(urls, 0, 0)  # deterministic
    assert shard_order(urls, 1, 0) != e0
    assert shard_order(urls, 0, 0, shuffle=False) == urls


def test_split_round_robin_partitions():
    items = list(range(23))
    parts = [list(split_round_robin(items, i, 4)) for i in range(4)]
    assert sorted(i for part in parts for i in part) == items
    assert all(set(a).isdisjoint(b) for i, a in enumerate(parts) for b in parts[i + 1 :])


def test_shuffle_buffer_permutes_and_is_seeded():
    import random

    out = list(shuffle_buffer(range(100), 10, random.Random(0)))
    assert sorted(out) == list(range(100)) and out != list(range(100))
    assert out == list(shuffle_buffer(range(100), 10, random.Random(0)))
    assert list(shuffle_buffer(range(5), 1, random.Random(0))) == list(range(5))


def test_batched_drop_last():
    assert [len(b) for b in batched(range(10), 4, drop_last=False)] == [4, 4, 2]
    assert [len(b) for b in batched(range(10), 4, drop_last=True)] == [4, 4]


def test_collate_pads_to_longest_in_batch():
    samples = [
        {"__key__": "a", "input_ids": [2, 7, 8, 3], "lang": "de"},
        {"__key__": "b", "input_ids": [2, 9, 3], "lang": "en"},
    ]
    tok = type("Tok", (), {"pad_id": 0, "languages": ["en", "de"]})()
    text = TextData(TextData.Config(), views=["text"], context=DataContext(tokenizer=tok))
    b = Collate([text])(samples)
    assert b["input_ids"].tolist() == [[2, 7, 8, 3], [2, 9, 3, 0]]
    assert b["attention_mask"].tolist() == [[True] * 4, [True, True, True, False]]
    assert b["lang_ids"].tolist() == [[1] * 4, [0] * 4]
    assert b["__key__"] == ["a", "b"]


# -- bad input --------------------------------------------------------------------------------


def test_corrupt_samples_are_skipped_and_counted(tmp_path, tiny_tokenizer, caplog):
    good = [_sample(f"good{i}") for i in range(7)]
    truncated = _sample("trunc")
    truncated["jpg"] = truncated["jpg"][: len(truncated["jpg"]) // 2]
    bad_json = _sample("badjson")
    bad_json["json"] = b"{not json"
    no_image = _sample("noimg")
    del no_image["jpg"]
    samples = [*good[:3], truncated, *good[3:5], bad_json, no_image, *good[5:]]
    urls = _write(tmp_path / "s-%06d.tar", samples, per_shard=100)
    sc = _stream(urls, tiny_tokenizer, shuffle=False, shuffle_buffer=1, drop_last=False)
    with caplog.at_level(logging.WARNING):
        loader = Loader(sc, num_workers=0)
        batches = list(loader._epoch_batches())
    assert _keys(batches) == [s["__key__"] for s in good]  # nothing good was lost
    assert loader.skipped == 3
    log = caplog.text
    for key in ("trunc", "badjson", "noimg"):
        assert key in log
    assert urls[0] in log  # the file is named too


def test_truncated_shard_keeps_the_samples_before_the_cut(tmp_path, tiny_tokenizer):
    urls = _write(tmp_path / "s-%06d.tar", [_sample(f"k{i}") for i in range(6)], per_shard=100)
    data = Path(urls[0]).read_bytes()
    Path(urls[0]).write_bytes(data[: int(len(data) * 0.6)])
    sc = _stream(urls, tiny_tokenizer, shuffle=False, shuffle_buffer=1, drop_last=False)
    loader = Loader(sc, num_workers=0)
    keys = _keys(loader._epoch_batches())
    assert 0 < len(keys) < 6 and keys == [f"k{i}" for i in range(len(keys))]
    assert loader.skipped >= 1  # the broken tail is reported, not silently dropped


# -- splitting across ranks and workers -------------------------------------------------------


@pytest.mark.parametrize("n_shards", [8, 3])  # enough shards to split them / fewer than readers
def test_each_sample_is_read_by_exactly_one_rank_and_worker(tmp_path, tiny_tokenizer, n_shards):
    samples = [_sample(f"k{i:03d}") for i in range(48)]
    urls = _write(tmp_path / "s-%06d.tar", samples, per_shard=48 // n_shards)
    seen: list[list[str]] = []
    for rank in range(2):
        sc = _stream(urls, tiny_tokenizer, rank=rank, world=2, drop_last=False, batch_size=3)
        seen.append(_keys(Loader(sc, num_workers=2)._epoch_batches()))
    assert set(seen[0]).isdisjoint(seen[1])
    assert sorted(seen[0] + seen[1]) == sorted(s["__key__"] for s in samples)


def _text_shards(folder: Path, sizes: list[int]) -> list[str]:
    """Shards of text-only samples ``s<shard>_<i>``, of the given sizes (fast to read)."""
    urls = []
    for n, size in enumerate(sizes):
        path = folder / f"t{n:03d}-%06d.tar"
        samples = [{"__key__": f"s{n}_{i}", "txt": "x"} for i in range(size)]
        urls += _write(path, samples, per_shard=max(size, 1))
    return urls


@pytest.mark.parametrize(
    "sizes, world, workers",
    [([16] * 3, 2, 1), ([16] * 3, 2, 2), ([16], 2, 2), ([16] * 5, 4, 1), ([16] * 7, 2, 3),
     ([20, 4, 12], 2, 2), ([5] * 9, 3, 2), ([3, 1], 3, 1)],
)  # fmt: skip
def test_every_sample_is_read_once_and_ranks_get_equal_shares(tmp_path, sizes, world, workers):
    from mmptm.data.pipeline import reader_samples
    from mmptm.data.shards import SkipCounter

    urls = _text_shards(tmp_path, sizes)
    per_rank = []
    for rank in range(world):
        keys = [s["__key__"] for w in range(workers)
                for s in reader_samples(urls, rank, world, w, workers, SkipCounter())]  # fmt: skip
        per_rank.append(keys)
    every = [k for keys in per_rank for k in keys]
    assert sorted(every) == sorted(f"s{n}_{i}" for n, size in enumerate(sizes) for i in range(size))
    # each rank owns len // world whole shards (equal when the shards are) and a 1/world
    # share of the rest, so equal-sized shards give shares within one sample per shared shard
    if len(set(sizes)) == 1:
        counts = [len(keys) for keys in per_rank]
        assert max(counts) - min(counts) <= len(sizes) % world, counts


def test_workers_sharing_few_shards_take_whole_batches(tmp_path):
    from mmptm.data.pipeline import reader_samples
    from mmptm.data.shards import SkipCounter

    urls = _text_shards(tmp_path, [16])  # one shard: 8 samples per rank, one batch of 8
    for rank in range(2):
        shares = [
            [s["__key__"] for s in reader_samples(urls, rank, 2, w, 2, SkipCounter(), block=8)]
            for w in range(2)
        ]
        assert sorted(len(keys) for keys in shares) == [0, 8]


def test_a_corrupt_shard_read_by_every_rank_is_counted_once(tmp_path):
    from mmptm.data.pipeline import reader_samples
    from mmptm.data.shards import SkipCounter

    urls = _text_shards(tmp_path, [8, 8, 8])
    Path(urls[2]).write_bytes(Path(urls[2]).read_bytes()[:700])  # the shared one, truncated
    counters = [SkipCounter() for _ in range(4)]
    for rank in range(2):
        for w in range(2):
            list(reader_samples(urls, rank, 2, w, 2, counters[rank * 2 + w]))
    assert sum(c.count for c in counters) == 1


class _Ranks:
    """In-process stand-in for the all-gather of the ranks' statuses: threads as ranks."""

    def __init__(self, world: int) -> None:
        import threading

        self.barrier = threading.Barrier(world, timeout=60)
        self.statuses: list[int] = [0] * world

    def agree(self, rank: int):
        def gather(status: int) -> list[int]:
            self.statuses[rank] = status
            self.barrier.wait()
            out = list(self.statuses)
            self.barrier.wait()
            return out

        return gather


def _run_ranks(urls, tokenizer, world: int, steps: int, batch_size: int = 4):
    """Each rank's (epoch, keys) per batch over ``steps`` batches, ranks in lock step."""
    import threading

    ranks = _Ranks(world)
    seen: list[list] = [[] for _ in range(world)]
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        sc = _stream(urls, tokenizer, rank=rank, world=world, batch_size=batch_size)
        loader = Loader(sc, 0, agree=ranks.agree(rank))
        try:
            for _, batch in zip(range(steps), loader):
                seen[rank].append((loader.state.epoch, batch["__key__"]))
        except BaseException as e:
            errors.append(e)
            ranks.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return seen


@pytest.mark.parametrize("sizes", [[12, 12, 12], [20, 4], [12]])
def test_ranks_end_each_epoch_together_without_duplicates(tmp_path, tiny_tokenizer, sizes):
    samples = [_sample(f"k{i:03d}") for i in range(sum(sizes))]
    urls, start = [], 0
    for n, size in enumerate(sizes):
        urls += _write(tmp_path / f"s{n}-%06d.tar", samples[start : start + size], size)
        start += size
    seen = _run_ranks(urls, tiny_tokenizer, world=2, steps=12)
    assert len(seen[0]) == len(seen[1]) == 12
    epochs = [e for e, _ in seen[0]]
    assert epochs == [e for e, _ in seen[1]]  # the ranks are in the same epoch at every step
    assert epochs[-1] >= 2
    for epoch in set(epochs):
        keys = [k for rank in seen for e, batch in rank if e == epoch for k in batch]
        assert len(keys) == len(set(keys)), f"epoch {epoch}: a sample was read twice"


def test_a_rank_without_a_batch_stops_every_rank_with_one_error(tmp_path, tiny_tokenizer):
    urls = _write(tmp_path / "s-%06d.tar", [_sample(f"k{i}") for i in range(6)], per_shard=3)
    with pytest.raises(DataError, match=r"epoch 0 gave ranks \[0, 1\] no batch: too few"):
        _run_ranks(urls, tiny_tokenizer, world=2, steps=2, batch_size=4)


def test_resampled_stream_is_endless_and_seeded(tmp_path, tiny_tokenizer):
    urls = _write(tmp_path / "s-%06d.tar", [_sample(f"k{i}") for i in range(8)], per_shard=4)
    sc = _stream(urls, tiny_tokenizer, resampled=True, batch_size=4)
    first = [b["__key__"] for _, b in zip(range(6), ShardStream(sc, epoch=0))]
    again = [b["__key__"] for _, b in zip(range(6), ShardStream(sc, epoch=0))]
    assert len(first) == 6 and first == again  # 24 samples out of 8: shards were redrawn


# -- exact resume -----------------------------------------------------------------------------


def _mlm_transforms(tokenizer):
    cfg = from_dict(
        ModelConfig,
        {"encoders": {"text": {"type": "text"}}, "objectives": {"mlm": {"type": "mlm"}}},
    )
    return data_transforms(cfg, VocabInfo.from_tokenizer(tokenizer))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop_after", [3, 7])  # mid-epoch, and right at an epoch boundary
def test_loader_resumes_at_the_same_data_position(tiny_world, tiny_tokenizer, workers, stop_after):
    urls = expand_shards(str(tiny_world / "image_text" / "train-*.tar"))  # 6 shards x 16
    sc = _stream(urls, tiny_tokenizer, batch_size=12, shuffle_buffer=10)
    sc = replace(sc, transforms=_mlm_transforms(tiny_tokenizer))
    loader = Loader(sc, workers)
    it = iter(loader)
    head = [next(it) for _ in range(stop_after)]
    saved = copy.deepcopy(asdict(loader.state))
    reference = [next(it) for _ in range(8)]
    resumed_loader = Loader(sc, workers, DataState(**json.loads(json.dumps(saved))))
    resumed = [b for _, b in zip(range(8), resumed_loader)]
    assert head  # the first run did consume batches before the save
    for a, b in zip(reference, resumed, strict=True):
        assert a["__key__"] == b["__key__"]
        torch.testing.assert_close(a["input_ids"], b["input_ids"])  # same dynamic masking
        torch.testing.assert_close(a["mlm_labels"], b["mlm_labels"])
        torch.testing.assert_close(a["pixels"], b["pixels"])


def test_next_epoch_starts_early_and_changes_no_batch(tiny_world, tiny_tokenizer):
    """The next epoch's workers start while the current epoch still has batches to give
    (no start-up stall at the boundary), and the batches are those of a loader without."""
    urls = expand_shards(str(tiny_world / "image_text" / "train-*.tar"))  # 6 shards x 16
    sc = _stream(urls, tiny_tokenizer, batch_size=16, shuffle_buffer=10)
    sc = replace(sc, transforms=_mlm_transforms(tiny_tokenizer))
    per_epoch = 6
    runs = {}
    for prestart in (True, False):
        loader = Loader(sc, 2)
        loader.prestart = prestart
        opened: list[tuple[int, int]] = []  # (epoch opened, batches given so far)
        taken: list[dict] = []
        real_open = loader._open_epoch

        def spy(epoch, skip, real_open=real_open, opened=opened, taken=taken):
            opened.append((epoch, len(taken)))
            return real_open(epoch, skip)

        loader._open_epoch = spy
        it = iter(loader)
        for _ in range(3 * per_epoch):
            taken.append(next(it))
        runs[prestart] = (opened, taken)
    opened, early = runs[True]
    # epoch e+1 is opened after the first batch of epoch e, long before its last
    assert [e for e, _ in opened] == [0, 1, 2, 3]
    assert all(given < (e * per_epoch) for e, given in opened[1:])
    assert [given for _, given in runs[False][0]] == [0, 6, 12]  # opened at the boundary
    late = runs[False][1]
    for a, b in zip(early, late, strict=True):
        assert a["__key__"] == b["__key__"]
        torch.testing.assert_close(a["input_ids"], b["input_ids"])
        torch.testing.assert_close(a["mlm_labels"], b["mlm_labels"])


def test_resume_with_other_worker_count_mid_epoch_is_refused(tiny_world, tiny_tokenizer):
    urls = expand_shards(str(tiny_world / "image_text" / "train-*.tar"))
    sc = _stream(urls, tiny_tokenizer, batch_size=12)
    loader = Loader(sc, 1, DataState(epoch=0, consumed=[2, 1], next_worker=1))
    with pytest.raises(ValueError, match="num_workers=2"):
        next(iter(loader))


def test_epochs_differ_and_every_sample_is_seen_once_per_epoch(tiny_world, tiny_tokenizer):
    urls = expand_shards(str(tiny_world / "image_text" / "train-*.tar"))
    sc = _stream(urls, tiny_tokenizer, batch_size=16, drop_last=False)
    loader = Loader(sc, 0)
    it = iter(loader)
    epoch0 = _keys([next(it) for _ in range(6)])  # 96 samples / 16
    epoch1 = _keys([next(it) for _ in range(6)])
    assert len(set(epoch0)) == 96 and set(epoch0) == set(epoch1)
    assert epoch0 != epoch1
    assert loader.state.epoch == 1


def test_reads_plain_img2dataset_shards(tmp_path, tiny_tokenizer):
    """img2dataset writes png/webp/jpg + txt + a json without `captions`: txt is the caption."""

    def image(fmt: str) -> bytes:
        buf = io.BytesIO()
        Image.new("RGB", (40, 24), (10, 200, 10)).save(buf, format=fmt)
        return buf.getvalue()

    samples = []
    for i, (ext, fmt) in enumerate([("png", "PNG"), ("webp", "WEBP"), ("jpg", "JPEG")]):
        meta = {"url": f"http://x/{i}", "caption": "a green square", "key": f"{i:09d}",
                "status": "success", "width": 40, "height": 24}  # fmt: skip
        samples.append({"__key__": f"{i:09d}", ext: image(fmt), "txt": "a green square",
                        "json": meta})  # fmt: skip
    urls = _write(tmp_path / "%05d.tar", samples, per_shard=10)
    sc = _stream(urls, tiny_tokenizer, shuffle=False, drop_last=False, batch_size=3)
    loader = Loader(sc, 0)
    (batch,) = list(loader._epoch_batches())
    assert loader.skipped == 0
    assert batch["pixels"].shape == (3, 3, 16, 16)  # resized to the size the encoder declared
    expected = tiny_tokenizer.build_inputs(tiny_tokenizer.encode("a green square"), None, 40)[0]
    assert batch["input_ids"][0].tolist() == expected
    # The decoded colour survives: green channel above red and blue after normalisation.
    mean_rgb = batch["pixels"][0].mean(dim=(1, 2))
    assert mean_rgb[1] > mean_rgb[0] and mean_rgb[1] > mean_rgb[2]


# -- mixtures of sources ----------------------------------------------------------------------


def _mono_shards(root, sizes: dict[str, int]) -> str:
    for lang, n in sizes.items():
        with ShardWriter(str(root / f"train-{lang}-%06d.tar"), 1000) as w:
            for i in range(n):
                w.write({"__key__": f"{lang}{i}", "txt": f"{lang} {i}", "json": {"language": lang}})
    return str(root / "train-{lang}-*.tar")


def test_alpha_sampling_probabilities(tmp_path):
    sizes = {"en": 800, "de": 150, "fr": 50}
    spec = _mono_shards(tmp_path, sizes)
    sources = {
        "mono": SourceConfig(shards=spec, weight=3.0, languages=list(sizes), alpha=0.5),
        "other": SourceConfig(shards=str(tmp_path / "train-fr-*.tar"), weight=1.0),
    }
    probs = {s.name: s.prob for s in mixture(sources)}
    # Independent: q_l = (n_l / N)^alpha, normalised, times the source's share 3/4.
    q = {lang: (n / 1000) ** 0.5 for lang, n in sizes.items()}
    for lang in sizes:
        assert probs[f"mono/{lang}"] == pytest.approx(0.75 * q[lang] / sum(q.values()))
    assert probs["other"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match=r"\{lang\} placeholder"):
        mixture({"x": SourceConfig(shards=str(tmp_path / "train-en-*.tar"), languages=["en"])})


def test_mixture_draws_whole_batches_from_one_source_by_probability(tmp_path, tiny_tokenizer):
    spec = _mono_shards(tmp_path, {"en": 300, "de": 300})
    cfg = DataConfig(
        sources={"mono": SourceConfig(shards=spec, languages=["en", "de"], alpha=1.0)},
        batch_size=4,
    )
    sc = stream_config(cfg, tiny_tokenizer, needs={"text": Need("text")})
    counts = collections.Counter()
    for _, batch in zip(range(400), ShardStream(sc, epoch=0)):
        langs = {k.rstrip("0123456789") for k in batch["__key__"]}
        assert len(langs) == 1  # one language per batch, as XLM samples them
        assert batch["__source__"] == f"mono/{langs.pop()}"
        counts[batch["__source__"]] += 1
    assert counts["mono/en"] / 400 == pytest.approx(0.5, abs=0.08)  # endless: 1600 > 600 samples
    again = [b["__key__"] for _, b in zip(range(20), ShardStream(sc, epoch=0))]
    first = [b["__key__"] for _, b in zip(range(20), ShardStream(replace(sc), epoch=0))]
    assert again == first  # seeded


def test_train_shards_beside_sources_name_the_sources_and_both_ways_out(tmp_path, tiny_tokenizer):
    spec = _mono_shards(tmp_path, {"en": 8})
    cfg = DataConfig(
        train=spec.replace("{lang}", "en"),
        sources={"video": SourceConfig(shards=spec), "images": SourceConfig(shards=spec)},
    )
    with pytest.raises(ValueError) as e:
        stream_config(cfg, tiny_tokenizer, needs={"text": Need("text")})
    msg = str(e.value)
    assert "(video, images)" in msg and "data.sources.<name>.shards=" in msg
    assert "data.sources=__delete__" in msg and "\n" not in msg


def test_a_source_carries_only_its_modalities(tmp_path, tiny_tokenizer):
    """An image-text source and a text corpus in one mixture: the corpus' batches hold text
    keys only (its samples have no image, and are not bad for it); the other source's both."""
    (tmp_path / "it").mkdir()
    pairs = _write(tmp_path / "it" / "%05d.tar", [_sample(f"it{i}") for i in range(40)], 20)
    spec = _mono_shards(tmp_path, {"en": 40})
    cfg = DataConfig(
        sources={
            "pairs": SourceConfig(shards=",".join(pairs)),
            "corpus": SourceConfig(shards=spec.replace("{lang}", "en"), modalities=["text"]),
        },
        batch_size=4,
    )
    sc = stream_config(cfg, tiny_tokenizer, needs=NEEDS)
    seen = collections.Counter()
    for _, batch in zip(range(40), ShardStream(sc, epoch=0)):
        source = batch["__source__"]
        seen[source] += 1
        assert ("pixels" in batch) == (source == "pairs")
        assert batch["input_ids"].shape[0] == 4
        want = "it" if source == "pairs" else "en"
        assert all(k.startswith(want) for k in batch["__key__"])
        assert batch["__skipped__"] == 0
    assert seen["pairs"] and seen["corpus"]
    cfg.sources["corpus"].modalities = ["audio"]
    with pytest.raises(ValueError, match=r"data.sources.corpus.modalities names \['audio'\]"):
        stream_config(cfg, tiny_tokenizer, needs=NEEDS)


def test_a_source_whose_samples_are_all_bad_stops_the_stream(tmp_path, tiny_tokenizer):
    """Text-only samples in a source that must carry images too: every one is bad, and the
    stream says which source instead of reading it again and again."""
    (tmp_path / "it").mkdir()
    pairs = _write(tmp_path / "it" / "%05d.tar", [_sample(f"it{i}") for i in range(40)], 20)
    spec = _mono_shards(tmp_path, {"en": 12})
    cfg = DataConfig(
        sources={
            "pairs": SourceConfig(shards=",".join(pairs)),
            "corpus": SourceConfig(shards=spec.replace("{lang}", "en")),
        },
        batch_size=4,
    )
    sc = stream_config(cfg, tiny_tokenizer, needs=NEEDS)
    with pytest.raises(DataError, match=r"data source 'corpus' gives no samples .*12 .*skipped"):
        for _ in zip(range(200), ShardStream(sc, epoch=0)):
            pass


@pytest.mark.parametrize("mixture", [False, True])
def test_a_resampled_stream_whose_samples_are_all_bad_stops_with_an_error(
    tmp_path, tiny_tokenizer, monkeypatch, mixture
):
    """Resampled shards never end, so a stream whose every sample fails to decode (here: no
    image for a recipe that needs one; knowbert_base's candidates without an entity list was
    the case met) would log skips forever; it stops with a DataError naming the last one."""
    import mmptm.data.pipeline as pipeline

    monkeypatch.setattr(pipeline, "MAX_BAD_IN_A_ROW", 25)
    bad = [{"__key__": f"t{i}", "txt": "a red circle"} for i in range(8)]  # no jpg
    urls = _write(tmp_path / "s-%06d.tar", bad, per_shard=4)
    if mixture:
        cfg = DataConfig(sources={"a": SourceConfig(shards=",".join(urls)),
                                  "b": SourceConfig(shards=",".join(urls))},
                         batch_size=4, resampled=True)  # fmt: skip
    else:
        cfg = DataConfig(train=",".join(urls), batch_size=4, resampled=True)
    sc = stream_config(cfg, tiny_tokenizer, needs=NEEDS)
    with pytest.raises(
        DataError, match=r"25 samples in a row could not be decoded, the last 't\d'"
    ):
        next(iter(ShardStream(sc, epoch=0)))
