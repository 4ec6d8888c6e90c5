"""Link prediction on a real lexical graph (WordNet 3.0 from Debian's ``wordnet-base``): mmptm's
knowledge-graph embeddings beside baselines that learn nothing and, behind a flag, PyKEEN.

    apt-get install -y wordnet-base
    python benchmarks/real_kg.py prepare --data data/real_kg [--k 4]
    python benchmarks/real_kg.py run --data data/real_kg --runs runs/real_kg \\
        [--models transe,rotate,complex] [--epochs 50] [--dim 200] [--set key=value ...] \\
        [--pykeen-python /work/venv-pykeen/bin/python]
    python benchmarks/real_kg.py kepler --data data/real_kg --runs runs/real_kg [--steps 1000] \\
        [--name NAME] [--set data.sources.triples.weight=0 ...] [--skip-baselines]
    python benchmarks/real_kg.py table --runs runs/real_kg

``prepare`` writes the graph (``real_kg_data.py``: WN18RR's eleven relations, one direction of
each inverse pair, symmetric pairs kept in one split, the k-core's largest component) in the
``train.txt``/``valid.txt``/``test.txt`` layout that ``mmptm kg train-embeddings`` reads, plus
``descriptions.txt`` (lemmas and gloss per synset, for KEPLER's setting) and ``counts.json``.

``run`` scores, by filtered link prediction on test (``mmptm/eval/link_prediction.py``: every
entity ranked, filtered against train + valid + test, realistic ranks, both sides pooled, and
per relation):

- ``uniform``: every entity scored alike (chance: MRR ≈ H(E)/E, the expected rank (E + 1)/2);
- ``frequency``: a prior that learns nothing from the pair, only counts: the tails of (h, r, ?)
  ranked by how often each entity is a tail of r in training (heads likewise);
- each model through ``mmptm kg train-embeddings`` (a subprocess, as a user types it; its
  defaults unless ``--set``), and the same model, dimension (real floats per entity),
  loss, negatives, optimiser, learning rate and schedule, batch and epochs in PyKEEN
  (``--pykeen-python``: a Python where ``import pykeen`` works; never mmptm's dependency).

``kepler`` does what a user of KEPLER's setting does with mmptm's commands: triple shards of the
graph with both entities' descriptions (``mmptm data triples``), MLM text shards of the
descriptions (``mmptm data text``), a BPE tokenizer fitted to them (``mmptm tokenizer train``),
``mmptm pretrain kepler_tiny`` pointed at them (``--set``: more dotted overrides), then
``mmptm eval link-prediction RUN --graph DATA`` (the same filtered protocol); beside the
baselines above it adds one that learns nothing from the graph, only words: entities ranked
by the tf-idf cosine of their descriptions to the known entity's.

Everything runs on one thread (``OMP_NUM_THREADS=1``). Results: ``RUNS/results.json`` and the
Markdown table ``RUNS/results.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_kg_data import SYMMETRIC, write_graph  # noqa: E402

from mmptm.eval.link_prediction import side_metrics, side_ranks  # noqa: E402
from mmptm.kg.graph import load_graph, read_descriptions  # noqa: E402
from mmptm.train.kge import KGETrainConfig  # noqa: E402

MMPTM = [sys.executable, "-m", "mmptm.cli"]
PYKEEN_NAMES = {"transe": "TransE", "rotate": "RotatE", "complex": "ComplEx",
                "distmult": "DistMult"}  # fmt: skip


def prepare(args: argparse.Namespace) -> None:
    counts = write_graph(args.data, k=args.k, share=args.share, seed=args.seed)
    (args.data / "counts.json").write_text(json.dumps(counts, indent=2) + "\n")
    print(json.dumps(counts))


def baselines(data: Path) -> dict[str, dict]:
    """Filtered metrics of the uniform scorer and the frequency prior on test."""
    g = load_graph(data)
    E, R = len(g.entities), len(g.relations)
    train, test = g.splits["train"], g.splits["test"]
    tail_count = np.zeros((R, E), np.float32)
    head_count = np.zeros((R, E), np.float32)
    np.add.at(tail_count, (train[:, 1], train[:, 2]), 1)
    np.add.at(head_count, (train[:, 1], train[:, 0]), 1)
    tables = {"tail": torch.from_numpy(tail_count), "head": torch.from_numpy(head_count)}
    out = {}
    scorers = {
        "uniform": lambda side, b: torch.zeros(len(b), E),
        "frequency": lambda side, b: tables[side][torch.as_tensor(b[:, 1])].clone(),
    }
    for name, fn in scorers.items():
        ranks = side_ranks(fn, test, g.all_true(), R, batch_size=256)
        m = side_metrics(ranks, test[:, 1])
        m["by_relation"] = {g.relations.names[r]: v for r, v in m["by_relation"].items()}
        out[name] = {"test": m}
    return out


def description_baseline(data: Path) -> dict[str, dict]:
    """Filtered metrics on test of a scorer that learns nothing from the graph, only words:
    every entity ranked by the cosine of its description's tf-idf vector (lower-cased words,
    smooth idf) to the known entity's; the relation is ignored."""
    from scipy import sparse

    g = load_graph(data)
    text = read_descriptions(data / "descriptions.txt")
    words = [re.findall(r"\w+", text.get(n, n).lower()) for n in g.entities.names]
    vocab: dict[str, int] = {}
    rows, cols = [], []
    for i, ws in enumerate(words):
        for w in ws:
            rows.append(i)
            cols.append(vocab.setdefault(w, len(vocab)))
    E = len(words)
    tf = sparse.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(E, len(vocab)))
    df = np.bincount(sparse.find(tf)[1], minlength=len(vocab))  # duplicates summed: one a doc
    idf = np.log((1 + E) / (1 + df)) + 1
    x = sparse.csr_matrix(tf.multiply(idf[None, :]))
    norm = np.sqrt(np.asarray(x.multiply(x).sum(1))).ravel()
    x = sparse.csr_matrix(x.multiply(1 / np.maximum(norm, 1e-12)[:, None]))
    xt = x.T.tocsc()

    def score(side: str, b: np.ndarray) -> torch.Tensor:
        known = b[:, 0] if side == "tail" else b[:, 2]
        return torch.from_numpy((x[known] @ xt).toarray())

    test = g.splits["test"]
    m = side_metrics(side_ranks(score, test, g.all_true(), len(g.relations), batch_size=256),
                     test[:, 1])  # fmt: skip
    m["by_relation"] = {g.relations.names[r]: v for r, v in m["by_relation"].items()}
    return {"tf-idf of the descriptions (no learning)": {"test": m}}


def model_flags(model: str, args: argparse.Namespace) -> dict[str, str]:
    """The options of one run: the benchmark's width and epochs, then ``--set`` overrides
    (``key=value`` or ``model.key=value`` for one model only)."""
    flags = {"model": model, "dim": str(args.dim), "epochs": str(args.epochs)}
    for item in args.set:
        key, _, value = item.partition("=")
        only, _, key = key.rpartition(".")
        if not only or only == model:
            flags[key.replace("-", "_")] = value
    return flags


def run_mmptm(data: Path, out: Path, flags: dict[str, str]) -> dict:
    cmd = [*MMPTM, "kg", "train-embeddings", str(data), "--out", str(out), "--no-progress"]
    for key, value in flags.items():
        if value in ("true", "false"):
            cmd.append(f"--{'' if value == 'true' else 'no-'}{key.replace('_', '-')}")
        else:
            cmd += [f"--{key.replace('_', '-')}", value]
    print("$ mmptm " + " ".join(cmd[len(MMPTM) :]), flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(cmd, check=True, env=env)
    return json.loads((out / "kge.json").read_text())


PYKEEN_SCRIPT = r"""
import json, sys, time
import torch
from pykeen.pipeline import pipeline
from pykeen.triples import TriplesFactory
a = json.loads(sys.argv[1])
torch.set_num_threads(1)
train = TriplesFactory.from_path(a["data"] + "/train.txt")
ids = dict(entity_to_id=train.entity_to_id, relation_to_id=train.relation_to_id)
valid = TriplesFactory.from_path(a["data"] + "/valid.txt", **ids)
test = TriplesFactory.from_path(a["data"] + "/test.txt", **ids)
model_kwargs = dict(embedding_dim=a["dim"])
if a["model"] == "TransE":
    model_kwargs["scoring_fct_norm"] = a["p_norm"]
# ComplEx keeps PyKEEN's default L2 regulariser: it bounds the product as mmptm's unit norm does
schedule = {}
if a["lr_schedule"] == "cosine":
    schedule = dict(lr_scheduler="CosineAnnealingLR", lr_scheduler_kwargs=dict(T_max=a["epochs"]))
elif a["lr_schedule"] == "linear":
    schedule = dict(lr_scheduler="LambdaLR",
                    lr_scheduler_kwargs=dict(lr_lambda=lambda e: 1 - e / a["epochs"]))
res = pipeline(
    training=train, validation=valid, testing=test, model=a["model"], model_kwargs=model_kwargs,
    loss="nssa", loss_kwargs=dict(margin=a["margin"], adversarial_temperature=a["temperature"]),
    negative_sampler="basic", negative_sampler_kwargs=dict(num_negs_per_pos=a["negatives"]),
    optimizer=a["optimizer"], optimizer_kwargs=dict(lr=a["lr"]), **schedule,
    training_kwargs=dict(num_epochs=a["epochs"], batch_size=a["batch_size"], use_tqdm=False),
    evaluator_kwargs=dict(filtered=True), evaluation_kwargs=dict(use_tqdm=False),
    random_seed=a["seed"], device="cpu",
)
m = res.metric_results
out = {"train_seconds": res.train_seconds, "losses": res.losses,
       "triples_per_s": a["epochs"] * train.num_triples / res.train_seconds}
names = (("mrr", "inverse_harmonic_mean_rank"), ("hits@1", "hits_at_1"), ("hits@3", "hits_at_3"),
         ("hits@10", "hits_at_10"))
out["test"] = {side: {k: m.get_metric(f"{side}.realistic.{n}") for k, n in names}
               for side in ("tail", "head", "both")}
print("PYKEEN_RESULT " + json.dumps(out))
"""


def run_pykeen(python: str, data: Path, flags: dict[str, str]) -> dict:
    """The same run in PyKEEN: one complex number per two of mmptm's real floats."""
    known = KGETrainConfig.__dataclass_fields__
    typed = {k: known[k].type for k in flags if k in known}
    cfg = KGETrainConfig(**{k: _parse(v, typed[k]) for k, v in flags.items() if k in typed})
    cfg = cfg.resolved()  # the model-dependent margin
    complex_model = cfg.model in ("rotate", "complex")
    if cfg.model == "rotate" and cfg.p_norm != 2:
        print("note: PyKEEN's RotatE is the L2 one (mmptm --p-norm 2)", flush=True)
    hp = dict(data=str(data), model=PYKEEN_NAMES[cfg.model], p_norm=cfg.p_norm,
              dim=cfg.dim // 2 if complex_model else cfg.dim, margin=cfg.margin,
              temperature=cfg.adversarial_temperature, negatives=cfg.negatives,
              optimizer=cfg.optimizer, lr=cfg.lr, lr_schedule=cfg.lr_schedule,
              batch_size=cfg.batch_size, epochs=cfg.epochs, seed=cfg.seed)  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t0 = time.perf_counter()
    proc = subprocess.run([python, "-c", PYKEEN_SCRIPT, json.dumps(hp)], capture_output=True,
                          text=True, env=env)  # fmt: skip
    line = [x for x in proc.stdout.splitlines() if x.startswith("PYKEEN_RESULT ")]
    if proc.returncode or not line:
        print(f"pykeen failed ({time.perf_counter() - t0:.0f} s):\n{proc.stderr[-3000:]}")
        return {"pykeen": hp, "error": proc.stderr[-3000:]}
    return {"pykeen": hp, **json.loads(line[0].split(" ", 1)[1])}


def _parse(value: str, kind: object) -> object:
    text = str(kind)
    if "bool" in text:
        return value == "true"
    if "int" in text:
        return int(value)
    if "float" in text:
        return float(value)
    return value


def run(args: argparse.Namespace) -> None:
    args.runs.mkdir(parents=True, exist_ok=True)
    path = args.runs / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    if not args.skip_baselines:
        results.update(baselines(args.data))
    for model in args.models.split(","):
        flags = model_flags(model, args)
        name = args.name_prefix + model
        if not args.pykeen_only:
            r = run_mmptm(args.data, args.runs / name, flags)
            results[name] = {"flags": flags, "test": r["test"], "train": r["train"],
                             "losses": [h["loss"] for h in r["history"]]}  # fmt: skip
            path.write_text(json.dumps(results, indent=2) + "\n")
        if args.pykeen_python:
            results[f"{name} (PyKEEN)"] = {
                "flags": flags,
                **run_pykeen(args.pykeen_python, args.data, flags),
            }
        path.write_text(json.dumps(results, indent=2) + "\n")
    table(args)


def kepler_data(data: Path, prep: Path, vocab_size: int) -> dict[str, Path]:
    """KEPLER's inputs as a user writes them: triple shards with both entities' descriptions
    (``mmptm data triples``), MLM text shards of the descriptions alone (``mmptm data text``)
    and a BPE tokenizer fitted to those shards; kept when a previous call wrote them."""
    paths = {"triples": prep / "triples", "text": prep / "text",
             "tokenizer": prep / "tokenizer.model"}  # fmt: skip
    if paths["tokenizer"].exists():
        return paths
    prep.mkdir(parents=True, exist_ok=True)
    lines = (data / "descriptions.txt").read_text(encoding="utf-8").splitlines()
    # the text shards hold what a reader sees, the lemmas and gloss, not the synset ids
    (prep / "descriptions.txt").write_text(
        "".join(line.split("\t", 1)[-1] + "\n" for line in lines), encoding="utf-8"
    )
    _mmptm(["data", "triples", str(data), "--out", str(paths["triples"])])
    _mmptm(["data", "text", "--input", str(prep / "descriptions.txt"), "--out",
            str(paths["text"]), "--lang", "en"])  # fmt: skip
    _mmptm(["tokenizer", "train", "--input", str(paths["text"] / "train-*.tar"), "--out",
            str(prep / "tokenizer"), "--vocab-size", str(vocab_size), "--model-type", "bpe",
            "--fit-to-data"])  # fmt: skip
    return paths


def _mmptm(argv: list[str], capture: bool = False) -> str:
    print("$ mmptm " + " ".join(argv), flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([*MMPTM, *argv], check=True, env=env, text=True,
                          stdout=subprocess.PIPE if capture else None)  # fmt: skip
    return proc.stdout or ""


def kepler(args: argparse.Namespace) -> None:
    """``kepler_tiny`` pre-trained on the graph and its descriptions, then ranked by
    ``mmptm eval link-prediction`` (the filtered protocol of ``run``); one row of the table."""
    args.runs.mkdir(parents=True, exist_ok=True)
    path = args.runs / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    if not args.skip_baselines:
        results.update(baselines(args.data))
        results.update(description_baseline(args.data))
        path.write_text(json.dumps(results, indent=2) + "\n")
    if args.baselines_only:
        return table(args)
    paths = kepler_data(args.data, args.runs / "kepler_data", args.vocab_size)
    run_dir = args.runs / re.sub(r"[^\w.-]+", "_", args.name).strip("_")  # a plain folder name
    over = [
        f"output_dir={run_dir}",
        f"data.tokenizer={paths['tokenizer']}",
        f"data.sources.text.shards={paths['text']}/train-*.tar",
        f"data.sources.triples.shards={paths['triples']}/train-*.tar",
        f"model.objectives.ke.relations={paths['triples']}/relations.txt",
        "data.val=__delete__",  # the recipe's toyworld text; link prediction is the test here
        "data.test=__delete__",
        f"train.max_steps={args.steps}",
        "train.progress=false",
        *args.set,
    ]
    t0 = time.perf_counter()
    _mmptm(["pretrain", args.recipe, *over])
    seconds = time.perf_counter() - t0
    out = _mmptm(["eval", "link-prediction", str(run_dir), "--graph", str(args.data)],
                 capture=True)  # fmt: skip
    print(out, end="")
    test = json.loads(out.strip().splitlines()[-1])
    log = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = {k: next((r[k] for r in reversed(log) if k in r), None)
            for k in ("ke_loss", "ke_acc", "mlm_loss", "mlm_acc")}  # fmt: skip
    # read again: another run (e.g. the MLM-only one) may have added its row meanwhile
    results = json.loads(path.read_text()) if path.exists() else {}
    results[args.name] = {"recipe": args.recipe, "overrides": over, "test": test,
                          "train": {"seconds": seconds, "steps": args.steps},
                          "last_logged": last}  # fmt: skip
    path.write_text(json.dumps(results, indent=2) + "\n")
    table(args)


def table(args: argparse.Namespace) -> None:
    """Markdown: test metrics (both sides) and Hits@1 on the symmetric relations."""
    results = {}
    for folder in [args.runs, *getattr(args, "merge", [])]:
        results.update(json.loads((folder / "results.json").read_text()))
    sym = sorted(SYMMETRIC)
    lines = ["| scorer | MRR | Hits@1 | Hits@3 | Hits@10 | train s | loss min (epoch) → end | "
             + " | ".join(f"H@1 {s}" for s in sym) + " |",
             "|---" * (7 + len(sym)) + "|"]  # fmt: skip
    for name, r in results.items():
        if "test" not in r:
            continue  # a failed run (its error is in results.json)
        b = r["test"]["both"]
        losses = r.get("losses") or []
        curve = ""
        if losses:
            lo = int(np.argmin(losses))
            curve = f"{losses[lo]:.3f} ({lo + 1}) → {losses[-1]:.3f}"
        secs = r.get("train", {}).get("seconds", r.get("train_seconds", ""))
        by = r["test"].get("by_relation", {})
        cells = [f"{by[s]['hits@1']:.3f}" if s in by else "" for s in sym]
        lines.append(f"| {name} | {b['mrr']:.4f} | {b['hits@1']:.4f} | {b['hits@3']:.4f} "
                     f"| {b['hits@10']:.4f} | {secs and round(float(secs))} | {curve} | "
                     + " | ".join(cells) + " |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    (args.runs / "results.md").write_text(text)
    print(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("prepare")
    pr.add_argument("--data", type=Path, required=True)
    pr.add_argument("--k", type=int, default=4, help="k-core: every entity in ≥ k triples")
    pr.add_argument("--share", type=float, default=0.05, help="of the facts, each for valid/test")
    pr.add_argument("--seed", type=int, default=0)
    ru = sub.add_parser("run")
    ru.add_argument("--data", type=Path, required=True)
    ru.add_argument("--runs", type=Path, required=True)
    ru.add_argument("--models", default="transe,rotate,complex")
    ru.add_argument("--dim", type=int, default=100, help="real floats per entity")
    ru.add_argument("--epochs", type=int, default=50)
    ru.add_argument("--set", action="append", default=[],
                    help="key=value (or model.key=value) of train-embeddings")  # fmt: skip
    ru.add_argument("--name-prefix", default="", help="prefix of the runs' names")
    ru.add_argument("--skip-baselines", action="store_true")
    ru.add_argument("--pykeen-python", default="", help="a python with pykeen (off: none)")
    ru.add_argument("--pykeen-only", action="store_true", help="PyKEEN's runs, not mmptm's")
    ke = sub.add_parser("kepler", help="KEPLER: a text model of the entities' descriptions")
    ke.add_argument("--data", type=Path, required=True)
    ke.add_argument("--runs", type=Path, required=True)
    ke.add_argument("--recipe", default="kepler_tiny")
    ke.add_argument("--steps", type=int, default=1000)
    ke.add_argument("--vocab-size", type=int, default=8000, help="the BPE tokenizer's cap")
    ke.add_argument("--name", default="mmptm KEPLER (kepler_tiny)", help="the row's name")
    ke.add_argument("--set", action="append", default=[],
                    help="dotted key=value override of the recipe, e.g. "
                    "data.sources.triples.weight=0 (MLM only)")  # fmt: skip
    ke.add_argument("--skip-baselines", action="store_true")
    ke.add_argument("--baselines-only", action="store_true",
                    help="the rows that learn nothing (chance, frequency, tf-idf)")  # fmt: skip
    ta = sub.add_parser("table")
    ta.add_argument("--runs", type=Path, required=True)
    ta.add_argument("--merge", type=Path, nargs="*", default=[],
                    help="more RUNS folders whose results.json join the table")  # fmt: skip
    args = p.parse_args()
    torch.set_num_threads(1)
    {"prepare": prepare, "run": run, "kepler": kepler, "table": table}[args.cmd](args)


if __name__ == "__main__":
    main()
