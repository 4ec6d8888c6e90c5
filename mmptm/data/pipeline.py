"""The training data pipeline: a list of small named stages over webdataset shards.

    shard list (per-epoch shuffle, or resampled) → split by node → split by worker
    → tar → samples (skip-and-count handler) → shuffle buffer → decode (modality plug-ins)
    → batch (plug-ins collate: pad to longest) → batch stages (plug-ins' and objectives'
    data sides, seeded per batch) → loader

Every stage is a plain generator function that can be tested alone. Reproducibility: all
randomness is drawn from generators seeded by (seed, epoch, rank, worker[, batch]), and the
loader releases batches in a fixed worker order, so a run resumed at a saved
``DataState`` sees exactly the batches an uninterrupted run would have seen. With resampled
shards an epoch is a number of samples (``data.epoch_samples``), so a resumed run replays
at most one epoch's draws to get back to its position. What is decoded
follows what the model declares it needs (``PretrainModel.data_needs``).
"""

from __future__ import annotations

import itertools
import random
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from mmptm.batch import END, SKIPPED, SOURCE, WORKER, BatchTransform
from mmptm.data.decode import Collate, Decoder
from mmptm.data.manifest import manifest_counts
from mmptm.data.remote import RemoteOptions, is_remote
from mmptm.data.shards import (
    SkipCounter,
    check_shard,
    count_samples,
    expand_shards,
    read_shard,
)
from mmptm.modalities.base import DataContext, Modality, Need, Sample, build_modalities
from mmptm.recipe import DataConfig, SourceConfig, packed_sources


class DataError(ValueError):
    """The data cannot give what the run needs: no readable sample, too few for a batch."""


# --------------------------------------------------------------------------------------------
# Shard lists


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


#: shards drawn in a row without a sample before a resampled stream gives up
MAX_EMPTY_DRAWS = 20


def resampled_samples(
    urls: Sequence[str], rng: random.Random, read: Callable[[str], Iterable[Sample]]
) -> Iterator[Sample]:
    """The samples of shards drawn with replacement (``read(url)`` gives a shard's), forever;
    a DataError once ``MAX_EMPTY_DRAWS`` draws in a row gave none (every shard unreadable, the
    network down), where drawing on would spin without end."""
    empty = 0
    for url in resampled_shards(urls, rng):
        n = 0
        for sample in read(url):
            n += 1
            yield sample
        empty = 0 if n else empty + 1
        if empty >= MAX_EMPTY_DRAWS:
            raise DataError(
                f"{empty} shards drawn in a row gave no sample (the last: {url}); see the "
                "warnings above"
            )


def split_round_robin(items: Iterable[Any], index: int, count: int) -> Iterator[Any]:
    """Keep every ``count``-th item starting at ``index`` (split by node, by worker, ...)."""
    for i, item in enumerate(items):
        if i % count == index:
            yield item


def reader_samples(
    order: Sequence[str],
    rank: int,
    world: int,
    worker: int,
    n_workers: int,
    handler: SkipCounter,
    block: int = 1,
    remote: RemoteOptions | None = None,
    counts: Mapping[str, int] | None = None,
) -> Iterator[Sample]:
    """One reader's (rank, loader worker) share of an epoch's shards: together the readers
    get every sample once, and the ranks equal shares.

    Shards go to ranks round robin, except the last ``len(order) % world``: every rank reads
    those and keeps every world-th sample, so no rank gets a shard more than another (it
    would wait, or drop the surplus, at the end of every epoch; with fewer shards than
    ranks, all are shared). Within a rank, shards go to workers round robin; with fewer
    shards than workers, each worker reads them all and keeps every n_workers-th ``block``
    of samples (a batch: a worker's batches are then all full, while a share of single
    samples could leave each worker short of one). A shard read by several readers has its
    read errors counted by one of them. Remote shards are read as ``remote`` says; ``counts``
    (their manifest's) tells how many samples one that fails loses.
    """
    counts = counts or {}
    whole = len(order) // world * world
    # (url, j): a shard of its own (j = -1) or the j-th shared one
    units = [(url, -1) for url in order[rank:whole:world]]
    units += [(url, j) for j, url in enumerate(order[whole:])]

    def read(url: str, j: int, reports: bool) -> Iterator[Sample]:
        reports = reports and (j < 0 or j % world == rank)
        if reports:
            count_silent_damage(url, handler)
        who = handler if reports else SkipCounter(report=False)
        samples = read_shard(url, who, remote, counts.get(url))
        if j < 0:
            return samples
        # offset by j, so that the ranks take turns at a shard's odd sample
        return (s for k, s in enumerate(samples) if (k + j) % world == rank)

    if len(units) >= n_workers:
        mine = units[worker::n_workers]
        return itertools.chain.from_iterable(read(url, j, True) for url, j in mine)
    rank_samples = itertools.chain.from_iterable(
        read(url, j, u % n_workers == worker) for u, (url, j) in enumerate(units)
    )
    blocks = itertools.groupby(enumerate(rank_samples), lambda i_s: i_s[0] // block)
    return (s for b, group in blocks if b % n_workers == worker for _, s in group)


def count_silent_damage(url: str, handler: SkipCounter) -> None:
    """Count what a streaming reader of ``url`` would lose without an error (garbage inside
    the shard, a cut at a header: at least one sample) before it reads the shard, so no
    sample goes missing uncounted. A shard that is not a local file is not scanned."""
    if is_remote(url):
        return
    try:
        check = check_shard(url)
    except OSError:  # not a local file, or unreadable: the reader reports it
        return
    if check.silent:
        handler.lose(max(check.lost, 1), f"{url}: {check.error}")


# --------------------------------------------------------------------------------------------
# Samples


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


#: samples in a row that fail to decode before an endless (resampled) stream gives up: with
#: every sample bad for the recipe (a setting, not damage) drawing on would spin without end
MAX_BAD_IN_A_ROW = 1000


def decode_samples(
    samples: Iterable[Sample], decoder: Decoder, handler: SkipCounter, give_up: int | None = None
) -> Iterator[Sample]:
    """Decode each sample; a corrupt one (truncated image, bad JSON, ...) is skipped and counted.
    ``give_up``: a DataError once that many samples in a row failed (for endless streams)."""
    bad = 0
    for s in samples:
        try:
            decoded = decoder(s)
        except Exception as e:  # any decode failure is the sample's fault: report, go on
            reason = f"{type(e).__name__}: {e}"
            handler.skip(s, reason)
            bad += 1
            if give_up is not None and bad >= give_up:
                raise DataError(
                    f"{bad} samples in a row could not be decoded, the last "
                    f"{s.get('__key__')!r} in {s.get('__url__')}: {reason}"
                ) from e
            continue
        bad = 0
        yield decoded


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
    #: the modalities its samples carry (empty: all the stream's)
    modalities: tuple[str, ...] = ()
    #: remote shards' sample counts (their manifest's): what one that fails loses
    counts: dict[str, int] = field(default_factory=dict)


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
    #: with ``resampled``: the loader's epoch in samples, all ranks together (0 = endless)
    epoch_samples: int = 0
    #: how remote shards are read (retries, timeout, cache)
    remote: RemoteOptions = field(default_factory=RemoteOptions)

    @property
    def modalities(self) -> Sequence[Modality]:
        """The plug-ins that decode and collate this stream."""
        return self.decoder.modalities

    def view_keys(self, view: str) -> list[str]:
        """The batch keys of one view the model reads (e.g. an encoder's inputs)."""
        for m in self.modalities:
            if view in m.views:
                return m.view_keys(view)
        raise KeyError(f"no plug-in decodes view {view!r} (views: {self.views})")

    @property
    def views(self) -> list[str]:
        return [v for m in self.modalities for v in m.views]

    def decoder_of(self, source: SubSource, epoch: int) -> Decoder:
        """The decoder of one source's samples (its modalities' plug-ins) in ``epoch``."""
        decoder = replace(self.decoder, epoch=epoch)
        if source.modalities:
            decoder.modalities = self._carried(source)
        return decoder

    def collate_of(self, source: SubSource) -> Collate:
        """The collate function of one source's batches."""
        return Collate(self._carried(source)) if source.modalities else self.collate

    def _carried(self, source: SubSource) -> list[Modality]:
        return [m for m in self.modalities if m.name in source.modalities]


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
        part = c.rank * n_workers + worker
        seed = f"{c.seed}/{src.name}" if len(c.sources) > 1 else c.seed
        if c.resampled:
            rng = random.Random(f"{seed}/{epoch}/{part}")

            def read(url: str) -> Iterator[Sample]:
                count_silent_damage(url, handler)
                return read_shard(url, handler, c.remote, src.counts.get(url))

            samples = resampled_samples(src.urls, rng, read)
        else:
            order = shard_order(src.urls, seed, epoch, c.shuffle)
            samples = reader_samples(
                order, c.rank, c.world, worker, n_workers, handler, block=c.batch_size,
                remote=c.remote, counts=src.counts,
            )  # fmt: skip
        rng = random.Random(f"{seed}/{epoch}/{part}/shuffle")
        return shuffle_buffer(samples, c.shuffle_buffer if c.shuffle else 1, rng)

    def _groups(
        self, worker: int, n_workers: int, handler: SkipCounter
    ) -> Iterator[tuple[str, list]]:
        """(source name, decoded samples) per batch."""
        c = self.cfg
        give_up = MAX_BAD_IN_A_ROW if c.resampled else None  # an epoch of shards ends anyway
        if len(c.sources) == 1:
            decoder = c.decoder_of(c.sources[0], self.epoch)
            samples = self._samples(c.sources[0], self.epoch, worker, n_workers, handler)
            decoded = decode_samples(samples, decoder, handler, give_up)
            for group in batched(decoded, c.batch_size, c.drop_last):
                yield c.sources[0].name, group
            return

        def endless(src: SubSource) -> Iterator[Sample]:
            # resampled sources draw anew in each of the loader's epochs (counted in samples)
            for epoch in itertools.count(self.epoch if c.resampled else 0):
                samples = self._samples(src, epoch, worker, n_workers, handler)
                n = 0
                for sample in decode_samples(samples, c.decoder_of(src, epoch), handler, give_up):
                    n += 1
                    yield sample
                if n == 0:  # every sample bad (or none here): another epoch would spin
                    raise DataError(
                        f"data source {src.name!r} gives no samples to rank {c.rank}, worker "
                        f"{worker}{_skipped_note(handler.count)}"
                    )

        streams = [endless(src) for src in c.sources]
        rng = random.Random(f"{c.seed}/{self.epoch}/{c.rank}/{worker}/mix")
        probs = [src.prob for src in c.sources]
        while True:
            (i,) = rng.choices(range(len(streams)), weights=probs)
            group = list(itertools.islice(streams[i], c.batch_size))
            if len(group) < c.batch_size:
                raise DataError(
                    f"data source {c.sources[i].name!r} gives no samples to rank {c.rank}, "
                    f"worker {worker}{_skipped_note(handler.count)}"
                )
            yield c.sources[i].name, group

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info else (0, 1)
        if info is not None:
            torch.set_num_threads(1)  # workers decode; the main process owns the cores
        c = self.cfg
        handler = SkipCounter()
        skip = self.skip[worker] if worker < len(self.skip) else 0
        collate = {src.name: c.collate_of(src) for src in c.sources}
        for index, (source, group) in enumerate(self._groups(worker, n_workers, handler)):
            if index < skip:
                continue
            batch = collate[source](group)
            batch[SOURCE] = source
            g = batch_generator(c.seed, self.epoch, c.rank, worker, index)
            for transform in c.transforms:
                batch = transform(batch, g)
            batch[WORKER] = worker
            batch[SKIPPED] = handler.count
            yield batch
        yield {END: worker, SKIPPED: handler.count}


@dataclass
class DataState:
    """Where a rank's stream stands: the epoch and how many batches each worker has given."""

    epoch: int = 0
    consumed: list[int] = field(default_factory=list)
    #: the worker whose batch comes next in the fixed round-robin order
    next_worker: int = 0
    #: bad samples skipped so far in earlier epochs (this epoch's are added live)
    skipped_before: int = 0
    #: with resampled shards: this epoch's length in samples, all ranks together; with the
    #: seed, the epoch and ``consumed`` it fixes every worker's draws (0 = endless; None =
    #: not resampled, or set from the stream when the loader starts)
    epoch_samples: int | None = None


#: a rank's answer to "a next batch in this epoch?" (see ``Loader``'s ``agree``)
HAVE, DONE, EMPTY = 0, 1, 2


class Loader:
    """Endless iterator of training batches over epochs, with an exact, resumable order.

    A DataLoader hands out worker batches round-robin, always starting at worker 0; a
    resumed run must continue where the old order left off. So batches are released in the
    order (next_worker, next_worker+1, ...) skipping finished workers, holding at most one
    early batch per worker.

    ``agree`` (under DDP): given this rank's status for the next batch (``HAVE``, ``DONE``:
    its epoch is over, ``EMPTY``: over without a batch) returns every rank's, so that all
    ranks end each epoch at the same step, when the first runs out. A rank that went on
    alone into its next epoch would read again what other ranks still read in theirs.
    """

    def __init__(
        self,
        cfg: StreamConfig,
        num_workers: int,
        state: DataState | None = None,
        agree: Callable[[int], list[int]] | None = None,
    ):
        self.cfg = cfg
        self.num_workers = num_workers
        self.n = max(num_workers, 1)
        self.state = state or DataState()
        if cfg.resampled and self.state.epoch_samples is None:
            # a checkpoint without it holds an older version's endless resampled stream: it
            # goes on endless, so that the resumed run reads what it would have read
            self.state.epoch_samples = 0 if any(self.state.consumed) else cfg.epoch_samples
        self.skipped_now = [0] * self.n
        self.agree = agree
        #: start the next epoch's workers while this one runs (see ``__iter__``)
        self.prestart = True

    @property
    def skipped(self) -> int:
        """Bad samples this rank skipped so far (all epochs)."""
        return self.state.skipped_before + sum(self.skipped_now)

    def _quota(self) -> int | None:
        """Batches each worker gives in this epoch of resampled shards (None: as many as
        its share of the shards holds): the epoch's samples split over ranks and workers,
        rounded down to whole batches, at least one."""
        samples = self.state.epoch_samples
        if not self.cfg.resampled or not samples:
            return None
        return max(1, samples // (self.cfg.world * self.n * self.cfg.batch_size))

    def _open_epoch(self, epoch: int, skip: list[int]) -> Iterator[dict[str, Any]]:
        """The worker batches of ``epoch``; the workers start now and fill their prefetch."""
        dataset = ShardStream(self.cfg, epoch, skip=skip)
        loader = DataLoader(
            dataset,
            batch_size=None,
            num_workers=self.num_workers,
            persistent_workers=False,
            prefetch_factor=4 if self.num_workers else None,
            # Its own generator: drawing worker seeds from the global RNG would shift
            # dropout after a resume. (All data randomness is seeded by the stages anyway.)
            generator=torch.Generator().manual_seed(self.cfg.seed + epoch),
        )
        return iter(loader)

    def _check_state(self) -> None:
        st = self.state
        if len(st.consumed) != self.n:
            if any(st.consumed):
                raise ValueError(
                    f"cannot resume mid-epoch with {self.n} loader workers: the checkpoint "
                    f"was written with {len(st.consumed)} "
                    f"(set data.num_workers={len(st.consumed)})"
                )
            st.consumed = [0] * self.n

    def _epoch_batches(
        self, it: Iterator[dict[str, Any]] | None = None
    ) -> Iterator[dict[str, Any]]:
        """This epoch's batches in the fixed worker order, from the worker batches ``it``
        (default: the epoch of ``self.state``, opened now)."""
        if it is None:
            self._check_state()
            it = self._open_epoch(self.state.epoch, self.state.consumed)
        st = self.state
        quota = self._quota()
        pending: dict[int, dict[str, Any]] = {}
        done: set[int] = set()
        while len(done) < self.n:
            w = st.next_worker
            if quota is not None and st.consumed[w] >= quota:
                done.add(w)  # an endless resampled stream: the epoch ends at its quota
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

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # one pass over one source ends, and an epoch of resampled shards at its samples;
        # mixtures are endless
        ends = len(self.cfg.sources) == 1 and not self.cfg.resampled
        ends = ends or bool(self.cfg.resampled and self.state.epoch_samples)
        upcoming: Iterator[dict[str, Any]] | None = None
        while True:
            self._check_state()
            st = self.state
            if upcoming is None:
                upcoming = self._open_epoch(st.epoch, st.consumed)
            current, upcoming = upcoming, None
            batches = self._epoch_batches(current)
            while True:
                batch = next(batches, None)
                if batch is not None:
                    status = HAVE
                else:
                    status = DONE if any(self.state.consumed) else EMPTY
                statuses = self.agree(status) if self.agree and ends else [status]
                if any(s != HAVE for s in statuses):
                    break
                yield batch
                if ends and upcoming is None and self.prestart:
                    # The next epoch's workers start now and wait with their prefetched
                    # batches, so an epoch boundary costs no worker start-up and no
                    # shuffle-buffer fill (a stall of ~0.5 s per epoch on 2 cores). Its
                    # batches depend on the seed and epoch only: the order is unchanged.
                    upcoming = self._open_epoch(st.epoch + 1, [0] * self.n)
            batches.close()
            del current
            if len(statuses) == 1:  # no agreement: this rank alone
                statuses = [
                    statuses[0] if r == self.cfg.rank else HAVE for r in range(self.cfg.world)
                ]
            empty = [r for r, s in enumerate(statuses) if s == EMPTY]
            if empty:
                raise self._no_batch(empty)
            self.state = DataState(
                epoch=self.state.epoch + 1,
                skipped_before=self.skipped,
                epoch_samples=self.cfg.epoch_samples if self.cfg.resampled else None,
            )
            self.skipped_now = [0] * self.n

    def _no_batch(self, ranks: list[int]) -> DataError:
        c = self.cfg
        shards = sum(len(s.urls) for s in c.sources)
        if c.world == 1:
            who, readers = "", f"{self.n} loader workers"
        else:
            who = f" rank {ranks[0]}" if len(ranks) == 1 else f" ranks {ranks}"
            readers = f"{c.world} ranks x {self.n} loader workers"
        note = _skipped_note(self.skipped) if c.rank in ranks else ""
        return DataError(
            f"epoch {self.state.epoch} gave{who} no batch{note}: too few samples for "
            f"data.batch_size={c.batch_size} in {shards} shards for {readers} (smaller "
            "batches, fewer workers, more shards, or data.resampled=true)"
        )


def _skipped_note(count: int) -> str:
    return f" ({count} bad samples were skipped, see the warnings above)" if count else ""


def single_pass(cfg: StreamConfig, num_workers: int = 0) -> Iterator[dict[str, Any]]:
    """One ordered pass over the data (evaluation): no shuffling or random choices, last
    batch kept."""
    cfg = replace(
        cfg,
        shuffle=False,
        drop_last=False,
        resampled=False,
        decoder=replace(cfg.decoder, train=False),
    )
    loader = Loader(cfg, num_workers)
    return loader._epoch_batches()


def mixture(
    sources: dict[str, SourceConfig], remote: RemoteOptions | None = None
) -> list[SubSource]:
    """Sub-sources with batch probabilities: source weights × per-language α-sampling."""
    if not sources:
        raise ValueError("data.sources is empty")
    total = sum(src.weight for src in sources.values())
    if total <= 0 or any(src.weight < 0 for src in sources.values()):
        raise ValueError("data.sources weights must be >= 0 and not all 0")
    subs: list[SubSource] = []
    for name, src in sources.items():
        share = src.weight / total
        carried = tuple(src.modalities)
        if not src.languages:
            subs.append(SubSource(name, expand_shards(src.shards), share, carried))
            continue
        if "{lang}" not in src.shards:
            raise ValueError(f"data.sources.{name}.shards needs a {{lang}} placeholder")
        urls = {lang: expand_shards(src.shards.replace("{lang}", lang)) for lang in src.languages}
        n = {lang: count_samples(u, remote) for lang, u in urls.items()}
        q = {lang: (n[lang] / sum(n.values())) ** src.alpha for lang in urls}
        z = sum(q.values())
        subs += [
            SubSource(f"{name}/{lang}", urls[lang], share * q[lang] / z, carried) for lang in urls
        ]
    return subs


def stream_config(
    cfg: DataConfig,
    tokenizer: Any,
    *,
    needs: Mapping[str, Need],
    split: str = "train",
    transforms: Sequence[BatchTransform] = (),
    seed: int = 0,
    rank: int = 0,
    world: int = 1,
    shards: str | None = None,
) -> StreamConfig:
    """Assemble the stages' settings for one split.

    ``needs`` says what the model reads (``PretrainModel.data_needs()``); one plug-in per
    modality in it decodes and collates, configured by ``cfg.modalities``. ``transforms``
    (the objectives' data sides) run after the plug-ins' own batch stages, by priority.
    """
    spec = shards if shards is not None else getattr(cfg, split)
    remote = RemoteOptions(
        cfg.retries, cfg.timeout_s, cache_dir=cfg.cache_dir, cache_gb=cfg.cache_gb
    )
    if split == "train" and shards is None and cfg.sources:
        if cfg.train:
            names = ", ".join(cfg.sources)
            raise ValueError(
                f"set data.train or data.sources ({names}), not both: point the sources at "
                "your shards (data.sources.<name>.shards=...) or train on data.train alone "
                "(data.sources=__delete__)"
            )
        sources = mixture(cfg.sources, remote)
    elif not spec:
        raise ValueError(f"data.{split} is empty: give the shards of the {split} split")
    else:
        sources = [SubSource(split, expand_shards(spec))]
    resampled = cfg.resampled and split == "train"
    epoch_samples = _count_sources(cfg, sources, spec, remote, resampled)
    if cfg.batch_size < 1:
        raise ValueError(f"data.batch_size must be >= 1, got {cfg.batch_size}")
    if not needs:
        raise ValueError("the model declares no data it reads")
    context = DataContext(
        tokenizer=tokenizer,
        pairs={name: src.pairs for name, src in cfg.sources.items()},
        pack=packed_sources(cfg) if split == "train" else {},
    )
    modalities = build_modalities(needs, cfg.modalities, context)
    read = [m.name for m in modalities]
    for src in sources:
        unknown = sorted(set(src.modalities) - set(read))
        if unknown:
            raise ValueError(
                f"data.sources.{src.name.split('/')[0]}.modalities names {unknown}, which the "
                f"model does not read (it reads {read})"
            )
    stages = [t for m in modalities for t in m.transforms()] + list(transforms)
    return StreamConfig(
        sources=sources,
        decoder=Decoder(modalities, seed=seed, train=split == "train"),
        collate=Collate(modalities),
        transforms=sorted(stages, key=lambda t: t.data_priority),
        batch_size=cfg.batch_size,
        seed=seed,
        rank=rank,
        world=world,
        shuffle=split == "train",
        shuffle_buffer=cfg.shuffle_buffer,
        resampled=resampled,
        drop_last=split == "train",
        epoch_samples=epoch_samples,
        remote=remote,
    )


def _count_sources(
    cfg: DataConfig, sources: list[SubSource], spec: str, remote: RemoteOptions, resampled: bool
) -> int:
    """Give each source its remote shards' counts (a remote shard without a manifest is an
    error naming the spec to write one for); return a resampled epoch's samples (else 0)."""
    for src in sources:
        base, _, lang = src.name.partition("/")
        named = cfg.sources[base].shards.replace("{lang}", lang) if base in cfg.sources else ""
        src.counts = remote_counts(src.urls, remote, spec or named)
    if not resampled:
        return 0
    return cfg.epoch_samples or sum(count_samples(s.urls, remote) for s in sources)


def remote_counts(urls: Sequence[str], remote: RemoteOptions, spec: str) -> dict[str, int]:
    """The sample counts of a source's remote shards, from their manifest: what one that
    fails loses. A remote shard without one is an error saying how to write it."""
    far = [u for u in urls if is_remote(u)]
    return dict(zip(far, manifest_counts(far, remote, spec), strict=True)) if far else {}
