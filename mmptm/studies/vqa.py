"""The vision-language study (``mmptm demo vqa``): per VL run, image↔text retrieval after
pre-training, and VQA fine-tuned from the pre-trained weights vs. from scratch (same shape,
same fine-tuning budget) over seeds, beside each run's budget (parameters, objectives per
step)."""

from __future__ import annotations

import logging
import statistics
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from mmptm.converters.answers import build_answer_vocab, shard_answers, write_answer_vocab
from mmptm.eval.retrieval import evaluate_retrieval, format_table, retrieval_heads
from mmptm.eval.vqa import evaluate_vqa
from mmptm.models.load import load_pretrained
from mmptm.objectives.base import task_objectives
from mmptm.recipe import RunConfig, load_run_config
from mmptm.studies.common import (
    checkpoint_stamp,
    draw_curves,
    evaluated_once,
    prepare_data,
    relocated,
    run_key,
    write_results,
)
from mmptm.train.trainer import pretrain

log = logging.getLogger(__name__)

#: the VL study's pre-training runs: name → (recipe, overrides). The last two are UNITER's
#: architecture at the two-stream recipes' budget: every objective on every step (no task
#: sampling) and 9 fusion layers (1.80 M parameters, ViLBERT's 1.82 M), with ViLBERT's
#: objectives (MLM, ITM, MRFR, masked region classes against the detector's distribution)
#: and with LXMERT's (the same, the region classes against the true labels)
VL_RUNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "visualbert_tiny": ("visualbert_tiny", ()),
    "uniter_tiny": ("uniter_tiny", ()),
    "vilbert_tiny": ("vilbert_tiny", ()),
    "lxmert_tiny": ("lxmert_tiny", ()),
    "albef_tiny": ("albef_tiny", ()),
    "oscar_tiny": ("oscar_tiny", ()),
    "single_stream_9l": (
        "uniter_tiny",
        ("model.task_mix=__delete__", "model.fusion.transformer.layers=9"),
    ),
    "single_stream_9l_mrc": (
        "uniter_tiny",
        (
            "model.task_mix=__delete__",
            "model.fusion.transformer.layers=9",
            "model.objectives.mrc_kl=__delete__",
            "model.objectives.mrc={type: mrc, num_classes: 5, target: labels}",
        ),
    ),
}
# The surveys' further single-stream systems and the full objective sets of UNITER (WRA: its
# effect on retrieval is uniter_full_tiny beside uniter_tiny) and LXMERT (image QA on the
# questions of the VQA view, with the study's answer list: VQA pre-trained vs from scratch)
VL_RUNS.update(
    {name: (name, ()) for name in ("uniter_full_tiny", "lxmert_full_tiny", "vlbert_tiny",
                                   "unicoder_vl_tiny", "imagebert_tiny", "b2t2_tiny")}
)  # fmt: skip
# LXMERT's two stages (its paper: image QA only in the second half of pre-training; the
# recipe, like LXMERT's released code, trains it from the start)
VL_RUNS["lxmert_full_two_stage"] = ("lxmert_full_tiny", ("model.starts={vqa: 0.5}",))
VL_RECIPES = tuple(VL_RUNS)
#: fine-tuning starts: name → overrides of the VQA recipe besides ``init=<pre-trained run>``
_STARTS = (("pre-trained", []), ("from scratch", ["init_mode=architecture"]))


def vqa_study(
    out: Path,
    *,
    recipes: tuple[str, ...] = VL_RECIPES,
    n_train: int = 4000,
    n_test: int = 500,
    steps: int = 1000,
    ft_steps: int = 1500,
    seeds: tuple[int, ...] = (0, 1, 2),
    seed: int = 0,
    retrieval_items: int | None = None,
    rerank_k: int = 16,
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """Per VL run (``VL_RUNS`` names, or any recipe's): retrieval after pre-training, and VQA
    accuracy of fine-tuning from the pre-trained weights vs. from scratch (same shape, same
    fine-tuning budget), over seeds; each run's budget (parameters, objectives per step).

    Retrieval over ``retrieval_items`` test pairs (None: the whole test split, ``n_test``;
    0: none): ITM scores every pair, and with a contrastive head too (ALBEF) the contrastive
    ranking alone and its top ``rerank_k`` re-ranked. results.json is rewritten after every run.
    """
    if retrieval_items is None:
        retrieval_items = n_test
    data, answers = _prepare(out, n_train, n_test, seed)
    result: dict[str, Any] = {"budget": {}, "retrieval": {}, "vqa_mean": {}, "vqa_per_seed": {},
                              "same_runs": {}}  # fmt: skip
    finetuned: dict[str, Path] = {}  # the first seed's fine-tuning runs, for their curves
    trained: dict[str, tuple[str, Path, float]] = {}  # run_key → (row, run, test accuracy)
    for recipe in recipes:  # a run's name: the recipe's, or a VL_RUNS variant's
        run = out / recipe
        cfg = _pretrain(recipe, run, data, steps, seed, overrides)
        result["budget"][recipe] = model_budget(load_pretrained(str(run))[0], cfg)
        if retrieval_items:  # 0: VQA only (ITM over every pair is the costly part)
            inputs = {**checkpoint_stamp(run), "items": retrieval_items, "rerank_k": rerank_k}
            rows = evaluated_once(out, f"retrieval_{recipe}", inputs, partial(
                _vl_retrieval, recipe, run, retrieval_items, rerank_k))  # fmt: skip
            result["retrieval"].update(rows)
        for name, init in _STARTS:
            key = f"{recipe} {name}"
            scores = []
            for s in seeds:
                ft = out / f"vqa_{recipe}_{name.replace(' ', '_')}_{s}"
                cfg = _finetune_config(run, ft, init, data, answers, ft_steps, s)
                same = run_key(cfg)
                if same not in trained:  # else an earlier row trained this very run, e.g.
                    pretrain(cfg)  # from scratch on the same architecture
                    trained[same] = (key, ft, _accuracy(ft))
                row, ft, score = trained[same]
                if row != key:
                    result["same_runs"][key] = row
                    log.info("%s, seed %d: the same run as %s (%s)", key, s, row, ft)
                finetuned.setdefault(key, ft)
                scores.append(score)
            result["vqa_per_seed"][key] = scores
            result["vqa_mean"][key] = statistics.mean(scores)
        result["settings"] = {"n_train": n_train, "steps": steps, "ft_steps": ft_steps,
                              "seeds": list(seeds), "retrieval_items": retrieval_items,
                              "rerank_k": rerank_k}  # fmt: skip
        write_results(out, result)
    _print_vqa(result, steps, len(seeds), retrieval_items, rerank_k)
    draw_curves(out, "curves.png", {r: out / r for r in recipes}, ["*_loss", "*_acc"],
                "vision-language pre-training")  # fmt: skip
    draw_curves(out, "curves_vqa.png", finetuned, ["vqa_loss", "vqa_score"],
                f"VQA fine-tuning (seed {seeds[0]})")  # fmt: skip
    return result


def _prepare(out: Path, n_train: int, n_test: int, seed: int) -> tuple[Path, Path]:
    """toyworld's image, region and VQA views with an English tokenizer, and the answer
    vocabulary of the VQA train split: the data folder and the vocabulary file."""
    # BPE sized to the English captions and questions (about 340 pieces, every word whole):
    # unigram at 1000 stopped at 69 pieces, letter level, with a warning.
    data = prepare_data(
        out, n_train, n_test, seed, ("en",), 1000, views=("image_text", "vqa"), model_type="bpe",
        fit_to_data=True,
    )  # fmt: skip
    answers = data / "vqa" / "answers.txt"
    vocab = build_answer_vocab(shard_answers([f"{data}/vqa/train-*.tar"]), min_count=9)
    write_answer_vocab(vocab, answers)
    return data, answers


def _pretrain(
    recipe: str, run: Path, data: Path, steps: int, seed: int, overrides: Sequence[str]
) -> RunConfig:
    """Pre-train one VL run (a ``VL_RUNS`` name or a recipe) on the region shards (a recipe
    that mixes sources, such as LXMERT's captions and questions, on the study's copies of
    its own); its config."""
    base, variant = VL_RUNS.get(recipe, (recipe, ()))
    paths = [f"data.tokenizer={data}/tokenizer.model"] + [
        f"data.{split}={data}/regions/{split}-*.tar" for split in ("train", "val", "test")
    ]
    if load_run_config(base).data.sources:
        paths = relocated(base, data)  # the answer list too: _prepare writes it there
    cfg = load_run_config(
        base,
        [
            f"output_dir={run}",
            "resume=true",
            f"train.max_steps={steps}",
            f"seed={seed}",
            *paths,
            *variant,
            *overrides,
        ],
    )
    pretrain(cfg)
    return cfg


def _finetune_config(
    run: Path, ft: Path, init: Sequence[str], data: Path, answers: Path, ft_steps: int, seed: int
) -> RunConfig:
    """The VQA fine-tuning at ``ft`` from ``run`` (``init``: its overrides)."""
    return load_run_config(
        "vqa",
        [f"init={run}", *init, f"output_dir={ft}", "resume=true", f"seed={seed}",
         f"train.max_steps={ft_steps}", f"data.train={data}/vqa/train-*.tar",
         f"data.test={data}/vqa/test-*.tar", f"model.objectives.vqa.answers={answers}"],
    )  # fmt: skip


def _accuracy(ft: Path) -> float:
    """The official soft VQA score of a fine-tuned run on the study's test questions."""
    return evaluate_vqa(str(ft), split="test")["accuracy"]


def _print_vqa(
    result: Mapping[str, Any], steps: int, n_seeds: int, retrieval_items: int, rerank_k: int
) -> None:
    """The study's three tables: budgets, retrieval, VQA accuracy per start."""
    print(
        f"\npre-training budgets ({steps} steps each; objectives: share of the steps each trains):"
    )
    print(format_budgets(result["budget"]))
    if retrieval_items:
        print(f"\nimage↔text retrieval on {retrieval_items} test pairs (ITM scores every pair; "
              f"with a contrastive head too: contrastive alone, ITM over all, top {rerank_k} "
              "re-ranked):")  # fmt: skip
        print(format_table(result["retrieval"]))
    print(f"\nVQA accuracy (official soft score, %), mean of {n_seeds} fine-tuning seeds:")
    for key, acc in result["vqa_mean"].items():
        runs = ", ".join(f"{a:.1f}" for a in result["vqa_per_seed"][key])
        same = result["same_runs"].get(key)
        print(f"  {key:<28} {acc:5.1f}   ({runs})" + (f"  the same runs as {same}" if same else ""))


def model_budget(model, cfg: RunConfig) -> dict[str, Any]:
    """What a pre-training run spends, to compare recipes at equal budgets: parameters (all,
    and the fusion's), the batch size, and the share of steps each objective trains: the
    weight share of the ``task_mix`` tasks that train it (``itm+wra`` counts for both; 1
    without a mix), times the weight share of the ``data.sources`` whose batches are routed to
    it (``model.routes``; a source not named trains every objective), times the share of
    training after its start (``model.starts``)."""
    mc = cfg.model
    mix, starts, routes = mc.task_mix, mc.starts, mc.routes
    weights = {name: src.weight for name, src in cfg.data.sources.items()}

    def routed(n: str) -> float:
        if not routes or not sum(weights.values()):
            return 1.0
        to_n = [w for src, w in weights.items() if n in routes.get(src, list(mc.objectives))]
        return sum(to_n) / sum(weights.values())

    total = sum(mix.values())
    share = {
        n: (sum(w for task, w in mix.items() if n in task_objectives(task)) / total if mix else 1.0)
        * routed(n)
        * (1.0 - starts.get(n, 0.0))
        for n in mc.objectives
    }
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "fusion_parameters": sum(p.numel() for p in model.fusion.parameters()),
        "batch_size": cfg.data.batch_size,
        "objectives": share,
    }


def format_budgets(budgets: Mapping[str, Mapping[str, Any]]) -> str:
    """One line per run: parameters, fusion parameters, batch, objectives with their shares."""
    lines = [f"  {'run':<20} {'params':>8} {'fusion':>8} {'batch':>5}  objectives (share of steps)"]
    for name, b in budgets.items():
        objs = ", ".join(
            n if share == 1.0 else f"{n} {share:.2f}" for n, share in b["objectives"].items()
        )
        lines.append(
            f"  {name:<20} {b['parameters'] / 1e6:7.2f}M {b['fusion_parameters'] / 1e6:7.2f}M "
            f"{b['batch_size']:>5}  {objs}"
        )
    return "\n".join(lines)


def _vl_retrieval(recipe: str, run: Path, items: int, rerank_k: int) -> dict[str, dict]:
    """Retrieval rows of one VL run: ITM over every pair, and with a contrastive head as
    well (ALBEF) the contrastive ranking alone and its top ``rerank_k`` re-ranked by ITM."""
    path = str(run)
    try:
        contrastive, itm = retrieval_heads(load_pretrained(path)[0])
    except ValueError:  # no head ranks pairs (VL-BERT has no matching task): no row
        return {}
    if contrastive is None or itm is None:
        return {recipe: evaluate_retrieval(path, split="test", max_items=items)}
    return {
        f"{recipe}, contrastive": evaluate_retrieval(path, split="test", max_items=items),
        f"{recipe}, ITM over all pairs": evaluate_retrieval(
            path, split="test", max_items=items, itm_all=True
        ),
        f"{recipe}, top {rerank_k} re-ranked": evaluate_retrieval(
            path, split="test", max_items=items, rerank_k=rerank_k
        ),
    }
