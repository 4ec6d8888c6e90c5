"""The runs and files objectives' configs name, loaded here and handed to the objectives.

Objectives sit a floor below the checkpoints, so an objective declares what it needs
(:meth:`~mmptm.objectives.base.Objective.resources`: keyword →
:class:`~mmptm.objectives.base.Resource`); :func:`build_objective` loads it and builds the
objective with it, and :func:`objective_data_transform` hands the data side what it declared
for it. One loader per kind of resource (:data:`LOADERS`): a frozen encoder of an earlier run
(:func:`load_encoder`, through :mod:`mmptm.models.checkpoint`, so a sharded ``.dcp``
checkpoint serves as a ``.pt`` file does; ``mmptm units fit --audio-features RUN`` loads
HuBERT's teacher with it too), a list of lines (an answer vocabulary), a knowledge graph's
aliases.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mmptm.batch import BatchTransform
from mmptm.encoders.base import Encoder, VocabInfo
from mmptm.kg.graph import read_aliases
from mmptm.models import checkpoint
from mmptm.objectives.base import Aliases, Lines, Objective, Resource, RunEncoder
from mmptm.registry import ENCODERS, OBJECTIVES


def load_encoder(
    run: str | Path, *, modality: str, view: str = "", name: str = "",
    vocab: VocabInfo | None = None,
) -> Encoder:  # fmt: skip
    """An encoder of an earlier run (a checkpoint file or folder, or a run dir: its newest
    readable one), built from the run's saved config, loaded with its ``encoders.<view>.*``
    weights, frozen and in eval mode, on the CPU.

    ``view``: its name in that run; "" = ``name`` where the run has an encoder of that name,
    else the run's only encoder of ``modality``. ``name``: the view it is built as here (its
    batch keys); "" = its name in the run. ``vocab``: for encoders that read text.
    """
    ckpt = checkpoint.read(run)
    model = ckpt.run_config().model
    src = view or _only_encoder(model.encoders, modality, name, ckpt.path)
    if src not in model.encoders:
        raise ValueError(
            f"{ckpt.path}: model.encoders has no {src!r} (has {sorted(model.encoders)})"
        )
    enc = ENCODERS.build(
        model.encoders[src], width=model.widths.get(src, model.width),
        vocab=vocab or VocabInfo(vocab_size=1), name=name or src, built={},
    )  # fmt: skip
    head = f"encoders.{src}."
    weights = {k[len(head) :]: v for k, v in ckpt.model.items() if k.startswith(head)}
    try:
        missing, unexpected = enc.load_state_dict(weights, strict=False)
    except RuntimeError as e:  # shapes that differ
        why = str(e).strip().splitlines()[-1].strip()
        raise ValueError(
            f"{ckpt.path}: encoders.{src} weights do not fit its config ({why})"
        ) from None
    if missing or unexpected:
        raise ValueError(
            f"{ckpt.path}: encoders.{src} weights do not fit its config (missing "
            f"{sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    return enc.requires_grad_(False).eval()


def _only_encoder(encoders: Mapping[str, Any], modality: str, name: str, path: Path) -> str:
    if name in encoders:
        return name
    found = [n for n, c in encoders.items() if ENCODERS.get(c.type).modality == modality]
    if len(found) != 1:
        raise ValueError(
            f"{path}: cannot tell the {modality} encoder among {sorted(encoders)}; name it "
            "(e.g. hubert.teacher_view)"
        )
    return found[0]


def read_lines(path: str | Path, what: str = "list") -> list[str]:
    """A text file's non-empty lines, in order (an answer vocabulary: one answer a line)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line]


#: resource kind → its loader (resource, vocabulary) → what the objective is handed
LOADERS: dict[type[Resource], Callable[[Any, VocabInfo | None], Any]] = {
    RunEncoder: lambda r, vocab: load_encoder(
        r.path, modality=r.modality, view=r.view, name=r.name, vocab=vocab
    ),
    Lines: lambda r, vocab: read_lines(r.path, r.key),
    Aliases: lambda r, vocab: read_aliases(r.path),
}


def load_resources(
    cfg: Any, vocab: VocabInfo | None = None, *, data_side: bool = False
) -> dict[str, Any]:
    """The resources an objective's config names, loaded (``data_side``: only those its
    data side needs), by the keyword they are handed as."""
    declared = OBJECTIVES.get(cfg.type).resources(cfg)
    out = {}
    for key, res in declared.items():
        if data_side and not res.data_side:
            continue
        loader = LOADERS.get(type(res))
        if loader is None:
            raise TypeError(f"{res.key}: no loader for a {type(res).__name__} resource")
        out[key] = loader(res, vocab)
    return out


def build_objective(cfg: Any, vocab: VocabInfo | None = None, **context: Any) -> Objective:
    """The objective of ``cfg`` with its resources loaded (``context``: the model's parts,
    as :class:`~mmptm.models.pretrain.PretrainModel` gives them)."""
    resources = load_resources(cfg, vocab)
    clash = sorted(set(resources) & {*context, "vocab"})
    if clash:
        raise TypeError(f"{cfg.type}: resources {clash} shadow the model's own arguments")
    return OBJECTIVES.build(cfg, vocab=vocab, **context, **resources)


def objective_data_transform(cfg: Any, vocab: VocabInfo) -> BatchTransform | None:
    """The objective's data side, handed the resources it declares for it."""
    resources = load_resources(cfg, vocab, data_side=True)
    return OBJECTIVES.get(cfg.type).data_transform(cfg, vocab, **resources)


__all__ = [
    "LOADERS",
    "build_objective",
    "load_encoder",
    "load_resources",
    "objective_data_transform",
    "read_lines",
]
