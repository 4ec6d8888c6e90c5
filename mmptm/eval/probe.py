"""Linear probes: how much of a class label a frozen model's vectors hold.

The model embeds the samples of a train and a test set through one encoder (``view``: the
audio of ESC-50 or toyworld's scene sounds, an image, a clip) with its weights frozen; a
multinomial logistic regression on those vectors, standardised with the train set's mean
and standard deviation, is fitted with L-BFGS and scored on the test set. The L2 strength
is chosen from :data:`L2_GRID` on a held-out fifth of the train set, then the probe is
refitted on all of it. The vector is the fusion's pooled vector of the view when it gives
one (dual encoders), else the mean of the view's hidden states over its real steps.

``random_init`` probes the same architecture with its initial weights (the scratch
baseline pre-training must beat). :func:`probe_folds` runs the k-fold protocol (ESC-50:
train on four folds, test on the fifth, five times) and reports the mean.
Legend: N samples, E vector width, C classes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from mmptm.batch import END, move_to
from mmptm.data.pipeline import single_pass, stream_config
from mmptm.modalities.base import Need
from mmptm.models.load import build_model, load_pretrained
from mmptm.models.pretrain import PretrainModel

L2_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)


@torch.no_grad()
def embed_set(
    model: PretrainModel, cfg: Any, tokenizer: Any, shards: str, view: str, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Vectors [N,E] of the view and labels [N] of every sample of ``shards``."""
    if view not in model.encoders:
        raise ValueError(f"the model has no encoder {view!r} (has {sorted(model.encoders)})")
    needs = {**model.encoders[view].data_needs(), "label": Need("label")}
    stream = stream_config(cfg.data, tokenizer, split="test", shards=shards, needs=needs)
    xs, ys = [], []
    for batch in single_pass(stream):
        if END in batch:
            continue
        out = model.fuse(move_to(batch, device))
        if view in out.pooled:
            v = out.pooled[view]
        else:
            h, m = out.hidden[view], out.mask[view].unsqueeze(-1).to(out.hidden[view].dtype)
            v = (h * m).sum(1) / m.sum(1).clamp_min(1)
        xs.append(v.float().cpu())
        ys.append(batch["labels"].cpu())
    if not xs:
        raise ValueError(f"{shards}: no labelled samples")
    return torch.cat(xs), torch.cat(ys)


def fit_logistic(
    x_NE: torch.Tensor, y_N: torch.Tensor, classes: int, l2: float, steps: int = 200
) -> torch.Tensor:
    """Weights [E+1,C] (last row: bias) of an L2-regularised softmax regression (L-BFGS)."""
    x = torch.cat([x_NE, torch.ones(len(x_NE), 1)], 1).double()
    w = torch.zeros(x.shape[1], classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w], lr=1.0, max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(x @ w, y_N) + l2 * (w[:-1] ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach()


def _accuracy(w: torch.Tensor, x_NE: torch.Tensor, y_N: torch.Tensor) -> float:
    x = torch.cat([x_NE, torch.ones(len(x_NE), 1)], 1).double()
    return (x @ w).argmax(1).eq(y_N).double().mean().item()


def probe(
    train: tuple[torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor]
) -> dict[str, float]:
    """Test accuracy of a probe fitted on ``train`` (vectors, labels); chance = the share
    of the train set's most frequent class among the test labels."""
    (xa, ya), (xb, yb) = train, test
    classes = int(max(ya.max(), yb.max())) + 1
    mean, std = xa.mean(0), xa.std(0).clamp_min(1e-6)
    xa, xb = (xa - mean) / std, (xb - mean) / std
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(xa), generator=g)
    held = order[: max(1, len(xa) // 5)]
    fit = order[len(held) :]
    best = max(
        L2_GRID,
        key=lambda l2: _accuracy(fit_logistic(xa[fit], ya[fit], classes, l2), xa[held], ya[held]),
    )
    w = fit_logistic(xa, ya, classes, best)
    majority = int(torch.bincount(ya, minlength=classes).argmax())
    return {
        "n_train": float(len(xa)),
        "n_test": float(len(xb)),
        "acc": _accuracy(w, xb, yb),
        "train_acc": _accuracy(w, xa, ya),
        "chance": (yb == majority).double().mean().item(),
        "l2": best,
    }


def _model(path: str, overrides: Sequence[str], random_init: bool, device: str):
    model, tokenizer, cfg = load_pretrained(path, overrides)
    if random_init:
        torch.manual_seed(cfg.seed)
        model, tokenizer = build_model(cfg)
        model.eval()
    return model.to(device), tokenizer, cfg


def default_view(model: PretrainModel) -> str:
    """The first encoder that does not read text (what a probe usually asks about)."""
    for name, enc in model.encoders.items():
        if enc.modality != "text":
            return name
    raise ValueError("the model has only text encoders: give --view")


def evaluate_probe(
    path: str,
    *,
    train: str,
    test: str,
    view: str = "",
    overrides: Sequence[str] = (),
    random_init: bool = False,
    device: str = "cpu",
) -> dict[str, float]:
    """Linear-probe accuracy of a run's ``view`` vectors: fitted on ``train``, scored on
    ``test`` (shard specs whose json has ``label``; label names come from the recipe's
    ``data.modalities.label`` or an override)."""
    model, tokenizer, cfg = _model(path, overrides, random_init, device)
    view = view or default_view(model)
    return probe(
        embed_set(model, cfg, tokenizer, train, view, device),
        embed_set(model, cfg, tokenizer, test, view, device),
    )


def probe_folds(
    path: str,
    *,
    folds: Sequence[str],
    view: str = "",
    overrides: Sequence[str] = (),
    random_init: bool = False,
    device: str = "cpu",
) -> dict[str, float]:
    """The k-fold protocol: each fold is the test set once, the others the train set;
    returns the mean and standard deviation of the accuracies and each fold's."""
    if len(folds) < 2:
        raise ValueError(f"the fold protocol needs at least 2 folds, got {len(folds)}")
    model, tokenizer, cfg = _model(path, overrides, random_init, device)
    view = view or default_view(model)
    sets = [embed_set(model, cfg, tokenizer, f, view, device) for f in folds]
    accs, chances = [], []
    for k in range(len(sets)):
        rest = [s for i, s in enumerate(sets) if i != k]
        train = (torch.cat([x for x, _ in rest]), torch.cat([y for _, y in rest]))
        r = probe(train, sets[k])
        accs.append(r["acc"])
        chances.append(r["chance"])
    mean = sum(accs) / len(accs)
    std = math.sqrt(sum((a - mean) ** 2 for a in accs) / len(accs))
    out = {"acc": mean, "acc_std": std, "chance": sum(chances) / len(chances)}
    out.update({f"fold{i + 1}_acc": a for i, a in enumerate(accs)})
    return out


def format_probe(rows: dict[str, dict[str, float]]) -> str:
    """One line per named probe result: accuracy (± std over folds) and chance."""
    lines = [f"{'':<24}{'accuracy':>12}{'chance':>10}"]
    for name, r in rows.items():
        acc = f"{100 * r['acc']:.1f}%"
        if "acc_std" in r:
            acc += f" ± {100 * r['acc_std']:.1f}"
        lines.append(f"{name:<24}{acc:>12}{100 * r['chance']:>9.1f}%")
    return "\n".join(lines)


__all__ = [
    "L2_GRID",
    "default_view",
    "embed_set",
    "evaluate_probe",
    "fit_logistic",
    "format_probe",
    "probe",
    "probe_folds",
]
