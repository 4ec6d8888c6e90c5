"""The image–text recipes on real pictures with human-written names: emoji ↔ their CLDR names,
retrieval beside baselines that learn nothing and an equal-shape open_clip model (issue 37).

    python benchmarks/real_vl.py prepare   --data data/real_vl
    python benchmarks/real_vl.py baselines --data data/real_vl [--split test] [--langs en,de]
    python benchmarks/real_vl.py pretrain  --data data/real_vl --runs runs/real_vl \\
        [--recipes clip_tiny] [--steps N] [--tag _x] [--langs en,de] [--set k=v ...]
    python benchmarks/real_vl.py eval      --data data/real_vl --runs runs/real_vl [--split test]
    python benchmarks/real_vl.py peer      --data data/real_vl --runs runs/real_vl [--steps N]

``prepare`` builds the data from two Debian packages (``real_vl_data.py``: Noto Color Emoji
pictures, CLDR 41 names and keywords in en, de, fr, es, ru, ja), splits it by emoji (train
/ val / test share no picture and no name), writes Karpathy's dataset JSON and the shards with
``mmptm data karpathy`` (``en/``: one sample a picture, its two English captions), the
same samples with the captions of every language (``multi/``), and BPE tokenizers with
``mmptm tokenizer train`` (1000 pieces, and one piece per training word:
``tokenizer_words``). ``baselines``: colour histograms and random-weight CNN features
mapped onto bag-of-words caption vectors by ridge regression fitted on train (the ridge
weight picked on val). ``pretrain`` runs ``mmptm pretrain`` per recipe on the ``en`` shards;
``eval`` runs ``mmptm eval retrieval`` on every run; ``peer`` trains open_clip's ``CLIP``
at clip_tiny's shape on the same batches (mmptm's loader) for the same steps and scores it
the same way. Queries: each picture's English name (caption 0); chance R@k = k / N.
``--langs`` (a comma list) uses the ``multi`` shards and their tokenizer instead, scoring
each language's names. The recipes read pictures (``clip_tiny``; ``vilt_tiny`` reads patches
too); those over region features (``albef_tiny``, ``uniter_tiny`` ...) need a detector's
features, which this data set does not have.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import subprocess
import sys
import tarfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_vl_data import (  # noqa: E402
    LICENCES,
    Renderer,
    collect_items,
    karpathy_json,
    missing_packages,
    multilingual_records,
    split_items,
    write_manifest,
)

from mmptm.data.shards import ShardWriter  # noqa: E402
from mmptm.eval.retrieval import recall_at_k  # noqa: E402

LANGS = ("en", "de", "fr", "es", "ru", "ja")
RECIPES = ("clip_tiny",)
MMPTM = [sys.executable, "-m", "mmptm.cli"]
KS = (1, 5, 10)


def sh(cmd: list[str], log: Path | None = None) -> None:
    """Run an mmptm command (printed first, as a user would type it)."""
    print("$ mmptm " + " ".join(cmd[len(MMPTM) :] if cmd[: len(MMPTM)] == MMPTM else cmd))
    out = open(log, "a") if log else None  # noqa: SIM115 (closed below)
    try:
        subprocess.run(cmd, check=True, stdout=out, stderr=subprocess.STDOUT if out else None)
    finally:
        if out:
            out.close()


# -- prepare ------------------------------------------------------------------------------


def read_shards(pattern: str) -> list[dict]:
    """Samples of the shards matching ``pattern`` in file order: ``{"key", "jpg", "json"}``."""
    paths = sorted(Path(pattern).parent.glob(Path(pattern).name))
    if not paths:
        raise SystemExit(f"no shards match {pattern}: run `prepare` first")
    samples: dict[str, dict] = {}
    for path in paths:
        with tarfile.open(path) as tar:
            for m in tar.getmembers():
                key, _, ext = m.name.partition(".")
                data = tar.extractfile(m).read()
                samples.setdefault(key, {"key": key})[ext] = (
                    json.loads(data) if ext == "json" else data
                )
    return list(samples.values())


def write_multilingual(data: Path, records: list[dict]) -> dict[str, int]:
    """``multi/{split}-*.tar``: the ``en`` shards' samples with every language's captions."""
    by_key = {r["key"]: r for r in records}
    counts = {}
    for split in ("train", "val", "test"):
        samples = read_shards(f"{data}/en/{split}-*.tar")
        with ShardWriter(data / "multi" / f"{split}-%06d.tar", 500) as writer:
            for s in samples:
                meta = dict(s["json"], captions=by_key[s["key"]]["captions"])
                writer.write({"__key__": s["key"], "jpg": s["jpg"], "txt": s["txt"], "json": meta})
        counts[split] = len(samples)
    return counts


def prepare(args: argparse.Namespace) -> None:
    missing = missing_packages()
    if missing:
        raise SystemExit(f"missing Debian packages: apt-get install {' '.join(missing)}")
    data = Path(args.data)
    work = data / "work"
    t0 = time.perf_counter()
    items = collect_items(LANGS, skin_tones=args.skin_tones)
    parts, moved = split_items(items, args.val_fraction, args.test_fraction, args.seed)
    dataset, not_drawn = karpathy_json(parts, Renderer(size=args.size), work / "images", "en")
    (work / "dataset_emoji.json").write_text(json.dumps(dataset, ensure_ascii=False))
    sh([*MMPTM, "data", "karpathy", "--input", str(work / "dataset_emoji.json"), "--images",
        str(work / "images"), "--out", str(data / "en"), "--shard-size", "500",
        "--no-progress"])  # fmt: skip
    counts = write_multilingual(data, multilingual_records(dataset, items))
    sh([*MMPTM, "tokenizer", "train", "--input", f"{data}/en/train-*.tar", "--out",
        str(data / "tokenizer"), "--vocab-size", str(args.vocab),
        "--model-type", "bpe"])  # fmt: skip
    # a piece per training word (more pieces than words: the first pieces are characters)
    sh([*MMPTM, "tokenizer", "train", "--input", f"{data}/en/train-*.tar", "--out",
        str(data / "tokenizer_words"), "--vocab-size", "12000", "--model-type", "bpe",
        "--fit-to-data"])  # fmt: skip
    sh([*MMPTM, "tokenizer", "train", "--input", f"{data}/multi/train-*.tar", "--out",
        str(data / "tokenizer_multi"), "--vocab-size", str(args.vocab_multi),
        "--model-type", "bpe"])  # fmt: skip
    info = {
        "sources": LICENCES,
        "languages": list(LANGS),
        "named_emoji": len(items),
        "not_drawn": not_drawn,
        "moved_to_train_for_a_shared_name": moved,
        "pictures": counts,
        "picture_px": args.size,
        "skin_tones": args.skin_tones,
        "seed": args.seed,
    }
    write_manifest(data / "manifest.json", info)
    print(json.dumps(info, ensure_ascii=False))
    print(f"prepared {data} in {time.perf_counter() - t0:.0f}s")


# -- baselines ----------------------------------------------------------------------------


def pictures(samples: list[dict], size: int = 64) -> torch.Tensor:
    """Decoded pictures [N,3,size,size] in [0, 1] (bicubic, as the recipes' image plug-in)."""
    out = []
    for s in samples:
        with Image.open(io.BytesIO(s["jpg"])) as img:
            img = img.convert("RGB").resize((size, size), Image.Resampling.BICUBIC)
            out.append(torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1))
    return torch.stack(out).float() / 255


def colour_histogram(x_NCHW: torch.Tensor, bins: int = 8) -> torch.Tensor:
    """Joint RGB histograms [N,bins³] (square-rooted: Hellinger), over the whole picture and
    over its 2×2 quarters (where the colours are)."""
    q_NHW = (x_NCHW.clamp(0, 1 - 1e-6) * bins).long()
    code_NHW = (q_NHW[:, 0] * bins + q_NHW[:, 1]) * bins + q_NHW[:, 2]
    n, h, w = code_NHW.shape
    parts = [code_NHW]
    parts += [code_NHW[:, i : i + h // 2, j : j + w // 2] for i in (0, h // 2) for j in (0, w // 2)]
    feats = []
    for part in parts:
        flat = part.reshape(n, -1)
        hist = torch.zeros(n, bins**3).scatter_add_(
            1, flat, torch.ones_like(flat, dtype=torch.float)
        )
        feats.append((hist / flat.shape[1]).sqrt())
    return torch.cat(feats, 1)


def random_cnn(x_NCHW: torch.Tensor, seed: int) -> torch.Tensor:
    """Pooled features of clip_tiny's backbone (timm ``test_resnet``) at random weights."""
    import timm

    torch.manual_seed(seed)
    net = timm.create_model("test_resnet", pretrained=False, num_classes=0).eval()
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    with torch.no_grad():
        return torch.cat([net((x - mean) / std) for x in x_NCHW.split(256)])


def words(text: str) -> list[str]:
    return "".join(c.lower() if c.isalnum() else " " for c in text).split()


class BagOfWords:
    """tf-idf vectors over the words of the training captions (others are dropped)."""

    def __init__(self, texts: list[str], split: Callable[[str], list[str]] = words) -> None:
        self.split = split
        df = Counter(w for t in texts for w in set(split(t)))
        self.index = {w: i for i, w in enumerate(sorted(df))}
        self.idf = torch.tensor([math.log((1 + len(texts)) / (1 + df[w])) + 1 for w in sorted(df)])

    def __call__(self, texts: list[str]) -> torch.Tensor:
        out = torch.zeros(len(texts), len(self.index))
        for i, t in enumerate(texts):
            for w, n in Counter(self.split(t)).items():
                if w in self.index:
                    out[i, self.index[w]] = n
        return F.normalize(out * self.idf, dim=-1)


def ridge(x_ND: torch.Tensor, y_NE: torch.Tensor, lam: float) -> torch.Tensor:
    """W [D,E] minimising |x W - y|² + lam |W|² (x already centred and scaled)."""
    d = x_ND.shape[1]
    a = x_ND.T.double() @ x_ND.double() + lam * torch.eye(d, dtype=torch.float64)
    return torch.linalg.solve(a, x_ND.T.double() @ y_NE.double()).float()


def linear_map_retrieval(
    feats: dict[str, torch.Tensor],
    texts: dict[str, list[list[str]]],
    split: str,
    split_words: Callable[[str], list[str]] = words,
) -> tuple[dict[str, float], float]:
    """Retrieval on ``split`` of image features mapped by ridge regression onto tf-idf
    caption vectors, fitted on train (both captions of a picture are targets); the ridge
    weight with the best val R@1 (mean of both directions). Returns (result, weight)."""
    bow = BagOfWords([c for cs in texts["train"] for c in cs], split_words)
    mu, sd = feats["train"].mean(0), feats["train"].std(0) + 1e-6
    x = {k: (v - mu) / sd for k, v in feats.items()}
    x_train = torch.cat([x["train"]] * 2)
    y_train = torch.cat([bow([cs[j] for cs in texts["train"]]) for j in (0, 1)])

    def score(w: torch.Tensor, part: str) -> dict[str, float]:
        sim = F.normalize(x[part] @ w, dim=-1) @ bow([cs[0] for cs in texts[part]]).T
        return recall_at_k(sim, KS)

    best = None
    for lam in (1.0, 10.0, 100.0, 1e3, 1e4, 1e5):
        w = ridge(x_train, y_train, lam)
        r = score(w, "val")
        mean = (r["i2t_R@1"] + r["t2i_R@1"]) / 2
        if best is None or mean > best[0]:
            best = (mean, lam, w)
    return score(best[2], split), best[1]


def baselines(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    data, langs = Path(args.data), args.langs.split(",")
    folder = "en" if langs == ["en"] else "multi"
    samples = {p: read_shards(f"{data}/{folder}/{p}-*.tar") for p in ("train", "val", args.split)}
    pix = {p: pictures(ss) for p, ss in samples.items()}
    kinds = {
        "colour histogram": {p: colour_histogram(x) for p, x in pix.items()},
        "random-weight CNN (test_resnet)": {p: random_cnn(x, args.seed) for p, x in pix.items()},
    }
    kinds["both"] = {p: torch.cat([kinds[k][p] for k in list(kinds)], 1) for p in pix}
    n = len(samples[args.split])
    rows = {"chance": {f"{d}_R@{k}": k / n for d in ("i2t", "t2i") for k in KS}}
    split_words = words
    if folder == "multi":  # Japanese has no spaces: the shared tokenizer's pieces instead
        from mmptm.tokenizers.sentencepiece import Tokenizer

        tok = Tokenizer.load(data / "tokenizer_multi.model")
        split_words = lambda t: [str(i) for i in tok.encode(t)]  # noqa: E731
    for lang in langs:
        texts = {p: [s["json"]["captions"][lang] for s in ss] for p, ss in samples.items()}
        for name, feats in kinds.items():
            if folder == "multi" and name != "both":
                continue
            result, lam = linear_map_retrieval(feats, texts, args.split, split_words)
            tag = f" [{lang}]" if folder == "multi" else ""
            rows[f"{name} → ridge → bag of words (λ={lam:g}){tag}"] = result
    table = format_rows(rows, n, args.split)
    print(table)
    out = Path(args.runs)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"baselines_{args.split}" + ("" if folder == "en" else "_multi")
    (out / f"{stem}.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / f"{stem}.md").write_text(table + "\n")
    return rows


def format_rows(rows: dict[str, dict[str, float]], n: int, split: str) -> str:
    """A Markdown table of R@1/5/10 in both directions (percent)."""
    cols = [f"{d}_R@{k}" for d in ("i2t", "t2i") for k in KS]
    head = (
        "| "
        + f"{split} ({n} pictures)"
        + " | "
        + " | ".join(c.replace("_", " ") for c in cols)
        + " |"
    )
    lines = [head, "|---" * (len(cols) + 1) + "|"]
    for name, r in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{100 * r[c]:.1f}" for c in cols) + " |")
    return "\n".join(lines)


# -- pretrain, eval ------------------------------------------------------------------------


def data_overrides(data: Path, langs: str = "en") -> list[str]:
    """A recipe's toyworld paths pointed at the emoji shards (``en`` or ``multi``)."""
    folder, tok = ("en", "tokenizer") if langs == "en" else ("multi", "tokenizer_multi")
    return [f"data.{p}={data}/{folder}/{p}-*.tar" for p in ("train", "val", "test")] + [
        f"data.tokenizer={data}/{tok}.model"
    ]


def pretrain(args: argparse.Namespace) -> None:
    data, runs = Path(args.data), Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    for recipe in args.recipes.split(","):
        run = runs / f"{recipe}{args.tag}"
        over = [*data_overrides(data, args.langs), f"output_dir={run}", "resume=true",
                "train.progress=false"]  # fmt: skip
        if args.langs != "en":
            over.append(f"data.modalities.text.caption_languages=[{args.langs}]")
        if args.steps:
            over.append(f"train.max_steps={args.steps}")
        t0 = time.perf_counter()
        sh([*MMPTM, "pretrain", recipe, *over, *args.set], log=runs / f"{run.name}.log")
        print(f"{run.name}: {time.perf_counter() - t0:.0f}s → {run}")


def evaluate(args: argparse.Namespace) -> None:
    runs = Path(args.runs)
    names = (
        args.only.split(",")
        if args.only
        else sorted(p.name for p in runs.iterdir() if (p / "config.yaml").is_file())
    )
    rows = {}
    for name in names:
        for lang in args.langs.split(","):
            tag = "" if args.langs == "en" else f"_{lang}"
            out = runs / f"{name}_{args.split}{tag}.json"
            sh([*MMPTM, "eval", "retrieval", str(runs / name), "--split", args.split,
                "--language", lang, "--out", str(out)])  # fmt: skip
            rows[name + (f" [{lang}]" if tag else "")] = json.loads(out.read_text())
    table = format_rows(rows, int(next(iter(rows.values()))["n"]), args.split)
    print(table)
    (runs / f"results_{args.split}.md").write_text(table + "\n")


# -- the peer: open_clip at clip_tiny's shape ---------------------------------------------


def open_clip_model(cfg, vocab: int):
    """open_clip's ``CLIP`` at clip_tiny's widths: timm ``test_resnet`` + linear projection;
    a 2-layer, 4-head text Transformer (open_clip's causal mask and end-token pooling: the
    end token gets the highest id, ``vocab``)."""
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    enc = cfg.model.encoders
    width, backbone = cfg.model.width, enc["image"].backbone
    tr = cfg.model.fusion.transformer
    vision = CLIPVisionCfg(
        timm_model_name=backbone.model_name, timm_model_pretrained=False,
        timm_pool="avg", timm_proj="linear", image_size=backbone.image_size,
    )  # fmt: skip
    text = CLIPTextCfg(
        context_length=cfg.data.modalities["text"].max_len + 1, vocab_size=vocab + 1,
        width=width, heads=tr.heads, layers=tr.layers, mlp_ratio=tr.mlp_ratio, pool_type="argmax",
    )  # fmt: skip
    embed = cfg.model.objectives["contrastive"].embed_dim
    return CLIP(embed_dim=embed, vision_cfg=vision, text_cfg=text)


def clip_tokens(batch: dict, vocab: int, context: int) -> torch.Tensor:
    """mmptm's padded ids [B,L] as open_clip reads them: the end token ``vocab`` after the
    last real token, 0 after it up to ``context``."""
    ids_BL, mask_BL = batch["input_ids"], batch["attention_mask"].bool()
    b, n = ids_BL.shape
    out = torch.zeros(b, context, dtype=torch.long)
    out[:, :n] = ids_BL.masked_fill(~mask_BL, 0)
    out[torch.arange(b), mask_BL.sum(1)] = vocab
    return out


def peer(args: argparse.Namespace) -> None:
    from open_clip.loss import ClipLoss

    from mmptm.data.pipeline import Loader, single_pass, stream_config
    from mmptm.models.load import build_model
    from mmptm.recipe import load_run_config
    from mmptm.train.optim import build_optimizer

    data, runs = Path(args.data), Path(args.runs)
    recipe = args.recipes.split(",")[0]
    cfg = load_run_config(recipe, [*data_overrides(data), f"seed={args.seed}", *args.set])
    steps = args.steps or cfg.train.max_steps
    ours, tok = build_model(cfg)
    stream = stream_config(cfg.data, tok, needs=ours.data_needs(), seed=cfg.seed)
    torch.manual_seed(cfg.seed)
    model = open_clip_model(cfg, tok.vocab_size)
    n_ours = sum(p.numel() for p in ours.parameters())
    n_peer = sum(p.numel() for p in model.parameters())
    print(f"parameters: mmptm {recipe} {n_ours:,}, open_clip peer {n_peer:,}")
    # the recipes' optimiser and schedule (AdamW, decay on matrices only, warmup + cosine)
    tc = replace(cfg.train, max_steps=steps)
    opt, sched = build_optimizer(model, tc)
    loss_fn = ClipLoss()
    batches = iter(Loader(stream, 0))
    t0 = time.perf_counter()
    model.train()
    for step in range(steps):
        b = next(batches)
        img_f, txt_f, scale = model(
            b["pixels"], clip_tokens(b, tok.vocab_size, model.context_length)
        )
        loss = loss_fn(img_f, txt_f, scale)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.clip_grad_norm)
        opt.step()
        sched.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        if (step + 1) % 100 == 0:
            print(f"step {step + 1}: loss {loss.item():.4f} ({time.perf_counter() - t0:.0f}s)")
    model.eval()
    result = {}
    for split in ("val", args.split):
        ev = stream_config(cfg.data, tok, split=split, needs=ours.data_needs(), seed=cfg.seed)
        ev.batch_size = 1000
        b = next(iter(single_pass(ev)))
        with torch.no_grad():
            i = F.normalize(model.encode_image(b["pixels"]), dim=-1)
            t = F.normalize(
                model.encode_text(clip_tokens(b, tok.vocab_size, model.context_length)), dim=-1
            )
        result[split] = {"n": float(i.shape[0]), **recall_at_k(i @ t.T, KS)}
    took = time.perf_counter() - t0
    out = runs / f"open_clip_{recipe}{args.tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"steps": steps, "seconds": round(took), "params": n_peer,
                               **result}, indent=1) + "\n")  # fmt: skip
    print(json.dumps(result))


# -- main ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    torch.set_num_threads(1)  # the development machine's 2 cores are shared
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    cmds = {}
    for name, fn in (("prepare", prepare), ("baselines", baselines), ("pretrain", pretrain),
                     ("eval", evaluate), ("peer", peer)):  # fmt: skip
        q = sub.add_parser(name)
        q.add_argument("--data", default="data/real_vl")
        q.add_argument("--runs", default="runs/real_vl")
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--split", default="test", choices=["val", "test"])
        cmds[name] = fn
    q = sub.choices["prepare"]
    q.add_argument("--val-fraction", type=float, default=0.1)
    q.add_argument("--test-fraction", type=float, default=0.2)
    q.add_argument("--size", type=int, default=96, help="picture side in pixels")
    q.add_argument("--vocab", type=int, default=1000)
    q.add_argument("--vocab-multi", type=int, default=4000)
    q.add_argument("--skin-tones", action="store_true", help="add the skin-tone variants")
    for name in ("pretrain", "peer"):
        q = sub.choices[name]
        q.add_argument("--recipes", default=",".join(RECIPES))
        q.add_argument("--steps", type=int, default=0, help="train.max_steps (0: the recipe's)")
        q.add_argument("--tag", default="", help="suffix of the run folder")
        q.add_argument("--set", nargs="*", default=[], help="more key=value overrides")
    sub.choices["eval"].add_argument("--only", default="", help="comma list of run folders")
    for name in ("baselines", "pretrain", "eval"):
        sub.choices[name].add_argument(
            "--langs", default="en", help="en (the en shards) or a comma list (the multi shards)"
        )
    args = p.parse_args(argv)
    cmds[args.command](args)


if __name__ == "__main__":
    main()
