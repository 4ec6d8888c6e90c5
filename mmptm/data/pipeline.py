"""The training data pipeline: a list of small named stages over webdataset shards.

    shard list (per-epoch shuffle, or resampled) → split by node → split by worker
    → tar → samples (skip-and-count handler) → shuffle buffer → decode (image, text)
    → batch (pad to longest) → objectives' data sides (seeded per batch) → loader

Every stage is a plain generator function that can be tested alone. Reproducibility: all
randomness is drawn from generators seeded by (seed, epoch, rank, worker[, batch]), and the
loader releases batches in a fixed worker order, so a run resumed at a saved
``DataState`` sees exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import glob
import io
import json
import logging
import os
import random
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import braceexpand
import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from webdataset.tariterators import group_by_keys, tar_file_expander, url_opener

from mmptm.objectives.base import BatchTransform

log = logging.getLogger(__name__)

Sample = dict[str, Any]
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")


@dataclass
class DataConfig:
    """The data part of a recipe."""

    #: shard spec: a glob, a brace pattern (``train-{000000..000009}.tar``), a directory
    #: of ``.tar`` files, or several of those separated by commas
    train: str = ""
    val: str = ""
    test: str = ""
    #: sentencepiece ``.model`` file (``mmptm tokenizer train`` writes one)
    tokenizer: str = ""
    batch_size: int = 32
    num_workers: int = 0
    shuffle_buffer: int = 1000
    #: sample shards with replacement forever instead of per-epoch permutations
    resampled: bool = False
    image_size: int = 64
    image_mean: list[float] = field(default_factory=lambda: [0.485, 0.456, 0.406])
    image_std: list[float] = field(default_factory=lambda: [0.229, 0.224, 0.225])
    max_text_len: int = 40
    #: caption languages (keys of ``json["captions"]``); one is drawn per sample per epoch;
    #: the ``txt`` member is the fallback when a sample has none of them
    caption_languages: list[str] = field(default_factory=lambda: ["en"])


# --------------------------------------------------------------------------------------------
# Shard lists


def expand_shards(spec: str) -> list[str]:
    """Resolve a shard spec into a sorted list of existing tar paths; error names what's missing."""
    if not spec:
        raise ValueError("no shards given (set data.train / data.val / data.test)")
    urls: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if os.path.isdir(part):
            found = sorted(glob.glob(os.path.join(part, "*.tar")))
        else:
            found = []
            for pattern in braceexpand.braceexpand(part):
                found += sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        missing = [u for u in found if not os.path.exists(u)]
        if missing:
            raise FileNotFoundError(f"shard {missing[0]!r} (from {part!r}) does not exist")
        if not found:
            raise FileNotFoundError(f"shard spec {part!r} matches no files")
        urls += found
    return urls


def shard_order(urls: Sequence[str], seed: int, epoch: int, shuffle: bool = True) -> list[str]:
    """This epoch's order of the shards: a permutation seeded by (seed, epoch)."""
    urls = list(urls)
    if shuffle:
        random.Random(f"{seed}/{epoch}").shuffle(urls)
    return urls


def resampled_shards(urls: Sequence[str], rng: random.Random) -> Iterator[str]:
    """Shards drawn with replacement, forever (each worker with its own seeded rng)."""
    while True:
        yield rng.choice(urls)


def split_round_robin(items: Iterable[Any], index: int, count: int) -> Iterator[Any]:
    """Keep every ``count``-th item starting at ``index`` (split by node, by worker, ...)."""
    for i, item in enumerate(items):
        if i % count == index:
            yield item


# --------------------------------------------------------------------------------------------
# Samples


class SkipCounter:
    """A webdataset-style handler that logs and counts bad input instead of raising."""

    def __init__(self) -> None:
        self.count = 0
        self.last = ""

    def __call__(self, exn: BaseException) -> bool:
        self.count += 1
        self.last = str(exn)
        log.warning("skipped bad input (%d so far): %s", self.count, exn)
        return True  # keep going

    def skip(self, sample: Sample, reason: str) -> None:
        self(ValueError(f"sample {sample.get('__key__')!r} in {sample.get('__url__')}: {reason}"))


def tar_samples(urls: Iterable[str], handler: SkipCounter) -> Iterator[Sample]:
    """Open tar shards and group members into samples by ``__key__`` (webdataset's readers)."""
    streams = url_opener(({"url": u} for u in urls), handler=handler)
    files = tar_file_expander(streams, handler=handler)
    yield from group_by_keys(files, handler=handler)


def shuffle_buffer(samples: Iterable[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """Approximate shuffle through a buffer of ``size`` items (1 = no shuffle)."""
    if size <= 1:
        yield from samples
        return
    buf: list[Any] = []
    for s in samples:
        if len(buf) < size:
            buf.append(s)
            continue
        i = rng.randrange(size)
        yield buf[i]
        buf[i] = s
    rng.shuffle(buf)
    yield from buf


@dataclass
class Decoder:
    """Decodes a raw sample into the tensors its modalities need; raises ValueError if it can't.

    ``needs`` names the modalities of the model (``image``, ``text``); a sample lacking one
    of them is bad input. The caption language is drawn per (seed, epoch, sample key).
    """

    tokenizer: Any
    needs: frozenset[str]
    image_size: int
    image_mean: Sequence[float]
    image_std: Sequence[float]
    max_text_len: int
    caption_languages: Sequence[str]
    seed: int = 0
    epoch: int = 0

    def __call__(self, sample: Sample) -> Sample:
        out: Sample = {"__key__": sample["__key__"]}
        meta = json.loads(sample["json"]) if "json" in sample else {}
        if not isinstance(meta, dict):
            raise ValueError(f"json member is a {type(meta).__name__}, expected an object")
        if "image" in self.needs:
            out["pixels"] = self.image(sample)
        if "text" in self.needs:
            out["input_ids"], out["lang"] = self.text(sample, meta)
        return out

    def image(self, sample: Sample) -> torch.Tensor:
        ext = next((e for e in IMAGE_EXTS if e in sample), None)
        if ext is None:
            raise ValueError(f"no image member (one of {IMAGE_EXTS}); has {sorted(sample)}")
        with Image.open(io.BytesIO(sample[ext])) as img:
            img.load()  # decode now, so a truncated file fails here
            img = img.convert("RGB")
            if img.size != (self.image_size, self.image_size):
                img = img.resize((self.image_size, self.image_size), Image.BICUBIC)
            x_HWC = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
        x_CHW = x_HWC.view(self.image_size, self.image_size, 3).permute(2, 0, 1).float() / 255.0
        mean = torch.tensor(self.image_mean).view(3, 1, 1)
        std = torch.tensor(self.image_std).view(3, 1, 1)
        return (x_CHW - mean) / std

    def text(self, sample: Sample, meta: dict) -> tuple[list[int], str]:
        captions = meta.get("captions") or {}
        langs = [lang for lang in self.caption_languages if captions.get(lang)]
        if langs:
            rng = random.Random(f"{self.seed}/{self.epoch}/{sample['__key__']}")
            lang = rng.choice(langs)
            caption = captions[lang]
        elif "txt" in sample:
            lang, caption = self.caption_languages[0], sample["txt"].decode("utf-8")
        else:
            raise ValueError(f"no caption in {list(self.caption_languages)} and no txt member")
        ids, _ = self.tokenizer.build_inputs(
            self.tokenizer.encode(caption), None, self.max_text_len
        )
        return ids, lang


def decode_samples(
    samples: Iterable[Sample], decoder: Decoder, handler: SkipCounter
) -> Iterator[Sample]:
    """Decode each sample; a corrupt one (truncated image, bad JSON, ...) is skipped and counted."""
    for s in samples:
        try:
            yield decoder(s)
        except Exception as e:  # any decode failure is the sample's fault: report, go on
            handler.skip(s, f"{type(e).__name__}: {e}")


# --------------------------------------------------------------------------------------------
# Batches


@dataclass
class Collate:
    """Stacks decoded samples; text is padded to the longest in the batch."""

    pad_id: int
    lang_index: Callable[[str], int]

    def __call__(self, samples: list[Sample]) -> dict[str, Any]:
        batch: dict[str, Any] = {"__key__": [s["__key__"] for s in samples]}
        if "pixels" in samples[0]:
            batch["pixels"] = torch.stack([s["pixels"] for s in samples])
        if "input_ids" in samples[0]:
            lengths = [len(s["input_ids"]) for s in samples]
            L = max(lengths)
            ids_BL = torch.full((len(samples), L), self.pad_id, dtype=torch.long)
            for i, s in enumerate(samples):
                ids_BL[i, : lengths[i]] = torch.tensor(s["input_ids"], dtype=torch.long)
            batch["input_ids"] = ids_BL
            batch["attention_mask"] = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]
            batch["segment_ids"] = torch.zeros_like(ids_BL)
            lang_B = torch.tensor([self.lang_index(s["lang"]) for s in samples])
            batch["lang_ids"] = lang_B[:, None].expand(-1, L).contiguous()
        return batch


def batched(samples: Iterable[Sample], size: int, drop_last: bool) -> Iterator[list[Sample]]:
    """Group samples into lists of ``size``; the short last one is kept unless ``drop_last``."""
    buf: list[Sample] = []
    for s in samples:
        buf.append(s)
        if len(buf) == size:
            yield buf
            buf = []
    if buf and not drop_last:
        yield buf


def batch_generator(seed: int, epoch: int, rank: int, worker: int, index: int) -> torch.Generator:
    """The generator an objective's data side uses for one batch."""
    key = f"{seed}/{epoch}/{rank}/{worker}/{index}".encode()
    return torch.Generator().manual_seed(zlib.crc32(key) * 1_000_003 + index)


# --------------------------------------------------------------------------------------------
# The dataset one epoch at a time, and the loader


@dataclass
class StreamConfig:
    """Everything a worker needs to produce its part of an epoch (picklable)."""

    urls: list[str]
    decoder: Decoder
    collate: Collate
    transforms: list[BatchTransform]
    batch_size: int
    seed: int = 0
    rank: int = 0
    world: int = 1
    shuffle: bool = True
    shuffle_buffer: int = 1000
    resampled: bool = False
    drop_last: bool = True


class ShardStream(IterableDataset):
    """One epoch of batches for this rank; each worker yields its own part.

    Batches carry ``__worker__`` and ``__skipped__`` (this worker's running count of bad
    samples); after its last batch a worker yields an end marker ``{"__end__": worker}`` so
    the loader knows the worker is done. ``skip[w]`` batches of worker w are fast-forwarded
    (decoded, not transformed) on resume.
    """

    def __init__(self, cfg: StreamConfig, epoch: int, skip: Sequence[int] = ()) -> None:
        self.cfg = cfg
        self.epoch = epoch
        self.skip = list(skip)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info else (0, 1)
        if info is not None:
            torch.set_num_threads(1)  # workers decode; the main process owns the cores
        c = self.cfg
        handler = SkipCounter()
        decoder = replace(c.decoder, epoch=self.epoch)
        parts = c.world * n_workers
        part = c.rank * n_workers + worker
        if c.resampled:
            rng = random.Random(f"{c.seed}/{self.epoch}/{part}")
            samples = tar_samples(resampled_shards(c.urls, rng), handler)
        else:
            order = shard_order(c.urls, c.seed, self.epoch, c.shuffle)
            if len(order) >= parts:  # split shards: rank first, then worker
                mine = split_round_robin(
                    split_round_robin(order, c.rank, c.world), worker, n_workers
                )
                samples = tar_samples(mine, handler)
            else:  # fewer shards than readers: every reader scans all, keeps its share
                samples = split_round_robin(tar_samples(order, handler), part, parts)
        rng = random.Random(f"{c.seed}/{self.epoch}/{part}/shuffle")
        samples = shuffle_buffer(samples, c.shuffle_buffer if c.shuffle else 1, rng)
        decoded = decode_samples(samples, decoder, handler)
        skip = self.skip[worker] if worker < len(self.skip) else 0
        for index, group in enumerate(batched(decoded, c.batch_size, c.drop_last)):
            if index < skip:
                continue
            batch = c.collate(group)
            g = batch_generator(c.seed, self.epoch, c.rank, worker, index)
            for transform in c.transforms:
                batch = transform(batch, g)
            batch["__worker__"] = worker
            batch["__skipped__"] = handler.count
            yield batch
        yield {"__end__": worker, "__skipped__": handler.count}


@dataclass
class DataState:
    """Where a rank's stream stands: the epoch and how many batches each worker has given."""

    epoch: int = 0
    consumed: list[int] = field(default_factory=list)
    #: the worker whose batch comes next in the fixed round-robin order
    next_worker: int = 0
    #: bad samples skipped so far in earlier epochs (this epoch's are added live)
    skipped_before: int = 0


class Loader:
    """Endless iterator of training batches over epochs, with an exact, resumable order.

    A DataLoader hands out worker batches round-robin, always starting at worker 0; a
    resumed run must continue where the old order left off. So batches are released in the
    order (next_worker, next_worker+1, ...) skipping finished workers, holding at most one
    early batch per worker.
    """

    def __init__(self, cfg: StreamConfig, num_workers: int, state: DataState | None = None):
        self.cfg = cfg
        self.num_workers = num_workers
        self.n = max(num_workers, 1)
        self.state = state or DataState()
        self.skipped_now = [0] * self.n

    @property
    def skipped(self) -> int:
        return self.state.skipped_before + sum(self.skipped_now)

    def _epoch_batches(self) -> Iterator[dict[str, Any]]:
        st = self.state
        if len(st.consumed) != self.n:
            if any(st.consumed):
                raise ValueError(
                    f"cannot resume mid-epoch with {self.n} loader workers: the checkpoint was "
                    f"written with {len(st.consumed)} (set data.num_workers={len(st.consumed)})"
                )
            st.consumed = [0] * self.n
        dataset = ShardStream(self.cfg, st.epoch, skip=st.consumed)
        loader = DataLoader(
            dataset,
            batch_size=None,
            num_workers=self.num_workers,
            persistent_workers=False,
            prefetch_factor=4 if self.num_workers else None,
            # Its own generator: drawing worker seeds from the global RNG would shift
            # dropout after a resume. (All data randomness is seeded by the stages anyway.)
            generator=torch.Generator().manual_seed(self.cfg.seed + st.epoch),
        )
        pending: dict[int, dict[str, Any]] = {}
        done: set[int] = set()
        it = iter(loader)
        while len(done) < self.n:
            w = st.next_worker
            if w in done:
                st.next_worker = (w + 1) % self.n
                continue
            while w not in pending:
                item = next(it)
                wid = item["__end__"] if "__end__" in item else item["__worker__"]
                pending[wid] = item
            item = pending.pop(w)
            self.skipped_now[w] = item["__skipped__"]
            if "__end__" in item:
                done.add(w)
                st.next_worker = (w + 1) % self.n
                continue
            st.consumed[w] += 1
            st.next_worker = (w + 1) % self.n
            yield item
        st.skipped_before += sum(self.skipped_now)
        self.skipped_now = [0] * self.n

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            empty = True
            for batch in self._epoch_batches():
                empty = False
                yield batch
            if empty and self.state.consumed == [0] * self.n:
                raise RuntimeError(
                    f"epoch {self.state.epoch} produced no batch: too few valid samples for "
                    f"batch_size={self.cfg.batch_size} on this rank ({len(self.cfg.urls)} shards)"
                )
            self.state = DataState(epoch=self.state.epoch + 1, skipped_before=self.skipped)


def single_pass(cfg: StreamConfig, num_workers: int = 0) -> Iterator[dict[str, Any]]:
    """One ordered pass over the data (evaluation): no shuffling, last batch kept."""
    cfg = replace(cfg, shuffle=False, drop_last=False, resampled=False, transforms=[])
    loader = Loader(cfg, num_workers)
    return loader._epoch_batches()


def move_to(batch: dict[str, Any], device: torch.device | str) -> dict[str, Any]:
    """Tensors to ``device``; metadata (``__key__`` ...) stays as it is."""
    return {
        k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
        for k, v in batch.items()
    }


__all__ = [
    "Collate",
    "DataConfig",
    "DataState",
    "Decoder",
    "Loader",
    "ShardStream",
    "SkipCounter",
    "StreamConfig",
    "batch_generator",
    "batched",
    "decode_samples",
    "expand_shards",
    "move_to",
    "shard_order",
    "shuffle_buffer",
    "single_pass",
    "split_round_robin",
    "stream_config",
    "tar_samples",
]


def stream_config(
    cfg: DataConfig,
    tokenizer: Any,
    *,
    split: str = "train",
    needs: Iterable[str] = ("image", "text"),
    transforms: Sequence[BatchTransform] = (),
    seed: int = 0,
    rank: int = 0,
    world: int = 1,
    shards: str | None = None,
) -> StreamConfig:
    """Assemble the stages' settings for one split from the data config."""
    spec = shards if shards is not None else getattr(cfg, split)
    if not spec:
        raise ValueError(f"data.{split} is empty: give the shards of the {split} split")
    if cfg.batch_size < 1:
        raise ValueError(f"data.batch_size must be >= 1, got {cfg.batch_size}")

    def lang_index(lang: str) -> int:
        return tokenizer.languages.index(lang) if lang in tokenizer.languages else 0

    return StreamConfig(
        urls=expand_shards(spec),
        decoder=Decoder(
            tokenizer=tokenizer,
            needs=frozenset(needs),
            image_size=cfg.image_size,
            image_mean=list(cfg.image_mean),
            image_std=list(cfg.image_std),
            max_text_len=cfg.max_text_len,
            caption_languages=list(cfg.caption_languages),
            seed=seed,
        ),
        collate=Collate(pad_id=tokenizer.pad_id, lang_index=lang_index),
        transforms=list(transforms),
        batch_size=cfg.batch_size,
        seed=seed,
        rank=rank,
        world=world,
        shuffle=split == "train",
        shuffle_buffer=cfg.shuffle_buffer,
        resampled=cfg.resampled and split == "train",
        drop_last=split == "train",
    )
