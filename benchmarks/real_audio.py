"""The audio recipes on real recorded sound: drum-instrument classification with whole kits
held out, beside baselines that learn nothing (docs/results/real-audio.md).

    python benchmarks/real_audio.py prepare   --data data/real_audio
    python benchmarks/real_audio.py baselines --data data/real_audio
    python benchmarks/real_audio.py pretrain  --data data/real_audio --runs runs/real_audio \\
        [--recipes wav2vec2_tiny,hubert_tiny,speechbert_tiny] [--steps N] [--set k=v ...]
    python benchmarks/real_audio.py finetune  --data data/real_audio --runs runs/real_audio \\
        [--recipes ...] [--scratch] [--steps N] [--set k=v ...] [--tag NAME]
    (pretrain / finetune --test-fold K: the k-fold protocol, runs in RUNS/test_fold<K>)

``prepare`` fetches Debian's ``hydrogen-drumkits`` and ``hydrogen-data`` with ``apt-get
download`` (``real_audio_data.py``: kits → labelled clips → author-grouped folds in ESC-50's
layout), then writes shards with ``mmptm data esc50 --sample-rate 16000``, as a user would.
The held-out split trains on folds 1..k-1 and tests on fold k (no kit, and no kit author,
of the test fold is seen in training). ``baselines`` scores, on that split and as a k-fold
mean: the majority class; log-mel statistics (mean and standard deviation per band) and
MFCC statistics, each with a logistic regression fitted on the train folds; and the
pooled vector of each audio recipe's randomly initialised encoder with the same probe.
``pretrain`` trains wav2vec2_tiny / hubert_tiny / speechbert_tiny (its audio side alone:
masked log-mel frames, no written text) on the train folds' audio, no labels (HuBERT: MFCC
units fitted with ``mmptm units fit`` first). ``finetune`` runs the ``audio_classification``
recipe from each pre-trained run (``--scratch``: the same shape from random weights) and
scores accuracy and macro-F1 on the test fold. Results go to ``<runs>/results.json``.
Torch runs on one thread (``OMP_NUM_THREADS=1``) unless ``--threads`` says otherwise.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_audio_data as rad  # noqa: E402
from real_parallel_data import fetch, licences  # noqa: E402

MMPTM = [sys.executable, "-m", "mmptm.cli"]
PACKAGES = ("hydrogen-drumkits", "hydrogen-data")
RECIPES = ("wav2vec2_tiny", "hubert_tiny", "speechbert_tiny")
RATE = 16000
#: no text is read: the recipes' toyworld tokenizer is not needed (CLAP keeps its audio tower)
NO_TEXT = ['data.tokenizer=""']
AUDIO_ONLY = {
    "clap_tiny": [*NO_TEXT, "model.encoders.text=__delete__",
                  "model.objectives.contrastive=__delete__", "model.fusion.pooling={audio: mean}"],
    # SpeechBERT's audio side alone: masked log-mel frames (NCE), no written text
    "speechbert_tiny": [*NO_TEXT, "model.encoders.text=__delete__",
                        "model.objectives.mlm=__delete__"],
}  # fmt: skip


def sh(cmd: list[str], log: Path | None = None) -> None:
    """Run an mmptm command (printed first, as a user would type it)."""
    shown = cmd[len(MMPTM) :] if cmd[: len(MMPTM)] == MMPTM else cmd
    print("$ mmptm " + " ".join(shown), flush=True)
    out = open(log, "a") if log else None  # noqa: SIM115 (closed below)
    try:
        subprocess.run(cmd, check=True, stdout=out, stderr=subprocess.STDOUT if out else None)
    finally:
        if out:
            out.close()


# -- prepare ------------------------------------------------------------------------------


def prepare(args: argparse.Namespace) -> None:
    """Kits → ESC-50 layout → shards (``mmptm data esc50``) + ``manifest.json``."""
    data, work = Path(args.data), Path(args.data) / "work"
    t0 = time.perf_counter()
    kits, packages = [], []
    for name in args.packages:
        version, root = fetch(name, work / "debs", work / "unpacked")
        copyright_file = root / "usr/share/doc" / name / "copyright"
        packages.append({"package": name, "version": version, "licences": licences(copyright_file)})
        kits += rad.read_kits(root / rad.KITS_DIR)
    dropped = rad.dedupe(kits)
    folds = rad.assign_folds(kits, args.folds)
    per_fold = rad.write_esc50(kits, folds, work / "esc50")
    sh([*MMPTM, "data", "esc50", "--root", str(work / "esc50"), "--out", str(data / "shards"),
        "--sample-rate", str(RATE), "--no-progress"])  # fmt: skip
    manifest = {
        "packages": packages,
        "classes": list(rad.CLASSES),
        "folds": args.folds,
        "clips_per_fold": per_fold,
        "dropped": dict(dropped),
        "kits": rad.summary(kits, folds),
    }
    (data / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(json.dumps({"clips_per_fold": per_fold, "dropped": dict(dropped)}))
    print(f"prepared {data} in {time.perf_counter() - t0:.0f}s; kits in {data}/manifest.json")


def folds_of(data: Path) -> int:
    return json.loads((data / "manifest.json").read_text())["folds"]


def split_specs(data: Path, test_fold: int = 0) -> tuple[str, str]:
    """(train, test) shard specs: the other folds against ``test_fold`` (0: the held-out
    split, fold k)."""
    k = folds_of(data)
    test = test_fold or k
    train = ",".join(str(i) for i in range(1, k + 1) if i != test)
    return f"{data}/shards/fold{{{train}}}/*.tar", f"{data}/shards/fold{test}/*.tar"


def window(seconds: float) -> str:
    """The audio plug-in's window: a random one of ``seconds`` in training, the middle one
    at test time."""
    return f"data.modalities.audio.max_seconds={seconds:g}"


def label_overrides(data: Path) -> list[str]:
    names = (data / "shards" / "labels.txt").read_text().split()
    return [f"data.modalities.label.names=[{','.join(names)}]"]


# -- baselines ----------------------------------------------------------------------------


def read_fold(folder: Path, seconds: float) -> tuple[list[np.ndarray], np.ndarray]:
    """Every clip of a fold's shards (mono float32 at RATE) and their labels, read straight
    from the tar members; a clip over ``seconds`` is cut to its middle ``seconds``, the
    window the audio plug-in gives a model at test time (``max_seconds``)."""
    import soundfile as sf

    waves, labels = [], []
    for shard in sorted(folder.glob("*.tar")):
        with tarfile.open(shard) as tar:
            members: dict[str, dict[str, bytes]] = {}
            for m in tar.getmembers():
                key, ext = m.name.split(".", 1)
                members.setdefault(key, {})[ext] = tar.extractfile(m).read()
        for key in sorted(members):
            wave, rate = sf.read(io.BytesIO(members[key]["flac"]), dtype="float32")
            assert rate == RATE, f"{shard}:{key}: {rate} Hz"
            want = round(seconds * RATE)
            start = max(0, (len(wave) - want) // 2)
            waves.append(wave[start : start + want])
            labels.append(json.loads(members[key]["json"])["label"])
    return waves, np.array(labels)


def stats_features(waves: list[np.ndarray], kind: str) -> torch.Tensor:
    """[N, 2F]: mean and standard deviation over frames of each band of log-mel (64 bands,
    25 ms windows every 10 ms) or MFCC (20 coefficients of the same mel bands)."""
    import torchaudio

    mel = dict(n_fft=400, win_length=400, hop_length=160, n_mels=64)
    if kind == "logmel":
        fn = torchaudio.transforms.MelSpectrogram(RATE, **mel)
    else:
        fn = torchaudio.transforms.MFCC(RATE, n_mfcc=20, melkwargs=mel)
    out = []
    for w in waves:
        x = torch.from_numpy(np.pad(w, (0, max(0, 400 - len(w)))))
        f = fn(x)
        if kind == "logmel":
            f = torch.log(f + 1e-6)
        out.append(torch.cat([f.mean(1), f.std(1, unbiased=False)]))
    return torch.stack(out)


def linear_probe(
    xa: torch.Tensor, ya: np.ndarray, xb: torch.Tensor, yb: np.ndarray
) -> dict[str, float]:
    """Accuracy and macro-F1 on (xb, yb) of mmptm's linear probe (standardised features,
    L2 from its grid on a held-out fifth of the train set, L-BFGS softmax regression)."""
    from mmptm.eval.probe import L2_GRID, fit_logistic

    classes = len(rad.CLASSES)
    ta = torch.from_numpy(ya).long()
    mean, std = xa.mean(0), xa.std(0).clamp_min(1e-6)
    xa, xb = (xa - mean) / std, (xb - mean) / std
    order = torch.randperm(len(xa), generator=torch.Generator().manual_seed(0))
    held, fit = order[: len(xa) // 5], order[len(xa) // 5 :]

    def predict(w: torch.Tensor, x: torch.Tensor) -> np.ndarray:
        return (torch.cat([x, torch.ones(len(x), 1)], 1).double() @ w).argmax(1).numpy()

    best = max(
        L2_GRID,
        key=lambda l2: (
            (predict(fit_logistic(xa[fit], ta[fit], classes, l2), xa[held]) == ya[held])
            .mean()
            .item()
        ),
    )
    return scores(yb, predict(fit_logistic(xa, ta, classes, best), xb)) | {"l2": best}


def scores(gold: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """Accuracy and macro-F1 (over the classes the test set holds; scikit-learn's)."""
    from sklearn.metrics import f1_score

    present = sorted(set(gold.tolist()))
    return {
        "acc": float((gold == pred).mean()),
        "macro_f1": float(f1_score(gold, pred, labels=present, average="macro", zero_division=0)),
    }


def random_encoder_features(
    recipe: str, data: Path, folds: list[Path], seconds: float
) -> tuple[list[torch.Tensor], list[np.ndarray]]:
    """Per fold, [N, E] pooled audio vectors of ``recipe``'s randomly initialised model (the
    recipe's seed) and [N] labels, read through the recipe's own pipeline (which skips, and
    counts, a clip too short for its encoder)."""
    from mmptm.eval.probe import embed_set
    from mmptm.models.load import build_model
    from mmptm.recipe import load_run_config

    over = [*AUDIO_ONLY.get(recipe, NO_TEXT), *label_overrides(data), window(seconds)]
    cfg = load_run_config(recipe, over)
    torch.manual_seed(cfg.seed)
    model, tok = build_model(cfg)
    model.eval()
    sets = [embed_set(model, cfg, tok, f"{fold}/*.tar", "audio", "cpu") for fold in folds]
    return [x for x, _ in sets], [y.numpy() for _, y in sets]


def evaluate_features(feats: list[torch.Tensor], labels: list[np.ndarray]) -> dict[str, float]:
    """The held-out split (train folds 1..k-1, test fold k) and the k-fold mean."""
    k = len(feats)
    out: dict[str, float] = {}
    accs, f1s = [], []
    for test in range(k):
        train = [i for i in range(k) if i != test]
        r = linear_probe(
            torch.cat([feats[i] for i in train]),
            np.concatenate([labels[i] for i in train]),
            feats[test],
            labels[test],
        )
        accs.append(r["acc"])
        f1s.append(r["macro_f1"])
        if test == k - 1:
            out.update(r)
    return out | kfold(accs, f1s)


def kfold(accs: list[float], f1s: list[float]) -> dict[str, float]:
    """The k-fold means and each fold's accuracy and macro-F1 (fold i tested, others trained)."""
    out = {"kfold_acc": float(np.mean(accs)), "kfold_macro_f1": float(np.mean(f1s))}
    for i, (a, f) in enumerate(zip(accs, f1s, strict=True)):
        out |= {f"fold{i + 1}_acc": a, f"fold{i + 1}_macro_f1": f}
    return out


def majority(labels: list[np.ndarray]) -> dict[str, float]:
    """The train folds' most frequent class, scored like the others."""
    k = len(labels)
    out: dict[str, float] = {}
    accs, f1s = [], []
    for test in range(k):
        train = np.concatenate([labels[i] for i in range(k) if i != test])
        top = np.bincount(train).argmax()
        r = scores(labels[test], np.full_like(labels[test], top))
        accs.append(r["acc"])
        f1s.append(r["macro_f1"])
        if test == k - 1:
            out.update(r)
    return out | kfold(accs, f1s)


def baselines(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    data = Path(args.data)
    folders = [data / "shards" / f"fold{i}" for i in range(1, folds_of(data) + 1)]
    read = [read_fold(f, args.seconds) for f in folders]
    waves, labels = [w for w, _ in read], [y for _, y in read]
    rows = {"majority class": majority(labels)}
    for kind in ("logmel", "mfcc"):
        t0 = time.perf_counter()
        rows[f"{kind} mean+std, logistic"] = evaluate_features(
            [stats_features(w, kind) for w in waves], labels
        ) | {"seconds": time.perf_counter() - t0}
    for recipe in ("wav2vec2_tiny", "clap_tiny", "speechbert_tiny"):
        t0 = time.perf_counter()
        feats, ys = random_encoder_features(recipe, data, folders, args.seconds)
        rows[f"random-weight {recipe} encoder, logistic"] = evaluate_features(feats, ys) | {
            "seconds": time.perf_counter() - t0,
            "n_test": float(len(ys[-1])),
        }
    rows["n"] = {f"fold{i + 1}": float(len(y)) for i, y in enumerate(labels)}
    rows["n"]["seconds"] = args.seconds
    save(Path(args.runs), f"baselines {args.seconds:g}s", rows)
    return rows


# -- recipes ------------------------------------------------------------------------------


def save(runs: Path, name: str, value: object) -> None:
    """Put ``value`` under ``name`` in ``<runs>/results.json`` (kept between commands)."""
    runs.mkdir(parents=True, exist_ok=True)
    path = runs / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results[name] = value
    path.write_text(json.dumps(results, indent=2) + "\n")


def common_overrides(args: argparse.Namespace, data: Path) -> list[str]:
    train, test = split_specs(data, args.test_fold)
    over = [f"data.train={train}", f"data.test={test}", *NO_TEXT, *label_overrides(data),
            window(args.seconds)]  # fmt: skip
    if args.steps:
        over.append(f"train.max_steps={args.steps}")
    return over + list(args.set)


def pretrain(args: argparse.Namespace) -> None:
    data, runs = Path(args.data), Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    train, _ = split_specs(data, args.test_fold)
    for recipe in args.recipes.split(","):
        out = runs / recipe
        over = [f"output_dir={out}", *AUDIO_ONLY.get(recipe, []), *common_overrides(args, data)]
        if recipe.startswith("hubert"):
            codebook = runs / "mfcc_units.npy"
            if not codebook.exists():
                sh([*MMPTM, "units", "fit", "--shards", train, "--audio-features", "mfcc",
                    "--k", str(args.units), "--no-progress", "--out", str(codebook)])  # fmt: skip
            over.append(f"model.objectives.hubert.codebook={codebook}")
        t0 = time.perf_counter()
        sh([*MMPTM, "pretrain", recipe, *over], runs / f"{recipe}.log")
        save(runs, f"pretrain {recipe}", {"seconds": time.perf_counter() - t0, "overrides": over})


@torch.no_grad()
def predictions(run: Path) -> tuple[np.ndarray, np.ndarray]:
    """(gold, predicted) classes of a fine-tuned run on its test set (data.eval.test)."""
    from mmptm.batch import move_to
    from mmptm.data.pipeline import single_pass, stream_config
    from mmptm.models.load import load_pretrained
    from mmptm.objectives.classification import Classification

    model, tok, cfg = load_pretrained(str(run))
    head = next(o for o in model.objectives.values() if isinstance(o, Classification))
    stream = stream_config(cfg.data, tok, split="test", shards=cfg.data.eval["test"],
                           needs=model.data_needs(), seed=cfg.seed)  # fmt: skip
    gold, pred = [], []
    for batch in single_pass(stream):
        if "__end__" in batch:
            continue
        batch = move_to(batch, "cpu")
        pred.append(head.logits(model.fuse(batch)).argmax(-1).numpy())
        gold.append(batch["labels"].numpy())
    return np.concatenate(gold), np.concatenate(pred)


def finetune(args: argparse.Namespace) -> None:
    data, runs = Path(args.data), Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    _, test = split_specs(data, args.test_fold)
    for recipe in args.recipes.split(","):
        name = f"finetune {recipe}" + (" scratch" if args.scratch else "") + args.tag
        out = runs / name.replace(" ", "_")
        over = [f"init={runs / recipe}", f"output_dir={out}", f"data.eval.test={test}",
                f"model.objectives.classify.num_labels={len(rad.CLASSES)}",
                *common_overrides(args, data)]  # fmt: skip
        if args.scratch:
            over.append("init_mode=architecture")
        t0 = time.perf_counter()
        sh([*MMPTM, "finetune", "audio_classification", *over], runs / f"{out.name}.log")
        took = time.perf_counter() - t0
        result = scores(*predictions(out)) | {"seconds": took, "overrides": over}
        print(json.dumps(result))
        save(runs, name, result)


def table(rows: dict[str, dict[str, float]]) -> str:
    """Markdown: one row per method, held-out accuracy / macro-F1 and the k-fold means."""
    lines = ["| method | acc | macro-F1 | k-fold acc | k-fold macro-F1 |", "|---|---|---|---|---|"]
    for name, r in rows.items():
        if "acc" not in r:
            continue
        cells = [r.get(c) for c in ("acc", "macro_f1", "kfold_acc", "kfold_macro_f1")]
        shown = [f"{100 * c:.1f}" if c is not None else "–" for c in cells]
        lines.append(f"| {name} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["prepare", "baselines", "pretrain", "finetune"])
    ap.add_argument("--data", default="data/real_audio")
    ap.add_argument("--runs", default="runs/real_audio")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--steps", type=int, default=0, help="train.max_steps (0: the recipe's)")
    ap.add_argument("--set", action="append", default=[], help="extra key=value overrides")
    ap.add_argument("--scratch", action="store_true", help="finetune: from random weights")
    ap.add_argument("--tag", default="", help="finetune: suffix of the run's name")
    ap.add_argument("--seconds", type=float, default=1.0,
                    help="audio window of baselines and recipes (max_seconds)")  # fmt: skip
    ap.add_argument("--test-fold", type=int, default=0,
                    help="pretrain/finetune: test on this fold, train on the others (runs go "
                    "to RUNS/test_fold<K>; default: the last fold)")  # fmt: skip
    ap.add_argument("--folds", type=int, default=4, help="prepare: kit-grouped folds")
    ap.add_argument("--units", type=int, default=32, help="pretrain: HuBERT's MFCC units")
    ap.add_argument("--packages", nargs="+", default=list(PACKAGES), help="prepare: .deb names")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (shared machines)")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the mmptm commands it runs too
    torch.set_num_threads(args.threads)
    if args.test_fold:
        args.runs = f"{args.runs}/test_fold{args.test_fold}"
    if args.action == "prepare":
        prepare(args)
    elif args.action == "baselines":
        print(table(baselines(args)))
    elif args.action == "pretrain":
        pretrain(args)
    else:
        finetune(args)


if __name__ == "__main__":
    main()
