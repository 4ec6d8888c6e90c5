"""What a modality plug-in is, what the model's parts declare they need, and building plug-ins.

A plug-in turns one kind of shard member into batch tensors: it names the members it reads,
decodes a sample (in loader workers; ``ValueError`` = a bad sample, skipped and counted),
augments it when training, collates samples into padded tensors with boolean masks, and may
add batch-level stages (``transforms``). Encoders, fusion modules and objectives declare
what they read as ``{view: Need(modality, facts)}``: a *view* is a name for one input of a
modality (the encoder's recipe name; ``text2`` for a pair's second sentence), and *facts*
are settings of the plug-in's ``Config`` that the declaring part fixes (an image encoder's
input size, mean and std, as timm's ``resolve_data_config``). The pipeline merges the needs
of the whole model, adds the recipe's ``data.modalities`` settings and builds one plug-in
per modality with :func:`build_modalities`.

A view named like its modality writes the plug-in's keys as they are (``input_ids``,
``pixels``); any other view prefixes them with ``<view>_`` (``text2_input_ids``).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mmptm.batch import BatchTransform
from mmptm.config import ConfigError, from_dict, to_dict
from mmptm.registry import MODALITIES

#: a raw sample from a shard: member extension → bytes, plus ``__key__`` and ``__url__``
Sample = dict[str, Any]


@dataclass(frozen=True)
class Need:
    """A part reads ``modality`` and fixes these settings (``facts``) of its plug-in."""

    modality: str
    facts: Mapping[str, Any] = field(default_factory=dict)


def view_prefix(modality: str, view: str) -> str:
    """Key prefix of a view: none when it is named like its modality, else ``<view>_``."""
    return "" if view == modality else f"{view}_"


@dataclass
class DataContext:
    """What any plug-in may use besides its own config."""

    #: the run's tokenizer (text), or None
    tokenizer: Any = None
    #: every view the model reads, so a plug-in can refuse combinations it cannot serve
    needs: Mapping[str, Need] = field(default_factory=dict)
    #: ``data.sources`` name → how its two-sentence samples are packed: join | stack
    pairs: Mapping[str, str] = field(default_factory=dict)
    #: training source name → tokens per packed row ("" = ``data.train``): the sources whose
    #: rows the text plug-in packs (``data.sources.<name>.pack``)
    pack: Mapping[str, int] = field(default_factory=dict)


class Modality:
    """Base of the plug-ins; a subclass registers with ``MODALITIES`` and has a ``Config``."""

    #: shard members it reads, by extension (the json fields it reads are in its docstring)
    members: ClassVar[tuple[str, ...]] = ()
    #: batch keys one view writes, before the view prefix
    keys: ClassVar[tuple[str, ...]] = ()
    #: views one sample can give (text: the two sentences of a pair)
    max_views: ClassVar[int] = 1

    def __init__(self, cfg: Any, *, views: Sequence[str], context: DataContext) -> None:
        name = type(self).registry_name  # type: ignore[attr-defined]
        if not 1 <= len(views) <= self.max_views:
            raise ValueError(
                f"modality {name!r} gives at most {self.max_views} view(s) per sample; the "
                f"model reads {list(views)}"
            )
        self.name = name
        self.cfg = cfg
        self.views = list(views)
        self.context = context

    def prefix(self, view: str) -> str:
        return view_prefix(self.name, view)

    def view_keys(self, view: str) -> list[str]:
        """The batch keys of one view (prefixed)."""
        return [self.prefix(view) + k for k in self.keys]

    def decode(self, sample: Sample, meta: dict[str, Any], rng: random.Random | None) -> Sample:
        """This modality's part of one decoded sample.

        ``meta`` is the parsed ``json`` member ({} without one). ``rng`` is the sample's
        generator when training (random choices allowed) and None when evaluating.
        Raises ``ValueError`` naming what is wrong with a bad sample.
        """
        raise NotImplementedError

    def augment(self, item: Sample, rng: random.Random) -> Sample:
        """Training-time augmentation of :meth:`decode`'s output (default: none)."""
        return item

    def collate(self, samples: Sequence[Sample]) -> dict[str, Any]:
        """Batch tensors of this modality's keys: stacked, or padded with a boolean mask."""
        raise NotImplementedError

    def transforms(self) -> list[BatchTransform]:
        """Batch-level stages this modality adds to the pipeline (default: none)."""
        return []

    @classmethod
    def preview(cls, sample: Sample, size: int) -> Any:
        """A picture of the sample for people (a PIL RGB image, longest side <= ``size``), or
        None when this plug-in has nothing to show (the default). A search index stores it
        as the item's thumbnail. Raises ``ValueError`` for a member it cannot read."""
        return None


def find_member(sample: Sample, extensions: Iterable[str]) -> str | None:
    """The first of ``extensions`` the sample has as a member."""
    return next((ext for ext in extensions if ext in sample), None)


def read_id_list(path: str) -> dict[str, int]:
    """An id list (one id per line, row i = line i) as id → row."""
    try:
        with open(path, encoding="utf-8") as f:
            names = [line.rstrip("\r\n") for line in f]
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file (an id list)") from None
    rows = {n: i for i, n in enumerate(names)}
    if len(rows) != len(names) or "" in rows:
        raise ValueError(f"{path}: an id list needs one distinct, non-empty id per line")
    return rows


def segment_indices(n: int, count: int, rng: random.Random | None) -> list[int]:
    """``count`` indices spread over ``n`` items in equal segments: a random item of each
    segment with ``rng``, each segment's centre without; all ``n`` items if ``n <= count``
    (the frames of a clip, the steps of a feature sequence)."""
    if n <= count:
        return list(range(n))
    seg = n / count
    return [min(int(seg * (k + (rng.random() if rng else 0.5))), n - 1) for k in range(count)]


def merge_needs(declared: Iterable[tuple[str, Mapping[str, Need]]]) -> dict[str, Need]:
    """One ``Need`` per view from ``(declarer, needs)`` pairs, in order of appearance.

    Two declarers of one view must agree on its modality and on every fact they both set;
    mapping-valued facts (e.g. text ``spans``) are merged key by key.
    """
    merged: dict[str, Need] = {}
    setter: dict[tuple[str, str], str] = {}  # (view, fact; "" = the view itself) → declarer
    for who, needs in declared:
        for view, need in needs.items():
            have = merged.get(view)
            if have is not None and have.modality != need.modality:
                raise ValueError(
                    f"{who} reads view {view!r} as {need.modality!r}, but "
                    f"{setter[(view, '')]} reads it as {have.modality!r}"
                )
            facts = dict(have.facts) if have is not None else {}
            for key, value in need.facts.items():
                if key in facts:
                    facts[key] = _agree(
                        facts[key], value, f"{view}.{key}", who, setter[(view, key)]
                    )
                else:
                    facts[key] = value
                    setter[(view, key)] = who
            setter.setdefault((view, ""), who)
            merged[view] = Need(need.modality, facts)
    return merged


def _agree(old: Any, new: Any, where: str, who: str, other: str) -> Any:
    """The merged value of a fact two parts declare; an error naming both if they differ."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for k in old.keys() & new.keys():
            if old[k] != new[k]:
                raise ValueError(
                    f"{who} and {other} disagree on {where}.{k}: {new[k]!r} vs {old[k]!r}"
                )
        return {**old, **new}
    if _plain(old) != _plain(new):
        raise ValueError(f"{who} and {other} disagree on {where}: {new!r} vs {old!r}")
    return old


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def build_modalities(
    needs: Mapping[str, Need], configs: Mapping[str, Any], context: DataContext
) -> list[Modality]:
    """One plug-in per modality the ``needs`` name, configured by ``data.modalities``.

    A fact a part declares fills the matching key of the plug-in's ``Config``; a recipe
    that also sets that key to something else gets an error naming both.
    """
    views: dict[str, list[str]] = {}
    for view, need in needs.items():
        views.setdefault(need.modality, []).append(view)
    context = dataclasses.replace(context, needs=dict(needs))
    plugins = []
    for modality, names in views.items():
        cls = MODALITIES.get(modality, where=f"view {names[0]!r}")
        given = configs.get(modality)
        base = to_dict(given) if given is not None else {"type": modality}
        tree = dict(base)
        for view in names:
            for key, value in needs[view].facts.items():
                where = f"data.modalities.{modality}.{key}"
                if key not in {f.name for f in dataclasses.fields(cls.Config)} or key == "type":
                    raise ConfigError(f"view {view!r} declares {where}, which is not a setting")
                default = getattr(cls.Config(), key)
                given = tree.get(key, default)
                if isinstance(value, Mapping) and isinstance(given, Mapping):
                    try:  # e.g. text spans: the recipe's and the model's, key by key
                        tree[key] = _agree(given, value, where, f"view {view!r}", "the recipe")
                    except ValueError as e:
                        raise ConfigError(str(e)) from None
                elif _plain(given) not in (_plain(default), _plain(value)):
                    raise ConfigError(
                        f"{where}={given!r} contradicts what the model declares for view "
                        f"{view!r}: {value!r} (leave {where} unset)"
                    )
                else:
                    tree[key] = value
        cfg = from_dict(cls.Config, tree, f"data.modalities.{modality}")
        plugins.append(cls(cfg, views=names, context=context))
    return plugins


__all__ = [
    "DataContext",
    "Modality",
    "Need",
    "Sample",
    "build_modalities",
    "find_member",
    "merge_needs",
    "read_id_list",
    "view_prefix",
]
