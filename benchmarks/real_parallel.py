"""The multilingual recipes on real parallel text: cross-lingual retrieval beside two
baselines that learn nothing (README, "Real data: multilingual retrieval on real parallel
text").

    python benchmarks/real_parallel.py prepare  --data data/real_parallel
    python benchmarks/real_parallel.py baselines --data data/real_parallel
    python benchmarks/real_parallel.py pretrain --data data/real_parallel --runs runs/real \\
        [--recipes mbert_tiny,xlm_tlm_tiny,xlm_xlco_tiny] [--steps N] [--set k=v ...]
    python benchmarks/real_parallel.py eval     --data data/real_parallel --runs runs/real
    python benchmarks/real_parallel.py curve    --data data/real_parallel --runs runs/real
    python benchmarks/real_parallel.py pretrain --data data/real_parallel --runs runs/real \\
        --recipes mbart_tiny
    python benchmarks/real_parallel.py translate --data data/real_parallel --runs runs/real \\
        [--steps N] [--items 1000]

``prepare`` builds the data from Debian's gettext catalogs (``real_parallel_data.py``):
English paired with German, French, Spanish and Russian, line-aligned files, then shards
with ``mmptm data parallel`` / ``mmptm data text`` and a shared BPE tokenizer with ``mmptm
tokenizer train`` (the commands are printed and run). ``baselines`` scores tf-idf over the
tokenizer's pieces and the mean of each recipe's randomly initialised input embeddings.
``pretrain`` runs ``mmptm pretrain`` per recipe with the data's paths (the recipes carry
the settings tuned on this benchmark: README, "Real data"); ``eval`` runs the retrieval of
every run (its aligned vector, if any, and the mean of the last or every layer) and writes
``results.json`` and a Markdown table next to the runs; ``curve`` does so for every kept
checkpoint. ``translate`` fine-tunes the ``translation`` recipe on the parallel train pairs
from ``mbart_tiny``'s run and from scratch (same shape and steps) and scores English → each
language on the test pairs (BLEU, chrF) beside copying the source and a word-by-word
dictionary learned from the same training pairs (``translate.json`` / ``translate.md``).
Test: 1000 unseen English sentences, each with its translation in all four
languages; 1000 candidates per direction.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_parallel_data import PACKAGES, prepare_text, write_text  # noqa: E402

from mmptm.config import load_yaml_tree  # noqa: E402
from mmptm.eval.xlingual import (  # noqa: E402
    SentenceEncoder,
    SentenceVector,
    aligned_objectives,
    read_pairs,
    retrieval_accuracy,
    xlingual_retrieval,
    xlingual_retrievals,
)
from mmptm.models.load import build_model, load_pretrained  # noqa: E402
from mmptm.recipe import load_run_config  # noqa: E402
from mmptm.tokenizers.sentencepiece import Tokenizer  # noqa: E402

LANGS = ("de", "fr", "es", "ru")
RECIPES = ("mbert_tiny", "xlm_tlm_tiny", "xlm_xlco_tiny")
MMPTM = [sys.executable, "-m", "mmptm.cli"]


def sh(cmd: list[str], log: Path | None = None) -> None:
    """Run an mmptm command (printed first, as a user would type it)."""
    print("$ mmptm " + " ".join(cmd[len(MMPTM) :] if cmd[: len(MMPTM)] == MMPTM else cmd))
    out = open(log, "a") if log else None  # noqa: SIM115 (closed below)
    try:
        subprocess.run(cmd, check=True, stdout=out, stderr=subprocess.STDOUT if out else None)
    finally:
        if out:
            out.close()


def recipe_overrides(recipe: str, data: Path) -> list[str]:
    """Point a multilingual recipe's toyworld paths at the real data: its monolingual source
    at the mono shards, every other source at the parallel train shards."""
    tree = load_yaml_tree(recipe)
    over = [f"data.tokenizer={data}/tokenizer.model"]
    for name, src in (tree.get("data", {}).get("sources") or {}).items():
        if name == "mono":
            over.append(f"data.sources.mono.shards={data}/mono/train-{{lang}}-*.tar")
            over.append(f"data.sources.mono.languages=[en,{','.join(LANGS)}]")
        elif isinstance(src, dict):
            over.append(f"data.sources.{name}.shards={data}/parallel/train-*.tar")
    return over


# -- prepare ------------------------------------------------------------------------------


def prepare(args: argparse.Namespace) -> None:
    data = Path(args.data)
    t0 = time.perf_counter()
    split, info = prepare_text(data / "work", LANGS, args.test, args.seed, args.packages)
    files = write_text(split, data / "text")
    for lang in LANGS:
        for part in ("train", "test"):
            src, tgt = files[f"{part}-{lang}"]
            # Small shards: a shard holds one language pair and the loader reads shards one
            # after another in a shuffled order, so with 10,000-pair shards the first 20,000
            # TLM / XLCO pairs of a run were all German (two shards of en-de came first).
            sh([*MMPTM, "data", "parallel", "--input", str(src), str(tgt), "--langs",
                f"en,{lang}", "--split", part, "--out", str(data / "parallel"),
                "--shard-size", "1000"])  # fmt: skip
    for lang in ("en", *LANGS):
        (mono,) = files[f"mono-{lang}"]
        sh([*MMPTM, "data", "text", "--input", str(mono), "--lang", lang, "--split", "train",
            "--out", str(data / "mono")])  # fmt: skip
    sh([*MMPTM, "tokenizer", "train", "--input", f"{data}/mono/train-*.tar", "--out",
        str(data / "tokenizer"), "--vocab-size", str(args.vocab),
        "--model-type", "bpe"])  # fmt: skip
    print(json.dumps({k: info[k] for k in ("train_pairs", "test_pairs", "english_sentences")}))
    took = time.perf_counter() - t0
    print(f"prepared {data} in {took:.0f}s; sources in {data}/work/manifest.json")


# -- baselines ----------------------------------------------------------------------------


def tfidf(tok: Tokenizer, texts: list[str], idf: torch.Tensor) -> torch.Tensor:
    """L2-normalised tf-idf vectors [N,V] over the tokenizer's pieces."""
    out = torch.zeros(len(texts), tok.vocab_size)
    for i, t in enumerate(texts):
        for piece, n in Counter(tok.encode(t)).items():
            out[i, piece] = n
    return F.normalize(out * idf, dim=-1)


def tfidf_retrieval(tok: Tokenizer, pairs: dict[str, list[tuple[str, str]]]) -> dict[str, float]:
    """Tatoeba accuracy of tf-idf over pieces; idf from the two sides' sentences together."""
    result = {}
    for lang, pp in sorted(pairs.items()):
        en, other = [p[0] for p in pp], [p[1] for p in pp]
        df = torch.zeros(tok.vocab_size)
        for t in en + other:
            df[sorted(set(tok.encode(t)))] += 1
        idf = torch.log((1 + 2 * len(pp)) / (1 + df)) + 1  # smoothed, as scikit-learn's
        result[lang] = retrieval_accuracy(tfidf(tok, other, idf), tfidf(tok, en, idf))
    result["avg"] = sum(result.values()) / len(result)
    return result


def baselines(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    data = Path(args.data)
    pairs = read_pairs(f"{data}/parallel/test-*.tar", "en", args.items)
    tok = Tokenizer.load(data / "tokenizer.model")
    rows = {"tf-idf over the tokenizer's pieces": tfidf_retrieval(tok, pairs)}
    # mbert_tiny's embeddings: word + position, no language embedding (a per-language
    # constant, which makes every mean vector language-specific: 0.7% with xlm_tlm_tiny's)
    cfg = load_run_config(
        "mbert_tiny",
        [*recipe_overrides("mbert_tiny", data), f"seed={args.seed}"],
    )
    model, tok = build_model(cfg)
    encode = SentenceEncoder(model, cfg, tok, SentenceVector("mean", 0))
    rows["mean of random input embeddings"] = xlingual_retrieval(encode, pairs, "en")
    return rows


# -- pretrain and eval --------------------------------------------------------------------


def pretrain(args: argparse.Namespace) -> None:
    data, runs = Path(args.data), Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    for recipe in args.recipes.split(","):
        run = runs / recipe
        over = [*recipe_overrides(recipe, data), f"output_dir={run}", "resume=true",
                "train.progress=false"]  # fmt: skip
        if args.steps:
            over.append(f"train.max_steps={args.steps}")
        t0 = time.perf_counter()
        sh([*MMPTM, "pretrain", recipe, *over, *args.set],
           log=runs / f"{recipe}.log")  # fmt: skip
        print(f"{recipe}: {time.perf_counter() - t0:.0f}s → {run}")


def evaluate_run(
    run: Path, pairs: dict, layers: bool, center: bool = False
) -> dict[str, dict[str, float]]:
    """The run's aligned vector (if any) and the mean of the last (or every) layer; with
    ``center``, each of them also with every language's mean vector subtracted."""
    model, tok, cfg = load_pretrained(str(run))
    vectors = [SentenceVector(name) for name in aligned_objectives(model)]
    vectors.append(SentenceVector("mean"))
    rows = {}
    centers = (False, True) if center else (False,)
    for v in vectors:
        encode = SentenceEncoder(model, cfg, tok, v)
        results = xlingual_retrievals(encode, pairs, "en", centers)
        n = encode.layers  # the mean, last in the list, sets it
        for c, result in results.items():
            rows[v.describe(model, n) + (", centered" if c else "")] = result
    for k in range(n if layers else 0):  # middle layers, as XTREME's Tatoeba protocol
        encode = SentenceEncoder(model, cfg, tok, SentenceVector("mean", k))
        for c, result in xlingual_retrievals(encode, pairs, "en", centers).items():
            rows[f"mean, layer {k}" + (", centered" if c else "")] = result
    return {k.replace(f"layer {n} of {n}", f"layer {n} (last)"): v for k, v in rows.items()}


def last_metrics(run: Path) -> dict[str, float]:
    """The last logged metrics row of a run (losses, accuracies, step)."""
    rows = (run / "metrics.jsonl").read_text().splitlines()
    return json.loads(rows[-1]) if rows else {}


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    cols = [*LANGS, "avg"]
    lines = ["| model | vector | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"]
    for model, rows in results.items():
        for vector, r in rows.items():
            cells = " | ".join(f"{100 * r[c]:.1f}%" for c in cols)
            lines.append(f"| {model} | {vector} | {cells} |")
    return "\n".join(lines)


def evaluate(args: argparse.Namespace) -> None:
    data, runs = Path(args.data), Path(args.runs)
    pairs = read_pairs(f"{data}/parallel/test-*.tar", "en", args.items)
    results = {"baselines (learn nothing)": baselines(args)}
    for recipe in args.recipes.split(","):
        if (runs / recipe / "checkpoints").is_dir():
            step = last_metrics(runs / recipe).get("step", "?")
            results[f"{recipe} ({step} steps)"] = evaluate_run(
                runs / recipe, pairs, args.layers, args.center
            )
    (runs / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    md = table(results)
    (runs / "results.md").write_text(md + "\n")
    print(md)


def curve(args: argparse.Namespace) -> None:
    """Retrieval of every kept checkpoint of each recipe's run (``train.ckpt_every``,
    ``train.keep_checkpoints=0``): the curve over steps, in ``curve.json`` / ``curve.md``."""
    data, runs = Path(args.data), Path(args.runs)
    pairs = read_pairs(f"{data}/parallel/test-*.tar", "en", args.items)
    done = runs / "curve.json"  # checkpoints scored before are not scored again
    results = json.loads(done.read_text()) if done.is_file() else {}
    for recipe in args.recipes.split(","):
        for ckpt in sorted((runs / recipe / "checkpoints").glob("step_*.pt")):
            name = f"{recipe} (step {int(ckpt.stem.removeprefix('step_'))})"
            if name not in results:
                results[name] = evaluate_run(ckpt, pairs, args.layers, args.center)
                print(table({name: results[name]}), flush=True)
                done.write_text(json.dumps(results, indent=1) + "\n")
    (runs / "curve.md").write_text(table(results) + "\n")


def translate(args: argparse.Namespace) -> None:
    """Translation fine-tuned from mbart_tiny and from scratch, scored with the baselines."""
    data, runs = Path(args.data), Path(args.runs)
    paths = [f"data.tokenizer={data}/tokenizer.model", f"data.train={data}/parallel/train-*.tar",
             f"data.val={data}/parallel/test-*.tar", f"data.test={data}/parallel/test-*.tar",
             "train.progress=false", "resume=true"]  # fmt: skip
    if args.steps:
        paths.append(f"train.max_steps={args.steps}")
    results: dict[str, dict] = {}
    for name, start in (("pre-trained", []), ("from scratch", ["init_mode=architecture"])):
        run = runs / f"translation_{name.replace(' ', '_')}"
        sh([*MMPTM, "finetune", "translation", f"init={runs / 'mbart_tiny'}", *start,
            f"output_dir={run}", *paths, *args.set], log=runs / f"{run.name}.log")  # fmt: skip
        for lang in LANGS:
            out = run / f"eval_en_{lang}.json"
            sh([*MMPTM, "eval", "translation", str(run), "--src", "en", "--tgt", lang,
                "--limit", str(args.items), "--beam", "4", "--out", str(out)],
               log=runs / f"{run.name}.log")  # fmt: skip
            r = json.loads(out.read_text())
            results.setdefault(lang, {})[f"mbart_tiny {name}"] = r
    lines = ["| en → | run | BLEU | chrF |", "|---|---|---|---|"]
    for lang, rows in results.items():
        base = next(iter(rows.values())).get("baselines", {})
        for key, r in [*rows.items(), *base.items()]:
            lines.append(f"| {lang} | {key} | {r['bleu']:.1f} | {r['chrf']:.1f} |")
    (runs / "translate.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    (runs / "translate.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "action", choices=["prepare", "baselines", "pretrain", "eval", "curve", "translate"]
    )
    ap.add_argument("--data", default="data/real_parallel")
    ap.add_argument("--runs", default="runs/real_parallel")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--steps", type=int, default=0, help="train.max_steps (0: the recipe's)")
    ap.add_argument("--set", action="append", default=[], help="extra key=value overrides")
    ap.add_argument("--items", type=int, default=1000, help="test pairs per language")
    ap.add_argument("--layers", action="store_true", help="eval: also the mean of every layer")
    ap.add_argument(
        "--center",
        action="store_true",
        help="eval: also with each language's mean vector subtracted",
    )
    ap.add_argument("--test", type=int, default=1000, help="prepare: test sentences")
    ap.add_argument("--vocab", type=int, default=8000, help="prepare: BPE pieces")
    ap.add_argument("--packages", nargs="+", default=list(PACKAGES), help="prepare: .deb names")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.action == "prepare":
        prepare(args)
    elif args.action == "baselines":
        rows = baselines(args)
        print(table({"baselines": rows}))
    elif args.action == "pretrain":
        pretrain(args)
    elif args.action == "curve":
        curve(args)
    elif args.action == "translate":
        translate(args)
    else:
        evaluate(args)


if __name__ == "__main__":
    main()
