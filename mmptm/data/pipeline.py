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
import itertools
import logging
import os
import random
import tarfile
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import braceexpand
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from webdataset.tariterators import group_by_keys, tar_file_expander, url_opener

from mmptm.batch import BatchTransform
from mmptm.data.decode import Collate, ConcatPair, Decoder

log = logging.getLogger(__name__)

Sample = dict[str, Any]


@dataclass
class SourceConfig:
    """One training source of a mixture; each batch comes from one source."""

    #: shard spec; with ``languages`` it contains ``{lang}``, e.g. ``mono/train-{lang}-*.tar``
    shards: str
    #: relative share of batches (normalised over the sources)
    weight: float = 1.0
    #: one sub-source per language, sampled with p(l) ∝ (n_l / N) ** alpha (XLM / XLM-R)
    languages: list[str] = field(default_factory=list)
    alpha: float = 0.7
    #: parallel / paired text: ``join`` into one sequence (TLM; models with a ``text2``
    #: encoder read the views apart) or ``stack`` the two sentences as separate rows of one
    #: batch (sentence-level contrastive over ``[text, text]``, see ``ConcatPair``)
    pairs: str = "join"


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
    #: instead of ``train``: a mixture of sources, each batch drawn from one of them
    sources: dict[str, SourceConfig] = field(default_factory=dict)
    #: pairs joined into one sequence restart positions at the second sentence (XLM TLM)
    restart_positions: bool = True
    #: named evaluation sets (e.g. one per language): name → shard spec
    eval: dict[str, str] = field(default_factory=dict)


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
class SubSource:
    """A set of shards and its probability of providing the next batch."""

    name: str
    urls: list[str]
    prob: float = 1.0


@dataclass
class StreamConfig:
    """Everything a worker needs to produce its part of an epoch (picklable).

    With one source an epoch is one pass over its shards. With several (a mixture) each
    batch comes from one source drawn by ``prob``; every source cycles through its own
    epochs, so the stream is endless.
    """

    sources: list[SubSource]
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

    def _samples(
        self, src: SubSource, epoch: int, worker: int, n_workers: int, handler: SkipCounter
    ) -> Iterator[Sample]:
        """This reader's share of one source for one epoch, shuffled."""
        c = self.cfg
        parts = c.world * n_workers
        part = c.rank * n_workers + worker
        seed = f"{c.seed}/{src.name}" if len(c.sources) > 1 else c.seed
        if c.resampled:
            rng = random.Random(f"{seed}/{epoch}/{part}")
            samples = tar_samples(resampled_shards(src.urls, rng), handler)
        else:
            order = shard_order(src.urls, seed, epoch, c.shuffle)
            if len(order) >= parts:  # split shards: rank first, then worker
                mine = split_round_robin(
                    split_round_robin(order, c.rank, c.world), worker, n_workers
                )
                samples = tar_samples(mine, handler)
            else:  # fewer shards than readers: every reader scans all, keeps its share
                samples = split_round_robin(tar_samples(order, handler), part, parts)
        rng = random.Random(f"{seed}/{epoch}/{part}/shuffle")
        return shuffle_buffer(samples, c.shuffle_buffer if c.shuffle else 1, rng)

    def _groups(
        self, worker: int, n_workers: int, handler: SkipCounter
    ) -> Iterator[tuple[str, list]]:
        """(source name, decoded samples) per batch."""
        c = self.cfg
        if len(c.sources) == 1:
            decoder = replace(c.decoder, epoch=self.epoch)
            samples = self._samples(c.sources[0], self.epoch, worker, n_workers, handler)
            decoded = decode_samples(samples, decoder, handler)
            for group in batched(decoded, c.batch_size, c.drop_last):
                yield c.sources[0].name, group
            return

        def endless(src: SubSource) -> Iterator[Sample]:
            for epoch in itertools.count():
                decoder = replace(c.decoder, epoch=epoch)
                samples = self._samples(src, epoch, worker, n_workers, handler)
                yield from decode_samples(samples, decoder, handler)

        streams = [endless(src) for src in c.sources]
        rng = random.Random(f"{c.seed}/{self.epoch}/{c.rank}/{worker}/mix")
        probs = [src.prob for src in c.sources]
        while True:
            (i,) = rng.choices(range(len(streams)), weights=probs)
            group = list(itertools.islice(streams[i], c.batch_size))
            if len(group) < c.batch_size:
                raise RuntimeError(f"source {c.sources[i].name!r} gives no samples to this reader")
            yield c.sources[i].name, group

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info else (0, 1)
        if info is not None:
            torch.set_num_threads(1)  # workers decode; the main process owns the cores
        c = self.cfg
        handler = SkipCounter()
        skip = self.skip[worker] if worker < len(self.skip) else 0
        for index, (source, group) in enumerate(self._groups(worker, n_workers, handler)):
            if index < skip:
                continue
            batch = c.collate(group)
            batch["__source__"] = source
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
                    f"batch_size={self.cfg.batch_size} on this rank "
                    f"({sum(len(s.urls) for s in self.cfg.sources)} shards)"
                )
            self.state = DataState(epoch=self.state.epoch + 1, skipped_before=self.skipped)


def single_pass(cfg: StreamConfig, num_workers: int = 0) -> Iterator[dict[str, Any]]:
    """One ordered pass over the data (evaluation): no shuffling, last batch kept."""
    cfg = replace(cfg, shuffle=False, drop_last=False, resampled=False)
    loader = Loader(cfg, num_workers)
    return loader._epoch_batches()


__all__ = [
    "Collate",
    "ConcatPair",
    "DataConfig",
    "DataState",
    "Decoder",
    "Loader",
    "ShardStream",
    "SkipCounter",
    "SourceConfig",
    "StreamConfig",
    "SubSource",
    "batch_generator",
    "batched",
    "count_samples",
    "decode_samples",
    "expand_shards",
    "mixture",
    "shard_order",
    "shuffle_buffer",
    "single_pass",
    "split_round_robin",
    "stream_config",
    "tar_samples",
]


@lru_cache(maxsize=4096)
def _count(url: str, size: int, mtime: float) -> int:
    with tarfile.open(url) as tar:
        return len({m.name.split("/")[-1].split(".")[0] for m in tar if m.isfile()})


def count_samples(urls: Iterable[str]) -> int:
    """Samples (distinct keys) in tar shards, from their headers; cached per file version."""
    total = 0
    for u in urls:
        st = os.stat(u)
        total += _count(u, st.st_size, st.st_mtime)
    return total


def mixture(sources: dict[str, SourceConfig]) -> list[SubSource]:
    """Sub-sources with batch probabilities: source weights × per-language α-sampling."""
    if not sources:
        raise ValueError("data.sources is empty")
    total = sum(src.weight for src in sources.values())
    if total <= 0 or any(src.weight < 0 for src in sources.values()):
        raise ValueError("data.sources weights must be >= 0 and not all 0")
    subs: list[SubSource] = []
    for name, src in sources.items():
        share = src.weight / total
        if not src.languages:
            subs.append(SubSource(name, expand_shards(src.shards), share))
            continue
        if "{lang}" not in src.shards:
            raise ValueError(f"data.sources.{name}.shards needs a {{lang}} placeholder")
        urls = {lang: expand_shards(src.shards.replace("{lang}", lang)) for lang in src.languages}
        n = {lang: count_samples(u) for lang, u in urls.items()}
        q = {lang: (n[lang] / sum(n.values())) ** src.alpha for lang in urls}
        z = sum(q.values())
        subs += [SubSource(f"{name}/{lang}", urls[lang], share * q[lang] / z) for lang in urls]
    return subs


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
    needs = frozenset(needs)
    for name, src in cfg.sources.items():
        if src.pairs not in ("join", "stack"):
            raise ValueError(f"data.sources.{name}.pairs must be join or stack, got {src.pairs!r}")
    stack = frozenset(name for name, src in cfg.sources.items() if src.pairs == "stack")
    if stack and "text2" in needs:
        raise ValueError(
            f"data.sources {sorted(stack)} stack pairs into rows of `text`, but the model has a "
            "text2 encoder that reads the second sentence apart: drop one of them"
        )
    if split == "train" and shards is None and cfg.sources:
        if cfg.train:
            raise ValueError("set data.train or data.sources, not both")
        sources = mixture(cfg.sources)
    elif not spec:
        raise ValueError(f"data.{split} is empty: give the shards of the {split} split")
    else:
        sources = [SubSource(split, expand_shards(spec))]
    if "text" in needs and "text2" not in needs:  # one sequence: join pairs (or stack them)
        pair = ConcatPair(tokenizer.pad_id, cfg.restart_positions, stack=stack)
        transforms = [pair, *transforms]
        transforms.sort(key=lambda t: t.data_priority)
    if cfg.batch_size < 1:
        raise ValueError(f"data.batch_size must be >= 1, got {cfg.batch_size}")

    def lang_index(lang: str) -> int:
        return tokenizer.languages.index(lang) if lang in tokenizer.languages else 0

    return StreamConfig(
        sources=sources,
        decoder=Decoder(
            tokenizer=tokenizer,
            needs=needs,
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
