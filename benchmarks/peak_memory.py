"""Peak memory of training per pre-training recipe, on CPU or one GPU.

Each recipe's model (at the recipe's published vocabulary size) trains as the trainer trains
it (the same optimiser, gradient clipping, ``train.freeze``, activation checkpointing when
asked; bf16 autocast on CUDA) on batches its own data pipeline reads from toyworld, drawn
before the steps begin:

- CPU: one child process per recipe and batch (one thread). The process's peak resident size
  over ``--steps`` steps (``VmHWM``, reset after the model is built and the batches read),
  then the peak of live tensor bytes over one more step, from the profiler's memory timeline
  (what the tensors need at once, whatever the allocator keeps: the number that grows
  linearly with the batch). Base recipes at their default batch (256 for most) fit neither
  the 2-core development machine's time nor its memory: they run at two small batches
  (``--fit-batches``) and each value of the step's live-memory curve is extrapolated to the
  default batch (:func:`extrapolate`; ``--check`` measures a recipe both ways).
- CUDA (``--device cuda``): every recipe in this process at its default batch,
  ``torch.cuda.max_memory_allocated`` over the steps.

Base recipes read toyworld through small adapters, so that the model keeps its published
shapes: region and clip features are padded with zeros to the encoder's ``feature_dim``
(2048-d bottom-up regions, 36 of them; 1024-d S3D features), VideoBERT's 20736 visual words
and HuBERT's 100 MFCC units are random codebooks of toyworld's widths, the audio recipes read
toyworld's scene sounds repeated to 16 s (clap, wav2vec 2.0, HuBERT) or spoken captions
(SpeechBERT). Caption lengths are toyworld's: the table states the shapes.

    .venv/bin/python benchmarks/peak_memory.py --make-world /tmp/pm-world
    .venv/bin/python benchmarks/peak_memory.py --world /tmp/pm-world --recipes tiny,base \\
        --checkpointing mbert_tiny,clip_base --json /tmp/peak_memory.json
    python3 benchmarks/peak_memory.py --world /tmp/pm-world --recipes base --device cuda
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Any, ClassVar

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmptm.recipe import list_recipes, load_run_config, recipe_kind

#: toyworld's clip-feature width (``video_features`` view); base recipes' encoders read wider
TOY_FEATURE_DIM = 256
#: seconds of the base audio recipes' clips (their max_seconds: 10 to 15.6)
LONG_SECONDS = 16.0
#: base recipes measured at smaller batches than ``--fit-batches``: ViT-B/16 on 8 frames a
#: clip (a step at batch 2 takes half a minute on one core), 16 s of audio (GBs a sample)
FIT_BATCHES = {"video_clip_base": "1,2"} | dict.fromkeys(
    ("clap_base", "wav2vec2_base", "hubert_base", "speechbert_base"), "2,4"
)
#: regions per image of the base recipes' data (bottom-up-attention's 36; toyworld draws few)
BASE_REGIONS = 36
#: VideoBERT's visual words (12^4) and HuBERT BASE's first-iteration MFCC units
BASE_CODEBOOKS = {
    "videobert_base": ("video_units_20736.npy", 20736),
    "hubert_base": ("mfcc_units_100.npy", 100),
}
#: base recipes whose data is not toyworld's layout: the toyworld view that stands in
AUDIO_VIEWS = {
    "clap_base": "audio_long",
    "wav2vec2_base": "audio_long",
    "hubert_base": "audio_long",
    "speechbert_base": "speech_en/speech",
    "speechbert_tiny": "speech_en/speech",
}
SHAPE_KEYS = (
    "input_ids",
    "audio",
    "pixels",
    "region_feats",
    "features",
    "unit_ids",
    "frames",
    "waveform",
    "audio_waveform",
    "entity_ids",
)


def recipe_names(spec: str) -> list[str]:
    """The pre-training recipes ``spec`` names: a comma list of names, tiny, base or all."""
    pretrain = [n for n in list_recipes() if recipe_kind(n) == "pretrain"]
    out: list[str] = []
    for item in filter(None, spec.split(",")):
        if item in ("tiny", "base", "all"):
            out += [n for n in pretrain if item == "all" or n.endswith(f"_{item}")]
        elif item in pretrain:
            out.append(item)
        else:
            raise SystemExit(f"--recipes: no pre-training recipe {item!r}")
    return list(dict.fromkeys(out))


def make_world(out: Path) -> Path:
    """toyworld with every view (spoken captions in English only, in ``speech_en/``), its
    tokenizer, codebooks, entity vectors and triples, and the base recipes' codebooks.

    Without PyAV no mp4 views, without soundfile no sound views (the GPU machine has
    neither): the recipes that read them then fail alone, with a missing-shards error.
    """
    import importlib.util

    import numpy as np

    from mmptm import toyworld
    from mmptm.converters.answers import build_answer_vocab, shard_answers, write_answer_vocab
    from mmptm.converters.candidates import write_candidate_shards
    from mmptm.converters.triples import write_triple_shards
    from mmptm.studies.knowledge import candidate_generator
    from mmptm.tokenizers.sentencepiece import train_tokenizer
    from mmptm.train.kge import KGETrainConfig, train_embeddings
    from mmptm.train.units import fit_audio_codebook, fit_codebook

    def have(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except ImportError:
            return False

    mp4, sound = have("av"), have("soundfile")
    absent = {"speech"} | (set() if mp4 else {"video", "video_qa"})
    absent |= set() if sound else {"audio"}
    common = dict(n_train=96, n_val=16, n_test=16, seed=0, image_size=32, shard_size=16)
    views = [v for v in toyworld.ALL_VIEWS if v not in absent]
    toyworld.generate(out, languages=("en", "de", "fr", "ru", "es"), views=views, **common)
    train_tokenizer(
        sorted((out / "image_text").glob("train-*.tar")),
        out / "tokenizer",
        vocab_size=1000,
        model_type="bpe",
        seed=0,
        num_threads=1,
    )
    fit_codebook(f"{out}/video_features/train-*.tar", out / "video_features/codebook.npy", k=16)
    answers = build_answer_vocab(shard_answers([f"{out}/vqa/train-*.tar"]), min_count=1)
    write_answer_vocab(answers, out / "vqa/answers.txt")  # recipes with a VQA objective
    graph = out / "knowledge" / "graph"
    train_embeddings(
        graph, out / "knowledge/transe", KGETrainConfig(epochs=2, dim=100), progress=False
    )
    write_triple_shards(graph, graph / "descriptions.txt", out / "knowledge/triples")
    # KnowBERT's candidate spans, written as the knowledge study writes them
    write_candidate_shards(f"{out}/knowledge/text/*.tar", out / "knowledge/candidates",
                           candidate_generator(out, seed=0), progress=False)  # fmt: skip
    rng = np.random.default_rng(0)
    words = np.load(out / "video_features/codebook.npy").shape[1]
    name, k = BASE_CODEBOOKS["videobert_base"]
    np.save(out / name, rng.standard_normal((k, words), dtype=np.float32))
    if sound:
        toyworld.generate(out / "speech_en", languages=("en",), views=["speech"], **common)
        fit_audio_codebook(f"{out}/audio/train-*.tar", out / "audio/mfcc_codebook.npy", k=8)
        for split in ("train", "val", "test"):
            long_sounds(out / "audio", out / "audio_long", split, LONG_SECONDS)
        mfcc = np.load(out / "audio/mfcc_codebook.npy").shape[1]
        name, k = BASE_CODEBOOKS["hubert_base"]
        np.save(out / name, rng.standard_normal((k, mfcc), dtype=np.float32))
    (out / "READY").write_text("ok")
    return out


def long_sounds(src: Path, dst: Path, split: str, seconds: float) -> None:
    """toyworld's 1 s scene sounds repeated to ``seconds``, the clip lengths the base audio
    recipes read (``max_seconds`` crops them); every other member as it is."""
    import io
    import tarfile

    import numpy as np
    import soundfile as sf

    dst.mkdir(parents=True, exist_ok=True)
    for shard in sorted(src.glob(f"{split}-*.tar")):
        with tarfile.open(shard) as tin, tarfile.open(dst / shard.name, "w") as tout:
            for member in tin.getmembers():
                data = tin.extractfile(member).read()  # type: ignore[union-attr]
                if member.name.endswith(".flac"):
                    x, rate = sf.read(io.BytesIO(data), dtype="float32")
                    buf = io.BytesIO()
                    sf.write(buf, np.tile(x, -(-int(seconds * rate) // len(x))), rate, "PCM_16",
                             format="FLAC")  # fmt: skip
                    data = buf.getvalue()
                info = tarfile.TarInfo(member.name)
                info.size = len(data)
                tout.addfile(info, io.BytesIO(data))


def overrides(recipe: str, world: Path, batch: int, checkpointing: bool) -> list[str]:
    """A recipe's overrides that read ``world`` (module docstring: the adapters)."""
    from mmptm.studies import relocated

    over = [
        *relocated(recipe, world),
        f"data.tokenizer={world}/tokenizer.model",
        "data.num_workers=0",
        "train.progress=false",
    ]
    view = AUDIO_VIEWS.get(recipe)
    if view:
        over += [f"data.{s}={world}/{view}/{s}-*.tar" for s in ("train", "val", "test")]
    if recipe in BASE_CODEBOOKS:
        key = "encoders.units" if recipe == "videobert_base" else "objectives.hubert"
        over.append(f"model.{key}.codebook={world}/{BASE_CODEBOOKS[recipe][0]}")
    if recipe == "ernie_base":  # toyworld's entities (the recipe leaves the vectors unset)
        over.append(f"model.fusion.entities.embeddings={world}/knowledge/transe")
    if recipe == "knowbert_base":  # its candidate spans name toyworld's entities: their
        # 100-d TransE table, projected to the recipe's entity width 300 (a 100 x 300 map)
        over += [f"model.fusion.entities.embeddings={world}/knowledge/transe",
                 "model.fusion.entities.projection=true"]  # fmt: skip
    if batch:
        over.append(f"data.batch_size={batch}")
    if checkpointing:
        over.append("train.activation_checkpointing=true")
    return over


@dataclass
class Widen:
    """Pads toyworld's narrow features with zeros to the width an encoder reads, and its few
    regions per image with masked-out ones to ``regions`` (the tensor sizes of real detector
    features); runs before every other data side."""

    widths: dict[str, int]
    #: region-view key prefixes ("" for the ``regions`` view) and the regions per image wanted
    regions: dict[str, int]
    data_priority: ClassVar[int] = -1

    def __call__(self, batch: dict, g: torch.Generator) -> dict:
        for key, width in self.widths.items():
            x = batch.get(key)
            if isinstance(x, torch.Tensor) and x.shape[-1] < width:
                batch[key] = torch.nn.functional.pad(x, (0, width - x.shape[-1]))
        for p, want in self.regions.items():
            R = batch[f"{p}region_feats"].shape[1]
            for key, x in list(batch.items()):
                if not (key.startswith(f"{p}region_") and isinstance(x, torch.Tensor)):
                    continue
                if R < want and x.ndim >= 2 and x.shape[1] == R:
                    pad = x.new_zeros((x.shape[0], want - R, *x.shape[2:]))
                    batch[key] = torch.cat([x, pad], 1)
        return batch


def rss_mb() -> tuple[float, float]:
    """(resident, peak resident) MB of this process, from /proc/self/status."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def reset_peak_rss() -> None:
    """Start the peak resident size (VmHWM) afresh (Linux: clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def read_batches(cfg, steps: int, base: bool):
    """The model (published vocabulary) and ``steps`` batches its pipeline reads."""
    from mmptm.data.pipeline import Loader, stream_config
    from mmptm.encoders.base import VocabInfo
    from mmptm.modalities.base import Need
    from mmptm.models.load import NO_TEXT
    from mmptm.models.pretrain import PretrainModel, data_transforms
    from mmptm.tokenizers.sentencepiece import load_tokenizer
    from mmptm.train.optim import freeze

    tok = load_tokenizer(cfg.data.tokenizer) if cfg.data.tokenizer else None
    vocab = VocabInfo.from_tokenizer(tok) if tok else NO_TEXT
    if tok is not None:
        vocab = replace(vocab, vocab_size=max(vocab.vocab_size, cfg.info.vocab_size))
    torch.manual_seed(cfg.seed)
    model = PretrainModel(cfg.model, vocab)
    freeze(model, cfg.train.freeze)
    wide = {
        e.input_key: e.feature_dim
        for e in model.encoders.values()
        if e.modality in ("regions", "features")
        and isinstance(getattr(e, "feature_dim", None), int)
    }
    # detector class distributions over the objectives' classes (toyworld's detector has few)
    classes = [getattr(o, "num_classes", 0) for o in cfg.model.objectives.values()]
    for e in model.encoders.values():
        if e.modality == "regions" and max(classes, default=0) > 0:
            wide[f"{e.prefix}region_probs"] = max(classes)
    needs = {
        view: Need(n.modality, {**n.facts, "dim": TOY_FEATURE_DIM}) if "dim" in n.facts else n
        for view, n in model.data_needs().items()
    }
    if cfg.data.train:
        cfg = replace(cfg, data=replace(cfg.data, resampled=True))  # batches > toyworld's shards
    regions = {e.prefix: BASE_REGIONS for e in model.encoders.values() if e.modality == "regions"}
    widen = Widen(wide, regions if base else {})
    stream = stream_config(
        cfg.data,
        tok,
        needs=needs,
        seed=cfg.seed,
        transforms=[widen, *data_transforms(cfg.model, vocab)],
    )
    return model, list(islice(Loader(stream, 0), steps))


def live_tensors_mb(fn: Callable[[], None]) -> list[float]:
    """MB of live tensor storage after each allocation and free while ``fn`` runs, from the
    profiler's memory timeline (the first value: what was alive before and is used): what the
    tensors need at once, whatever the allocator keeps."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action

    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        fn()
    start, curve = 0, []
    for _, action, _, size in prof._memory_profile().timeline:
        if action == Action.PREEXISTING:  # weights, gradients, AdamW's moments, the batch
            start += size
        elif action in (Action.CREATE, Action.DESTROY):
            change = size if action == Action.CREATE else -size
            curve.append((curve[-1] if curve else start) + change)
    return [round(x / 2**20, 3) for x in [start, *curve]]


def measure(
    recipe: str,
    world: Path,
    *,
    batch: int = 0,
    steps: int = 2,
    device: str = "cpu",
    checkpointing: bool = False,
) -> dict[str, Any]:
    """Peak memory of training ``recipe`` at ``batch`` (0: its default).

    CUDA: ``max_memory_allocated`` over ``steps`` steps. CPU: the peak resident size over
    ``steps`` steps, then the peak of live tensor bytes over one more (the steady state: the
    first step creates AdamW's moments), which grows linearly with the batch as the resident
    size does not (the allocator reuses resident pages unevenly).
    """
    from mmptm.batch import move_to
    from mmptm.train import parallel
    from mmptm.train.optim import build_optimizer

    t0 = time.perf_counter()
    cfg = load_run_config(recipe, overrides(recipe, Path(world), batch, checkpointing))
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    model, batches = read_batches(cfg, steps + (not cuda), recipe.endswith("_base"))
    batches = [move_to(b, dev) for b in batches]
    model.to(dev).train()
    if cfg.train.activation_checkpointing:
        parallel.checkpoint_blocks(model, cfg.train.block_modules)
    opt, _ = build_optimizer(model, cfg.train, fused=cuda)
    params = [p for p in model.parameters() if p.requires_grad]
    losses = []

    def train(b: dict) -> None:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            loss = model(b).loss
        loss.backward()
        if cfg.train.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(params, cfg.train.clip_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))

    gc.collect()
    row: dict[str, Any] = {}
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        row["start_mb"] = torch.cuda.memory_allocated(dev) / 2**20
        for b in batches:
            train(b)
        torch.cuda.synchronize(dev)
        row["peak_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
    else:
        # freed heap pages (model init, reading the batches) back to the system, so that the
        # steps' allocations show as new resident pages rather than reuse of resident ones
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        row["rss_before_mb"] = rss_mb()[0]
        reset_peak_rss()
        for b in batches[:-1]:
            train(b)
        row["rss_peak_mb"] = rss_mb()[1]
        row["live_mb"] = live_tensors_mb(lambda: train(batches[-1]))
        row["start_mb"], row["peak_mb"] = row["live_mb"][0], max(row["live_mb"])
    first = batches[0]
    return {
        "recipe": recipe,
        "batch": cfg.data.batch_size,
        "device": str(dev),
        "checkpointing": cfg.train.activation_checkpointing,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "trainable_m": sum(p.numel() for p in params) / 1e6,
        **row,
        "peak_gib": row["peak_mb"] / 1024,
        "losses": losses,
        "shapes": {
            k: list(first[k].shape) for k in SHAPE_KEYS if isinstance(first.get(k), torch.Tensor)
        },
        "default_batch": load_run_config(recipe).data.batch_size,
        "seconds": time.perf_counter() - t0,
    }


def in_child(recipe: str, world: Path, batch: int, steps: int, ckpt: bool, timeout: float) -> dict:
    """:func:`measure` in a fresh process with one thread: its own peak resident size."""
    job = json.dumps(
        {
            "recipe": recipe,
            "world": str(world),
            "batch": batch,
            "steps": steps,
            "checkpointing": ckpt,
        }
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--child", job],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"recipe": recipe, "batch": batch, "error": f"over {timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"recipe": recipe, "batch": batch, "error": tail[:300]}
    return json.loads(lines[-1])


def extrapolate(rows: list[dict], to_batch: int) -> dict[str, Any]:
    """The tensor peak at ``to_batch`` from the first and last of ``rows`` (smaller batches).

    A step's peak is the largest of its live-memory values, each of which grows linearly
    with the batch at its own rate: activations at the end of the forward pass, gradients at
    the end of the backward pass, the update's temporaries not at all. So each value of the
    live-memory curve is extrapolated, and the largest taken: a line through the two peaks
    would follow whichever dominates at small batches. When the two steps ran different
    operations (packed rows, another source of a mixture) the curves do not line up and the
    line through the peaks is all there is.
    """
    (b1, c1), (b2, c2) = ((r["batch"], r["live_mb"]) for r in (rows[0], rows[-1]))
    f = (to_batch - b1) / (b2 - b1)
    if len(c1) == len(c2):
        at = [x + (y - x) * f for x, y in zip(c1, c2)]
        i = max(range(len(at)), key=at.__getitem__)
        return {"peak_mb": at[i], "mb_per_sample": (c2[i] - c1[i]) / (b2 - b1),
                "batch": to_batch, "method": "curves"}  # fmt: skip
    p1, p2 = max(c1), max(c2)
    return {"peak_mb": p1 + (p2 - p1) * f, "mb_per_sample": (p2 - p1) / (b2 - b1),
            "batch": to_batch, "method": "peaks"}  # fmt: skip


def brief(row: dict) -> dict:
    """A measurement without its live-memory curve (thousands of values), for the JSON."""
    return {k: v for k, v in row.items() if k != "live_mb"}


def cpu_rows(args: argparse.Namespace) -> list[dict]:
    """One row per recipe (and per checkpointing setting asked for), measured in children."""
    ckpt = set(recipe_names(args.checkpointing)) if args.checkpointing else set()
    check = set(recipe_names(args.check)) if args.check else set()
    rows = []
    for recipe in recipe_names(args.recipes):
        for cp in (False, True) if recipe in ckpt else (False,):
            base = recipe.endswith("_base")
            row: dict[str, Any] = {"recipe": recipe, "checkpointing": cp}
            if not base or recipe in check:
                row["measured"] = in_child(recipe, args.world, 0, args.steps, cp, args.timeout)
            if base or recipe in check:
                fit = [int(b) for b in FIT_BATCHES.get(recipe, args.fit_batches).split(",")]
                points = [
                    in_child(recipe, args.world, b, args.steps, cp, args.timeout) for b in fit
                ]
                row["points"] = points
                bad = [p["error"] for p in points if "error" in p]
                default = load_run_config(recipe).data.batch_size
                row["extrapolated"] = {"error": bad[0]} if bad else extrapolate(points, default)
            row["measured"] = brief(row.get("measured", {}))
            row["points"] = [brief(p) for p in row.get("points", [])]
            rows.append(row)
            print(line(row), flush=True)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
    return rows


HEADER = (
    "| recipe | parameters (M) | default batch | tensor peak at the default batch (GiB) "
    "| per sample (MB) | measured: batch: tensor peak / process peak RSS (MB) "
    "| first batch's shapes |\n|---|---|---|---|---|---|---|"
)


def line(row: dict) -> str:
    """The row as a line of :data:`HEADER`'s table: measured at the default batch (tiny
    recipes, the GPU) or extrapolated to it (``≈``, base recipes on CPU)."""
    m, x = row.get("measured", {}), row.get("extrapolated", {})
    done = [p for p in [m, *row.get("points", [])] if "peak_mb" in p]
    errors = [p["error"] for p in [m, x, *row.get("points", [])] if "error" in p]
    src = done[0] if done else {}
    shapes = ", ".join(f"{k} {'×'.join(map(str, v[1:]))}" for k, v in src.get("shapes", {}).items())
    if "peak_mb" in m:
        at_default = f"{m['peak_mb'] / 1024:.2f}"
        if "peak_mb" in x:  # both: the extrapolation's error
            at_default += f" (extrapolated: {x['peak_mb'] / 1024:.2f})"
    elif "peak_mb" in x:
        at_default = f"≈ {x['peak_mb'] / 1024:.1f}" + ("" if x["method"] == "curves" else " ¹")
    else:
        at_default = (errors or ["–"])[0][:100]
    rss = {p["batch"]: f" / {p['rss_peak_mb']:.0f}" if "rss_peak_mb" in p else "" for p in done}
    cells = [
        row["recipe"] + (" + activation checkpointing" if row["checkpointing"] else ""),
        f"{src['params_m']:.1f}" if src else "–",
        str(src.get("default_batch", "–")),
        at_default,
        f"{x['mb_per_sample']:.1f}" if "mb_per_sample" in x else "–",
        ", ".join(f"{p['batch']}: {p['peak_mb']:.0f}{rss[p['batch']]}" for p in done) or "–",
        shapes,
    ]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=Path, help="from --make-world")
    p.add_argument("--make-world", type=Path, help="write the toyworld the recipes read, then exit")
    p.add_argument("--recipes", default="tiny,base", help="names, or tiny / base / all")
    p.add_argument(
        "--steps",
        type=int,
        default=2,
        help="steps of the resident-size peak (the second reaches it: AdamW's moments exist "
        "from the first); the CPU's tensor peak is one step more",
    )
    p.add_argument("--fit-batches", default="4,8", help="CPU: base recipes' measured batches")
    p.add_argument(
        "--checkpointing",
        default="",
        help="recipes measured again with train.activation_checkpointing=true",
    )
    p.add_argument(
        "--check",
        default="",
        help="recipes measured at their default batch and "
        "extrapolated too (the extrapolation's error)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--timeout", type=float, default=300, help="seconds per child process")
    p.add_argument("--json", type=Path)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.make_world:
        make_world(args.make_world)
        return
    if args.child:
        job = json.loads(args.child)
        torch.set_num_threads(1)
        print(json.dumps(measure(job.pop("recipe"), Path(job.pop("world")), **job)))
        return
    if not args.world or not (args.world / "READY").is_file():
        raise SystemExit("--world: a folder written by --make-world")
    print(f"torch {torch.__version__}, {args.steps} steps per measurement, device {args.device}")
    print(HEADER)
    if args.device == "cpu":
        cpu_rows(args)
        return
    rows = []
    for recipe in recipe_names(args.recipes):
        try:
            row = measure(recipe, args.world, steps=args.steps, device=args.device)
        except Exception as e:
            row = {"recipe": recipe, "error": f"{type(e).__name__}: {e}"[:300]}
        gc.collect()
        torch.cuda.empty_cache()
        rows.append(row)
        print(line({"recipe": recipe, "checkpointing": False, "measured": row}), flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
