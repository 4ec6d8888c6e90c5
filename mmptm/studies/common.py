"""What the studies share: toyworld and a tokenizer under a study's folder, a recipe's toyworld
paths moved there, the clock of a study's steps, results.json and training curves."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mmptm import toyworld
from mmptm.config import load_yaml_tree
from mmptm.eval.curves import plot_curves
from mmptm.models import checkpoint
from mmptm.models.load import init_from
from mmptm.recipe import RecipeInfo, RunConfig
from mmptm.tokenizers.sentencepiece import train_tokenizer

#: toyworld's languages (Russian the non-Latin one), as the multilingual recipes read them
LANGS = ("en", "de", "fr", "ru", "es")


def prepare_data(
    out: Path,
    n_train: int,
    n_test: int,
    seed: int,
    languages: Sequence[str],
    vocab_size: int,
    views: Sequence[str] = ("image_text",),
    model_type: str = "unigram",
    write: Sequence[str] | None = None,
    fit_to_data: bool = False,
) -> Path:
    """toyworld under ``out`` (the ``write`` views; default: the image and text views) and a
    tokenizer trained on the train shards of ``views`` (``fit_to_data``: see
    :func:`train_tokenizer`)."""
    data = out / "toyworld"
    toyworld.generate(
        data, n_train=n_train, n_val=n_test, n_test=n_test, seed=seed, languages=languages,
        views=write, progress=True,
    )  # fmt: skip
    shards = sorted(p for view in views for p in (data / view).glob("train-*.tar"))
    train_tokenizer(
        shards, data / "tokenizer", vocab_size=vocab_size, seed=seed, model_type=model_type,
        fit_to_data=fit_to_data,
    )  # fmt: skip
    return data


def relocated(recipe: str, data: Path) -> list[str]:
    """Overrides that move every ``data/toyworld`` path of a recipe (shards of every split and
    source, tokenizer, codebooks, entity vectors, graph files) to a study's data, which has
    toyworld's layout."""
    over: list[str] = []

    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(node, str) and node.startswith("data/toyworld"):
            over.append(f"{key}={node.replace('data/toyworld', str(data), 1)}")

    walk(load_yaml_tree(recipe), "")
    return over


def recipe_views(recipe: str) -> set[str]:
    """The toyworld views (``data/toyworld/<view>/...``) a pre-training recipe reads."""
    moved = relocated(recipe, Path("@"))
    return {o.split("=", 1)[1].split("/")[1] for o in moved if o.split("=", 1)[1].count("/") > 1}


@contextmanager
def timed(times: dict[str, float], key: str) -> Iterator[None]:
    """Add the seconds the block takes to ``times`` under ``key`` (a study's steps, reported
    with its results)."""
    start = time.perf_counter()
    yield
    times[key] = time.perf_counter() - start


def format_seconds(times: Mapping[str, float]) -> str:
    """The one-line account of where a study's time went."""
    return "seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in times.items())


def run_key(cfg: RunConfig) -> str:
    """A digest of what decides a run's result: its config, with the architecture that an
    ``init_mode: architecture`` start copies resolved (then the run it came from no longer
    matters), without where it is written, whether it resumes, or its ``info``.

    Within one study (one data folder, one machine and thread count) two runs with the same
    key train the same model from the same seed on the same data, so a study trains the
    first and reuses it for the second: from-scratch fine-tunings of recipes that share an
    architecture (UNITER, ImageBERT and Unicoder-VL differ only in pre-training heads).
    """
    c = copy.deepcopy(cfg)
    if c.init_mode == "architecture":
        init_from(c)  # reads the checkpoint's config, not its weights' values
        c.init = ""
    c.output_dir, c.resume, c.info = "", False, RecipeInfo()
    text = json.dumps(dataclasses.asdict(c), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def checkpoint_stamp(run: Path) -> dict[str, Any]:
    """Which checkpoint a run's evaluation reads (the latest), with its size and time: it
    changes when the run trains on."""
    path = checkpoint.resolve(run)
    st = path.stat()
    return {"checkpoint": str(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def evaluated_once(
    out: Path, name: str, inputs: Mapping[str, Any], evaluate: Callable[[], Any]
) -> Any:
    """``evaluate()``, or the result an earlier call stored in ``out/evaluations/NAME.json``
    for the same ``inputs`` (JSON: a :func:`checkpoint_stamp`, the evaluation's settings).
    A resumed study thus re-scores only what changed, not every costly evaluation (ITM over
    all pairs of a 500-pair split takes minutes a run)."""
    path = out / "evaluations" / f"{name}.json"
    inputs = json.loads(json.dumps(inputs))  # as it reads back
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        if stored["inputs"] == inputs:
            return stored["result"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or unreadable: evaluate again
    result = evaluate()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"inputs": inputs, "result": result}, indent=1), encoding="utf-8")
    tmp.replace(path)
    return result


def write_results(out: Path, result: Mapping[str, Any]) -> None:
    """``out/results.json``, rewritten after every run so that a stopped study keeps its rows."""
    (out / "results.json").write_text(json.dumps(result, indent=2))


def draw_curves(
    out: Path, name: str, runs: Mapping[str, Path], metrics: Sequence[str], title: str
) -> Path:
    """A study's training curves (label → run) as ``out/name``; ``metrics`` are patterns, and
    those no run logs are passed over (recipes log different terms)."""
    path = plot_curves(runs, metrics, out / name, title=title, skip_missing=True)
    print(f"training curves: {path}")
    return path
