"""Link prediction on a real lexical graph (WordNet 3.0 from Debian's ``wordnet-base``): mmptm's
knowledge-graph embeddings beside baselines that learn nothing and, behind a flag, PyKEEN.

    apt-get install -y wordnet-base
    python benchmarks/real_kg.py prepare --data data/real_kg [--k 4]
    python benchmarks/real_kg.py run --data data/real_kg --runs runs/real_kg \\
        [--models transe,rotate,complex] [--epochs 50] [--dim 200] [--set key=value ...] \\
        [--pykeen-python /work/venv-pykeen/bin/python]
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

Everything runs on one thread (``OMP_NUM_THREADS=1``). Results: ``RUNS/results.json`` and the
Markdown table ``RUNS/results.md``.
"""

from __future__ import annotations

import argparse
import json
import os
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
from mmptm.kg.graph import load_graph  # noqa: E402
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
    ta = sub.add_parser("table")
    ta.add_argument("--runs", type=Path, required=True)
    ta.add_argument("--merge", type=Path, nargs="*", default=[],
                    help="more RUNS folders whose results.json join the table")  # fmt: skip
    args = p.parse_args()
    torch.set_num_threads(1)
    {"prepare": prepare, "run": run, "table": table}[args.cmd](args)


if __name__ == "__main__":
    main()
