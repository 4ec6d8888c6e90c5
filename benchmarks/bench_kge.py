"""TransE on a real graph available offline (Debian's package index): mmptm vs PyKEEN.

The graph: ``apt-cache dumpavail`` (or ``/var/lib/dpkg/status`` with ``--source dpkg``), one
entity per package, section, maintainer and debtag, with relations ``depends`` (Depends and
Pre-Depends, first alternative), ``recommends``, ``suggests``, ``built_from`` (Source),
``section``, ``maintainer``, ``tag``. A seeded sample of ``--packages`` packages keeps the run
in minutes on 2 CPU cores; the triples are split 90/5/5 into the FB15k-237 layout
(``train.txt``, ``valid.txt``, ``test.txt``), so ``mmptm kg train-embeddings DIR`` reads it.

Both libraries train TransE (L1 distance, unit-norm entities, the self-adversarial
negative-sampling loss with the same γ and α, the same negatives per positive, Adam with
the same learning rate, batch and epochs) on the same triples, and are evaluated by filtered
link prediction on the same test triples (realistic ranks, both sides). PyKEEN runs in its
own virtual environment (``--pykeen-python``), a subprocess, so it never enters mmptm's.
Prints one JSON line per library and a Markdown table.

    python benchmarks/bench_kge.py --out /tmp/kge-bench [--packages 6000] [--epochs 20]
        [--pykeen-python /work/venv-pykeen/bin/python] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

RELATION_FIELDS = {"Depends": "depends", "Pre-Depends": "depends", "Recommends": "recommends",
                   "Suggests": "suggests"}  # fmt: skip


def stanzas(text: str) -> list[dict[str, str]]:
    """deb822 paragraphs (continuation lines joined)."""
    out = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in block.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if "Package" in fields:
            out.append(fields)
    return out


def package_triples(source: str, packages: int, seed: int) -> list[tuple[str, str, str]]:
    if source == "apt":
        text = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip
    else:
        text = Path("/var/lib/dpkg/status").read_text(encoding="utf-8")
    pkgs = {s["Package"]: s for s in stanzas(text)}
    names = sorted(pkgs)
    keep = set(random.Random(seed).sample(names, min(packages, len(names))))
    triples = set()
    for name in sorted(keep):
        s = pkgs[name]
        for field, rel in RELATION_FIELDS.items():
            for group in s.get(field, "").split(","):
                dep = re.split(r"[\s(|:]", group.strip(), maxsplit=1)[0]
                if dep in keep and dep != name:
                    triples.add((name, rel, dep))
        src = s.get("Source", "").split(" ")[0]
        if src and src != name:
            triples.add((name, "built_from", f"src:{src}"))
        if s.get("Section"):
            triples.add((name, "section", f"section:{s['Section']}"))
        if s.get("Maintainer"):
            triples.add((name, "maintainer", "person:" + s["Maintainer"].split("<")[0].strip()))
        for tag in s.get("Tag", "").split(","):
            if tag.strip():
                triples.add((name, "tag", f"tag:{tag.strip()}"))
    return sorted(triples)


def write_graph(folder: Path, triples: list[tuple[str, str, str]], seed: int) -> dict[str, int]:
    triples = list(triples)
    random.Random(seed).shuffle(triples)
    k = len(triples) // 20
    parts = {"test": triples[:k], "valid": triples[k : 2 * k], "train": triples[2 * k :]}
    folder.mkdir(parents=True, exist_ok=True)
    for name, part in parts.items():
        (folder / f"{name}.txt").write_text("".join("\t".join(t) + "\n" for t in part))
    return {name: len(part) for name, part in parts.items()}


PYKEEN_SCRIPT = r"""
import json, sys, time
import torch
from pykeen.pipeline import pipeline
from pykeen.triples import TriplesFactory
a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"])
train = TriplesFactory.from_path(a["data"] + "/train.txt")
valid = TriplesFactory.from_path(a["data"] + "/valid.txt", entity_to_id=train.entity_to_id,
                                 relation_to_id=train.relation_to_id)
test = TriplesFactory.from_path(a["data"] + "/test.txt", entity_to_id=train.entity_to_id,
                                relation_to_id=train.relation_to_id)
t0 = time.perf_counter()
res = pipeline(
    training=train, validation=valid, testing=test, model="TransE",
    model_kwargs=dict(embedding_dim=a["dim"], scoring_fct_norm=1),
    loss="nssa", loss_kwargs=dict(margin=a["margin"], adversarial_temperature=a["temperature"]),
    negative_sampler="basic", negative_sampler_kwargs=dict(num_negs_per_pos=a["negatives"]),
    optimizer=a["optimizer"], optimizer_kwargs=dict(lr=a["lr"]),
    training_kwargs=dict(num_epochs=a["epochs"], batch_size=a["batch_size"], use_tqdm=False),
    evaluator_kwargs=dict(filtered=True), evaluation_kwargs=dict(use_tqdm=False),
    random_seed=a["seed"], device="cpu",
)
train_s = res.train_seconds
m = res.metric_results
out = {"train_seconds": train_s, "triples_per_s": a["epochs"] * train.num_triples / train_s,
       "test_triples": test.num_triples}
for side in ("tail", "head", "both"):
    out[side] = {k: m.get_metric(f"{side}.realistic.{n}") for k, n in
                 (("mrr", "inverse_harmonic_mean_rank"), ("hits@1", "hits_at_1"),
                  ("hits@10", "hits_at_10"))}
print("PYKEEN_RESULT " + json.dumps(out))
"""


def run_mmptm(data: Path, out: Path, args: argparse.Namespace) -> dict:
    import torch

    from mmptm.train.kge import KGETrainConfig, train_embeddings

    torch.set_num_threads(args.threads)
    cfg = KGETrainConfig(
        model="transe", dim=args.dim, p_norm=1, loss="nssa", margin=args.margin,
        adversarial_temperature=args.temperature, negatives=args.negatives,
        optimizer=args.optimizer, lr=args.lr, lr_schedule="constant",  # as PyKEEN here
        batch_size=args.batch_size, epochs=args.epochs,
        seed=args.seed, mmap=args.mmap,
    )  # fmt: skip
    r = train_embeddings(data, out, cfg, progress=False)
    test = r["test"]
    return {"train_seconds": r["train"]["seconds"], "triples_per_s": r["train"]["triples_per_s"],
            "test_triples": test["both"]["count"] // 2, "graph": r["graph"],
            **{side: {k: test[side][k] for k in ("mrr", "hits@1", "hits@10")}
               for side in ("tail", "head", "both")}}  # fmt: skip


def run_pykeen(data: Path, args: argparse.Namespace) -> dict:
    hp = dict(data=str(data), dim=args.dim, margin=args.margin, temperature=args.temperature,
              negatives=args.negatives, optimizer=args.optimizer, lr=args.lr,
              batch_size=args.batch_size, epochs=args.epochs, seed=args.seed,
              threads=args.threads)  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    t0 = time.perf_counter()
    proc = subprocess.run([args.pykeen_python, "-c", PYKEEN_SCRIPT, json.dumps(hp)],
                          capture_output=True, text=True, env=env)  # fmt: skip
    line = [x for x in proc.stdout.splitlines() if x.startswith("PYKEEN_RESULT ")]
    if proc.returncode or not line:
        sys.exit(f"pykeen failed ({time.perf_counter() - t0:.0f} s):\n{proc.stderr[-3000:]}")
    return json.loads(line[0].split(" ", 1)[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--source", choices=["apt", "dpkg"], default="apt")
    p.add_argument("--packages", type=int, default=6000)
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--margin", type=float, default=6.0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--negatives", type=int, default=32)
    p.add_argument("--optimizer", choices=["adam", "adagrad", "sgd"], default="adam")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--mmap", action="store_true", help="mmptm's entity table memory-mapped")
    p.add_argument("--pykeen-python", default="", help="a python with pykeen installed")
    p.add_argument("--repeats", type=int, default=1, help="runs of each library, alternating")
    args = p.parse_args()
    data = args.out / "graph"
    sizes = write_graph(data, package_triples(args.source, args.packages, args.seed), args.seed)
    print(f"graph ({args.source}, {args.packages} packages sampled): {json.dumps(sizes)}")
    runs: dict[str, list[dict]] = {"mmptm": []}
    # the libraries alternate, run after run, so that background load falls on both alike
    for i in range(args.repeats):
        runs["mmptm"].append(run_mmptm(data, args.out / "mmptm", args))
        print(f"run {i + 1} mmptm " + json.dumps(runs["mmptm"][-1]), flush=True)
        if args.pykeen_python:
            runs.setdefault("pykeen", []).append(run_pykeen(data, args))
            print(f"run {i + 1} pykeen " + json.dumps(runs["pykeen"][-1]), flush=True)
    print(
        "\n| library | triples/s (median) | min | max | test MRR (both) | Hits@1 | Hits@10 "
        "| tail MRR | head MRR |\n|---|---|---|---|---|---|---|---|---|"
    )
    for name, rs in runs.items():
        rates = [r["triples_per_s"] for r in rs]
        r = rs[0]
        b = r["both"]
        print(
            f"| {name} | {statistics.median(rates):.0f} | {min(rates):.0f} | {max(rates):.0f} "
            f"| {b['mrr']:.4f} | {b['hits@1']:.4f} | {b['hits@10']:.4f} "
            f"| {r['tail']['mrr']:.4f} | {r['head']['mrr']:.4f} |"
        )
    if "pykeen" in runs:
        paired = [a["triples_per_s"] / b["triples_per_s"] for a, b in zip(*runs.values())]
        print(f"per-run speed ratios mmptm/pykeen: {' '.join(f'{x:.2f}' for x in paired)}")
    results = runs
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
