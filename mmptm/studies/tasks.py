"""The task study (``mmptm demo tasks``): toyworld's analogues of the downstream tasks issue 36
names, each fine-tuned from a pre-trained model and from scratch (the same shape,
``init_mode=architecture``) over several fine-tuning seeds, reported as mean ± standard
deviation (over the seeds, n − 1 in the denominator; 0 for one seed).

| task | toyworld analogue | recipe | from | score |
|---|---|---|---|---|
| ``refexp`` | expressions naming one object | ``refcoco`` | UNITER | accuracy at IoU ≥ 0.5 |
| ``nlvr2`` | a statement about two scenes | ``nlvr2`` | UNITER | accuracy |
| ``vcr`` | answers and rationales about a scene | ``vcr`` | UNITER | Q→A, QA→R, Q→AR |
| ``tagging`` | tagged mentions (WikiANN) | ``wikiann`` | mBERT | span F1: en, avg of 5 |
| ``qa`` | answer spans (XQuAD) | ``xquad`` | mBERT | F1: en, avg of 5 |
| ``xnli`` | NLI pairs (XNLI; PAWS-X's path) | ``xnli`` | mBERT | accuracy: en, avg of 5 |

The multilingual tasks fine-tune on English and score every toyworld language (zero-shot
transfer, XTREME's ``avg`` with English in it). One toyworld (``n_train`` scenes, 32 px,
five languages) and one tokenizer serve both pre-trained models: ``uniter_tiny`` on its
image-text and region views and ``mbert_tiny`` on the monolingual text, each ``steps``
steps (the recipes' shapes; ``overrides`` apply to both, e.g. ``model.width=64``). The
tasks' data are the toyworld commands' (``toyworld-refexp``, ``toyworld-nlvr2``,
``toyworld-vcr``, ``toyworld-tasks``) over ``n_task_train`` / ``n_test`` scenes of their own.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mmptm import toyworld
from mmptm.eval.nlvr2 import evaluate_nlvr2
from mmptm.eval.refexp import evaluate_refexp
from mmptm.eval.transfer import evaluate_transfer
from mmptm.eval.vcr import evaluate_vcr
from mmptm.recipe import load_run_config
from mmptm.studies.common import LANGS, relocated, write_results
from mmptm.tokenizers.sentencepiece import train_tokenizer
from mmptm.toyworld.nlvr2 import write_nlvr2
from mmptm.toyworld.refexp import write_refexp
from mmptm.toyworld.tasks import write_tasks
from mmptm.toyworld.vcr import write_vcr
from mmptm.train.trainer import pretrain

#: the study's tasks, in the order it runs them
TASKS = ("refexp", "nlvr2", "vcr", "tagging", "qa", "xnli")
#: fine-tuning starts: name → overrides besides ``init=<pre-trained run>``
_STARTS = (("pre-trained", []), ("from scratch", ["init_mode=architecture"]))
_IMAGE_SIZE = 32


def tasks_study(
    out: Path,
    *,
    recipes: tuple[str, ...] = TASKS,
    n_train: int = 4000,
    n_test: int = 200,
    n_task_train: int = 1500,
    steps: int = 1000,
    ft_steps: int = 600,
    seeds: tuple[int, ...] = (0, 1, 2),
    seed: int = 0,
    overrides: Sequence[str] = (),
    ft_overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """Every task of ``recipes`` (names of :data:`TASKS`) pre-trained vs from scratch over
    ``seeds`` (module doc); ``results.json`` holds each seed's scores and their mean ± std.
    ``n_train`` scenes for pre-training, ``n_task_train`` for each task's fine-tuning,
    ``n_test`` for each evaluation; ``ft_overrides`` apply to every fine-tuning."""
    unknown = sorted(set(recipes) - set(TASKS))
    if unknown:
        raise ValueError(f"tasks study: unknown tasks {unknown}; choices: {', '.join(TASKS)}")
    out.mkdir(parents=True, exist_ok=True)
    world = _world(out / "toyworld", n_train, n_test, seed)
    needs = {"uniter_tiny": {"refexp", "nlvr2", "vcr"}, "mbert_tiny": {"tagging", "qa", "xnli"}}
    pre = {}
    for recipe, tasks in needs.items():
        if tasks & set(recipes):
            pre[recipe] = out / recipe
            _train(recipe, pre[recipe], world, steps, seed, [*relocated(recipe, world),
                                                             *overrides])  # fmt: skip
    result: dict[str, Any] = {"tasks": {}, "settings": {
        "n_train": n_train, "n_test": n_test, "n_task_train": n_task_train, "steps": steps,
        "ft_steps": ft_steps,
        "seeds": list(seeds), "seed": seed, "overrides": list(overrides),
        "ft_overrides": list(ft_overrides)}}  # fmt: skip
    for task in recipes:
        recipe, data_overrides, score = _task(task, out / "data", world, n_task_train, n_test, seed)
        init = pre["uniter_tiny" if task in needs["uniter_tiny"] else "mbert_tiny"]
        rows: dict[str, dict[str, list[float]]] = {}
        for start, extra in _STARTS:
            for s in seeds:
                run = out / "finetune" / f"{task}_{start.replace(' ', '_')}_{s}"
                _train(recipe, run, world, ft_steps, s,
                       [f"init={init}", *extra, *data_overrides, *ft_overrides])  # fmt: skip
                for metric, value in score(run).items():
                    rows.setdefault(metric, {}).setdefault(start, []).append(value)
        result["tasks"][task] = {m: {start: summary(v) for start, v in by.items()}
                                 for m, by in rows.items()}  # fmt: skip
        write_results(out, result)
    print(format_tasks(result))
    return result


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Each seed's value, their mean and sample standard deviation (0 for one value)."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"per_seed": list(values), "mean": statistics.mean(values), "std": std}


def _world(root: Path, n_train: int, n_test: int, seed: int) -> Path:
    """toyworld for both pre-trained models, with a tokenizer over its captions and text."""
    if not (root / "tokenizer.model").is_file():
        toyworld.generate(root, n_train=n_train, n_val=n_test, n_test=n_test, seed=seed,
                          languages=LANGS, image_size=_IMAGE_SIZE, progress=True,
                          views=("image_text", "regions", "mono", "nli"))  # fmt: skip
        shards = sorted(p for v in ("image_text", "mono") for p in (root / v).glob("train-*.tar"))
        train_tokenizer(shards, root / "tokenizer", vocab_size=2000, seed=seed,
                        model_type="bpe")  # fmt: skip
    return root


def _train(recipe: str, run: Path, world: Path, steps: int, seed: int, extra: Sequence[str]):
    """Train ``recipe`` for ``steps`` at ``run`` (kept if it is already there: a stopped study
    resumes), with the study's tokenizer."""
    over = [f"data.tokenizer={world}/tokenizer.model", f"output_dir={run}", "resume=true",
            f"seed={seed}", "data.num_workers=0", "train.progress=false",
            f"train.max_steps={steps}", f"train.warmup_steps={max(1, steps // 10)}",
            f"train.ckpt_every={steps}", *extra]  # fmt: skip
    pretrain(load_run_config(recipe, over))


def _task(
    task: str, root: Path, world: Path, n_train: int, n_test: int, seed: int
) -> tuple[str, list[str], Callable[[Path], dict[str, float]]]:
    """(fine-tuning recipe, its data overrides, the scorer of a run) of one task; its data
    written under ``root`` the first time."""
    if task in ("refexp", "nlvr2", "vcr"):
        data = root / task
        write = {"refexp": write_refexp, "nlvr2": write_nlvr2, "vcr": write_vcr}[task]
        if not data.is_dir():
            write(data, n_train=n_train, n_val=n_test, n_test=n_test, seed=seed,
                  image_size=_IMAGE_SIZE)  # fmt: skip
        over = [f"data.{s}={data}/{s}-*.tar" for s in ("train", "val", "test")]
        if task == "vcr":
            return "vcr", [*over, "train.lr=5e-4"], _vcr_score
        evaluate = evaluate_refexp if task == "refexp" else evaluate_nlvr2
        return ("refcoco" if task == "refexp" else task, [*over, "train.lr=5e-4"],
                lambda run: {"accuracy": evaluate(str(run))["accuracy"]})  # fmt: skip
    if task == "xnli":
        return "xnli", [*relocated("xnli", world), "train.lr=1e-3"], _transfer_scorer("acc")
    data = root / "xtreme"
    if not (data / "qa" / "shards").is_dir():
        write_tasks(data, n_train=n_train, n_test=n_test, seed=seed, languages=LANGS)
    sub = "tagging" if task == "tagging" else "qa"
    over = [f"data.train={data}/{sub}/shards/train-en-*.tar", "data.eval={}", "train.lr=1e-3",
            *(f"data.eval.{x}={data}/{sub}/shards/test-{x}-*.tar" for x in LANGS)]  # fmt: skip
    if task == "tagging":
        over += [f"model.objectives.ner.labels={data}/tagging/shards/labels.txt",
                 "data.modalities.text.max_len=64"]  # fmt: skip
        return "wikiann", over, _transfer_scorer("f1")
    over += ["model.objectives.qa.max_len=48", "model.objectives.qa.stride=16",
             "model.objectives.qa.max_query_len=12"]  # fmt: skip
    return "xquad", over, _transfer_scorer("f1")


def _vcr_score(run: Path) -> dict[str, float]:
    """VCR's three accuracies (%) of a fine-tuned run: Q→A, QA→R and Q→AR (both right)."""
    r = evaluate_vcr(str(run))
    return {"q_a": r["q_a"], "qa_r": r["qa_r"], "q_ar": r["q_ar"]}


def _transfer_scorer(metric: str) -> Callable[[Path], dict[str, float]]:
    """English's and the average over the languages' ``metric`` (%) of a fine-tuned run."""

    def score(run: Path) -> dict[str, float]:
        r = evaluate_transfer(str(run))
        return {
            f"{metric} en": 100 * r["sets"]["en"][metric],
            f"{metric} avg": 100 * r["avg"][metric],
        }

    return score


def format_tasks(result: dict[str, Any]) -> str:
    """One row per task and score: mean ± std of each start over the seeds."""
    seeds = len(result["settings"]["seeds"])
    starts = [name for name, _ in _STARTS]
    lines = [f"toyworld tasks, mean ± std over {seeds} fine-tuning seed(s):",
             f"  {'task':<8} {'score':<10}" + "".join(f"{s:>18}" for s in starts)]  # fmt: skip
    for task, metrics in result["tasks"].items():
        for metric, by in metrics.items():
            cells = "".join(f"{by[s]['mean']:>11.1f} ± {by[s]['std']:<4.1f}" for s in starts)
            lines.append(f"  {task:<8} {metric:<10}{cells}")
    return "\n".join(lines)


__all__ = ["TASKS", "format_tasks", "summary", "tasks_study"]
