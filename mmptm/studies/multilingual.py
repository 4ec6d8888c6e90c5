"""The multilingual study (``mmptm demo multilingual``): MLM-only vs MLM+TLM vs MLM+TLM+XLCO
(sentence-level cross-lingual contrast) pre-training (same model, same steps), compared on
cross-lingual sentence retrieval (Tatoeba protocol) and zero-shot XNLI (fine-tune on English,
test every language), against a from-scratch model of the same shape, over seeds."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmptm.eval.classification import evaluate_sets, format_accuracy
from mmptm.eval.xlingual import evaluate_xlingual
from mmptm.recipe import load_run_config
from mmptm.studies.common import LANGS, draw_curves, prepare_data, write_results
from mmptm.train.trainer import Trainer, pretrain


def multilingual_study(
    out: Path,
    *,
    n_train: int = 4000,
    n_test: int = 500,
    steps: int = 2000,
    ft_steps: int = 1500,
    seeds: tuple[int, ...] = (0, 1, 2),
    seed: int = 0,
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """MLM vs MLM+TLM vs MLM+TLM+XLCO: cross-lingual retrieval and zero-shot XNLI (module doc)."""
    # BPE: unigram stops at ~250 pieces on toyworld, near letter level
    # (docs/results/multilingual.md).
    # The tokenizer sees all the pre-training text (captions and statements), as XLM-R's
    # saw CommonCrawl; captions alone left NLI words such as "The" as [UNK].
    data = prepare_data(out, n_train, n_test, seed, LANGS, 2000, views=("mono",), model_type="bpe")
    runs = _pretrain(out, data, steps, seed, overrides)
    xret = {
        name: evaluate_xlingual(str(run), f"{data}/parallel/test-*.tar", pivot="en")
        for name, run in runs.items()
    }
    per_seed, first = _xnli(out, data, runs, ft_steps, seeds)
    xnli = {name: {k: statistics.mean(r[k] for r in rows) for k in rows[0]}
            for name, rows in per_seed.items()}  # fmt: skip
    result = {"xlingual_retrieval": xret, "xnli_zero_shot_mean": xnli, "xnli_per_seed": per_seed,
              "settings": {"n_train": n_train, "steps": steps, "ft_steps": ft_steps,
                           "seeds": list(seeds)}}  # fmt: skip
    write_results(out, result)
    print("\n(a) cross-lingual sentence retrieval accuracy vs English (Tatoeba protocol):")
    print(format_accuracy(xret))
    print(f"\n(b) zero-shot XNLI accuracy (fine-tuned on en), mean of {len(seeds)} seeds:")
    print(format_accuracy(xnli))
    draw_curves(
        out, "curves.png", runs, ["*_loss", "*_acc"], "pre-training (same model, same steps)"
    )
    draw_curves(out, "curves_xnli.png", first, ["xnli_loss", "xnli_acc"],
                f"XNLI fine-tuning on English (seed {seeds[0]})")  # fmt: skip
    return result


def _pretrain(
    out: Path, data: Path, steps: int, seed: int, overrides: Sequence[str]
) -> dict[str, Path]:
    """The three pre-trainings (same model, same steps); name → run."""
    paths = [
        f"data.tokenizer={data}/tokenizer.model",
        f"data.sources.mono.shards={data}/mono/train-{{lang}}-*.tar",
    ]
    runs = {"mlm": out / "mlm", "mlm+tlm": out / "mlm_tlm", "mlm+tlm+xlco": out / "mlm_tlm_xlco"}
    tlm = f"data.sources.tlm.shards={data}/parallel/train-*.tar"
    xlco = f"data.sources.xlco.shards={data}/parallel/train-*.tar"
    variants = {  # recipe, overrides
        "mlm": ("xlm_tlm_tiny", ["data.sources.tlm=__delete__"]),
        "mlm+tlm": ("xlm_tlm_tiny", [tlm]),
        "mlm+tlm+xlco": ("xlm_xlco_tiny", [tlm, xlco]),
    }
    for name, run in runs.items():
        recipe, variant = variants[name]
        cfg = load_run_config(
            recipe,
            [f"output_dir={run}", "resume=true", f"train.max_steps={steps}", f"seed={seed}", *paths,
             *variant, *overrides],
        )  # fmt: skip
        pretrain(cfg)
    return runs


def _xnli(
    out: Path, data: Path, runs: dict[str, Path], ft_steps: int, seeds: Sequence[int]
) -> tuple[dict[str, list[dict[str, float]]], dict[str, Path]]:
    """XNLI fine-tuned on English from each pre-training and from scratch, per seed, scored in
    every language: init → one score row per seed, and init → its first seed's run (for the
    curves)."""
    eval_sets = [f"data.eval.{lang}={data}/nli/test-{lang}-*.tar" for lang in LANGS]
    inits = {
        "from scratch": [f"init={runs['mlm']}", "init_mode=architecture"],
        "mlm": [f"init={runs['mlm']}"],
        "mlm+tlm": [f"init={runs['mlm+tlm']}"],
        "mlm+tlm+xlco": [f"init={runs['mlm+tlm+xlco']}"],
    }
    per_seed: dict[str, list[dict[str, float]]] = {}
    first: dict[str, Path] = {}
    for name, init in inits.items():
        per_seed[name] = []
        for s in seeds:
            cfg = load_run_config(
                "xnli",
                [f"output_dir={out}/xnli_{name.replace(' ', '_')}_{s}", "resume=true", f"seed={s}",
                 f"train.max_steps={ft_steps}", f"data.train={data}/nli/train-en-*.tar",
                 *eval_sets, *init],
            )  # fmt: skip
            first.setdefault(name, Path(cfg.output_dir))
            trainer = Trainer(cfg)
            trainer.fit()
            per_seed[name].append(
                evaluate_sets(trainer.model, cfg, trainer.tokenizer, cfg.data.eval)
            )
    return per_seed, first
