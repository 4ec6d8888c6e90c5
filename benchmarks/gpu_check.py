"""One prepared check of mmptm on one GPU, to run the moment a GPU is lent (8 minutes at most).

Parts, in this order, each in its own try/except and under its own time limit, so that a part
that fails or runs out of time leaves the others' results; the JSON and the Markdown table are
rewritten after every part (and within a part after every model), so a run stopped from outside
still leaves what it measured:

- ``env``: torch, CUDA, the device and its published bf16 dense peak (``mmptm.train.flops``),
  the versions of the packages the other parts import;
- ``precision``: a base single-stream recipe trained 20 steps in fp32 and in bf16 autocast
  from the same weights on the same batches (dropout off): the losses must agree within
  ``--tolerance`` (relative) at every step;
- ``throughput``: steps/s, samples/s, FLOPs per step (counted by the trainer's counter) and MFU
  of a trainer-like step (bf16 autocast on CUDA, fused AdamW, gradient clipping) for a base
  single-stream recipe, a base two-stream recipe, and CLIP ViT-B/32 built from open_clip's own
  config beside open_clip's own training step (``ClipLoss``, AdamW) at equal shapes, blocks
  alternating (``harness.time_interleaved``);
- ``compile``: the single-stream recipe 20 steps eager and 20 steps under ``torch.compile``
  from the same weights (dropout off): losses within tolerance, compile time, steps/s of both,
  dynamo's graph and graph-break counts;
- ``fsdp``: a world-size-1 process group (NCCL; gloo on CPU) and the trainer's FSDP2 sharding
  (``mmptm.train.parallel.shard``) of the single-stream recipe against the same model unsharded;
- ``loader``: a ``Trainer`` over toyworld shards that this script writes in the background
  while the first parts run, fed by the real loader with many workers, against the same batches
  replayed from memory; the loader's waiting time and worker CPU per step; one batch's
  host-to-device copy from pageable and from pinned memory;
- ``memory``: what time is left goes to peak GPU memory (``max_memory_allocated``) of the base
  recipes at their default batch, through ``peak_memory.py``.

    python3 benchmarks/gpu_check.py --out "$OUT"        # on the GPU machine, with the wheels
    .venv/bin/python benchmarks/gpu_check.py --smoke --out /tmp/gpu_check   # CPU, toy sizes

benchmarks/README.md has the exact device command (the wheels it carries and why).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_report import OutOfTime, Report, markdown
from harness import time_interleaved

from mmptm.encoders.base import VocabInfo
from mmptm.models.pretrain import PretrainModel
from mmptm.recipe import load_run_config
from mmptm.train import flops
from mmptm.train.optim import build_optimizer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: the packages whose versions the report states (module → distribution); the GPU machine
#: lacks the last four and ftfy's wcwidth (carried as wheels, benchmarks/README.md), which the
#: loader and the open_clip comparison import; the other parts need only torch and timm
PACKAGES = {
    **{m: m for m in ("timm", "numpy", "sentencepiece", "transformers", "webdataset")},
    **{"braceexpand": "braceexpand", "open_clip": "open_clip_torch", "ftfy": "ftfy"},
}
#: open_clip's ViT-B-32 (model_configs/ViT-B-32.json), so that mmptm's side needs no open_clip
VIT_B_32 = {
    "embed_dim": 512,
    "vision_cfg": {"image_size": 224, "layers": 12, "width": 768, "patch_size": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 512, "heads": 8, "layers": 12},
}
#: the same layout at toy size (``--smoke``)
CLIP_TINY = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 16},
    "text_cfg": {"context_length": 16, "vocab_size": 1000, "width": 32, "heads": 2, "layers": 2},
}
SECTIONS = ("env", "precision", "throughput", "compile", "fsdp", "loader", "memory")
Batch = dict[str, Any]


@dataclass
class Plan:
    """Recipes, shapes, step counts and time limits of one run."""

    single: str = "visualbert_base"
    two: str = "lxmert_base"
    clip: str = "ViT-B-32"
    #: text tokens and regions of the vision-language batches (36 bottom-up regions)
    text_len: int = 40
    regions: int = 36
    #: batch of the throughput part; 0 = each recipe's default
    batch: int = 0
    clip_batch: int = 256
    #: batch and steps of the precision, compile and FSDP parts
    check_batch: int = 64
    check_steps: int = 20
    warmup: int = 3
    rounds: int = 3
    steps: int = 10
    compile_backend: str = "inductor"
    loader_recipe: str = "clip_base"
    loader_workers: int = 12
    loader_scenes: int = 4096
    loader_image_size: int = 224
    loader_steps: int = 20
    loader_rounds: int = 3
    #: recipes of the memory part, measured while time is left
    memory_recipes: str = "base"
    memory_steps: int = 2
    #: seconds for the whole run, and the most one part may take
    budget_s: float = 450.0
    limits: tuple[tuple[str, float], ...] = (
        ("env", 30),
        ("precision", 60),
        ("throughput", 150),
        ("compile", 150),
        ("fsdp", 60),
        ("loader", 120),
        ("memory", 150),
    )


SMOKE = Plan(
    single="visualbert_tiny",
    two="lxmert_tiny",
    clip="tiny",
    text_len=12,
    regions=6,
    batch=4,
    clip_batch=4,
    check_batch=4,
    check_steps=6,
    warmup=1,
    rounds=2,
    steps=2,
    compile_backend="eager",
    loader_recipe="clip_tiny",
    loader_workers=1,
    loader_scenes=48,
    loader_image_size=32,
    loader_steps=2,
    loader_rounds=1,
    memory_recipes="clip_tiny",
    memory_steps=2,
    budget_s=240.0,
)


# -- building blocks --------------------------------------------------------------------------


class Device:
    """The device, its synchronisation, autocast (the trainer's rule: bf16 on CUDA) and its
    peak-memory counter."""

    def __init__(self, name: str) -> None:
        self.dev = torch.device(name)
        self.cuda = self.dev.type == "cuda"
        self.peak = flops.peak_flops(self.dev)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.dev)

    def autocast(self, bf16: bool | None = None) -> contextlib.AbstractContextManager:
        if self.cuda if bf16 is None else bf16:
            return torch.autocast(self.dev.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.dev)

    def peak_gib(self) -> float | None:
        return torch.cuda.max_memory_allocated(self.dev) / 2**30 if self.cuda else None

    def free(self) -> None:
        import gc

        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()


def no_dropout(model: nn.Module) -> nn.Module:
    """Dropout off everywhere (nn.Dropout, SDPA's dropout_p), so that runs compare step by step."""
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        for attr in ("dropout", "dropout_p", "attn_dropout"):
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, 0.0)
    return model


def recipe_model(name: str, dev: Device, seed: int = 0) -> tuple[Any, VocabInfo, PretrainModel]:
    """A recipe's model at its published vocabulary size, freshly initialised on ``dev``."""
    cfg = load_run_config(name)
    vocab = VocabInfo(vocab_size=cfg.info.vocab_size or 1000, special_ids=frozenset(range(5)))
    torch.manual_seed(seed)
    return cfg, vocab, PretrainModel(cfg.model, vocab).to(dev.dev).train()


def vl_batches(cfg, vocab: VocabInfo, plan: Plan, batch: int, dev: Device, n: int = 4) -> list:
    """Text + region batches through the recipe's own data sides (bench_vl's generator)."""
    from bench_vl import batches

    regions = cfg.model.encoders["regions"]
    classes = [o.num_classes for o in cfg.model.objectives.values() if hasattr(o, "num_classes")]
    shapes = SimpleNamespace(
        batch=batch,
        seq=plan.text_len,
        regions=plan.regions,
        feat=regions.feature_dim,
        vocab=vocab.vocab_size,
        classes=(classes or [1600])[0],
    )
    return [to_device(b, dev) for b in batches(shapes, cfg.model, vocab, n)]


def to_device(batch: Batch, dev: Device) -> Batch:
    return {k: v.to(dev.dev) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def step_fn(
    forward: Callable[[Batch], torch.Tensor],
    model: nn.Module,
    opt: torch.optim.Optimizer,
    dev: Device,
    *,
    bf16: bool | None = None,
    clip_norm: float = 0.0,
    after_backward: Callable[[], None] = lambda: None,
) -> Callable[[Batch], torch.Tensor]:
    """A trainer-like optimiser step returning the detached loss."""
    params = [p for p in model.parameters() if p.requires_grad]

    def step(batch: Batch) -> torch.Tensor:
        with dev.autocast(bf16):
            loss = forward(batch)
        loss.backward()
        after_backward()
        if clip_norm:
            torch.nn.utils.clip_grad_norm_(params, clip_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def count_flops(
    forward: Callable[[Batch], torch.Tensor], model: nn.Module, batch: Batch, dev: Device
) -> int:
    """Model FLOPs of one forward and backward, counted as the trainer counts them."""
    count = flops.FlopCount()
    with dev.autocast(), count.forward():
        loss = forward(batch)
    with count.backward():
        loss.backward()
    model.zero_grad(set_to_none=True)
    return count.flops


def run_losses(step: Callable[[Batch], torch.Tensor], batches: list, n: int, dev: Device):
    """Losses of ``n`` steps cycling through ``batches``, and steps/s of the second half."""
    losses, half = [], n // 2
    t0 = time.perf_counter()
    for i in range(n):
        if i == half:
            dev.sync()
            t0 = time.perf_counter()
        losses.append(step(batches[i % len(batches)]))
    dev.sync()
    rate = (n - half) / (time.perf_counter() - t0)
    return [float(x) for x in losses], rate


def compare(a: list[float], b: list[float], tol: float, cycle: int = 4) -> dict[str, Any]:
    """Step-by-step relative differences of two loss curves, whether they agree, and whether
    the first learned (a later loss on the first batch, which comes back every ``cycle``
    steps, below the first)."""
    rel = [abs(x - y) / max(abs(x), 1e-6) for x, y in zip(a, b)]
    finite = all(math.isfinite(x) for x in a + b)
    again = (len(a) - 1) // cycle * cycle
    return {
        "max_rel_diff": max(rel) if finite else None,
        "tolerance": tol,
        "ok": finite and max(rel) <= tol,
        "learned": finite and again > 0 and a[again] < a[0],
    }


def constant_lr(cfg, lr: float = 1e-4):
    """The recipe's optimiser settings at a constant ``lr`` (no warmup), so 20 steps move."""
    return replace(cfg.train, lr=lr, warmup_steps=0, schedule="constant")


# -- the parts --------------------------------------------------------------------------------


def part_env(rec: dict, dev: Device) -> None:
    rec.update(
        torch=torch.__version__,
        cuda=torch.version.cuda,
        python=platform.python_version(),
        device=str(dev.dev),
        cpus=os.cpu_count(),
        peak_tflops=dev.peak / 1e12 if dev.peak else None,
        tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
    )
    if dev.cuda:
        p = torch.cuda.get_device_properties(dev.dev)
        rec.update(
            device_name=p.name,
            capability=f"{p.major}.{p.minor}",
            multiprocessors=p.multi_processor_count,
            memory_gib=round(p.total_memory / 2**30, 1),
        )
    else:
        rec["device_name"] = f"CPU ({platform.processor() or platform.machine()})"
    rec["versions"] = versions = {}
    for module, dist in PACKAGES.items():
        try:  # without importing them (transformers takes seconds)
            versions[module] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[module] = None
    rec["missing"] = missing = [m for m, v in versions.items() if v is None]
    try:
        rec["commit"] = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rec["commit"] = None
    if missing:
        print(
            f"missing packages: {missing} (the loader and open_clip parts need them; "
            "benchmarks/README.md says how to carry them)",
            flush=True,
        )


def part_precision(rec: dict, plan: Plan, dev: Device, tol: float) -> None:
    """fp32 against bf16 autocast, the same weights and batches, dropout off."""
    cfg, vocab, model = recipe_model(plan.single, dev)
    no_dropout(model)
    init = copy.deepcopy(model.state_dict())
    batches = vl_batches(cfg, vocab, plan, plan.check_batch, dev)
    curves = {}
    for name, bf16 in (("fp32", False), ("bf16", True)):
        model.load_state_dict(init)
        opt, _ = build_optimizer(model, constant_lr(cfg), fused=dev.cuda)
        step = step_fn(lambda b: model(b).loss, model, opt, dev, bf16=bf16, clip_norm=1.0)
        curves[name], rec[f"{name}_steps_per_s"] = run_losses(step, batches, plan.check_steps, dev)
        rec.update(recipe=plan.single, batch=plan.check_batch, steps=plan.check_steps)
        rec[f"{name}_losses"] = curves[name]
    rec.update(compare(curves["fp32"], curves["bf16"], tol))


def throughput_row(
    label: str,
    step: Callable,
    forward: Callable,
    model: nn.Module,
    batches: list,
    batch: int,
    plan: Plan,
    dev: Device,
    rates: list[float] | None = None,
) -> dict[str, Any]:
    """Steps/s, FLOPs and MFU of one model's step (``rates``: samples/s per round, if timed
    already)."""
    n = count_flops(forward, model, batches[0], dev)
    if rates is None:
        dev.reset_peak()
        rates = time_interleaved(
            {label: step},
            batches,
            batch_size=batch,
            rounds=plan.rounds,
            steps_per_round=plan.steps,
            warmup=plan.warmup,
            sync=dev.sync,
        )[label]
    samples = statistics.median(rates)
    steps = samples / batch
    return {
        "model": label,
        "batch": batch,
        "steps_per_s": steps,
        "samples_per_s": samples,
        "rounds": rates,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "tflop_per_step": n / 1e12,
        "tflops": n * steps / 1e12,
        "mfu": flops.mfu(n, steps, dev.peak, 1) if dev.peak else None,
        "peak_gib": dev.peak_gib(),
    }


def part_throughput(rec: dict, plan: Plan, dev: Device, report: Report) -> None:
    rows = rec["rows"] = []
    for name in (plan.single, plan.two):
        cfg, vocab, model = recipe_model(name, dev)
        batch = plan.batch or cfg.data.batch_size
        batches = vl_batches(cfg, vocab, plan, batch, dev)
        opt, _ = build_optimizer(model, cfg.train, fused=dev.cuda)

        def forward(b, model=model):
            return model(b).loss

        step = step_fn(forward, model, opt, dev, clip_norm=cfg.train.clip_grad_norm)
        rows.append(throughput_row(name, step, forward, model, batches, batch, plan, dev))
        print(rows[-1], flush=True)
        report.write()
        del model, opt, batches, step, forward
        dev.free()
    clip_rows(rec, plan, dev)


def clip_config(plan: Plan) -> dict[str, Any]:
    return CLIP_TINY if plan.clip == "tiny" else VIT_B_32


def clip_rows(rec: dict, plan: Plan, dev: Device) -> None:
    """CLIP at open_clip's shapes: mmptm's model of the config and open_clip's own, both
    trained on the same images and full-length captions, blocks alternating."""
    import open_clip
    from open_clip.loss import ClipLoss

    from mmptm.models.open_clip_import import open_clip_model_config

    oc_cfg = clip_config(plan)
    if plan.clip != "tiny":  # the copy above is open_clip's, still
        assert open_clip.get_model_config(plan.clip) == oc_cfg, "open_clip's ViT-B-32 changed"
    V, L = oc_cfg["text_cfg"]["vocab_size"], oc_cfg["text_cfg"]["context_length"]
    S, B = oc_cfg["vision_cfg"]["image_size"], plan.clip_batch
    vocab = VocabInfo(
        vocab_size=V,
        mask_id=-1,
        cls_id=V - 2,
        sep_id=V - 1,
        special_ids=frozenset({V - 2, V - 1}),
        pad_is_text=True,
    )
    torch.manual_seed(0)
    ours = PretrainModel(open_clip_model_config(oc_cfg), vocab).to(dev.dev).train()
    theirs = open_clip.CLIP(**oc_cfg).to(dev.dev).train()
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(4):
        ids = torch.randint(1, V - 2, (B, L), generator=g)
        ids[:, -1] = V - 1  # end of text: open_clip pools at the argmax, mmptm at the last token
        batches.append(
            to_device(
                {
                    "pixels": torch.randn(B, 3, S, S, generator=g),
                    "input_ids": ids,
                    "attention_mask": torch.ones(B, L, dtype=torch.bool),
                },
                dev,
            )
        )
    loss_fn = ClipLoss()

    def fwd_ours(b):
        return ours(b).loss

    def fwd_theirs(b):
        image, text, scale = theirs(b["pixels"], b["input_ids"])
        return loss_fn(image, text, scale)

    with torch.no_grad(), dev.autocast():
        rec["clip_init_losses"] = {
            "mmptm": float(fwd_ours(batches[0])),
            "open_clip": float(fwd_theirs(batches[0])),
            "ln_batch": math.log(B),
        }
    steps = {}
    for label, model, fwd in (("mmptm", ours, fwd_ours), ("open_clip", theirs, fwd_theirs)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.cuda or None)
        steps[label] = step_fn(fwd, model, opt, dev)
    dev.reset_peak()  # both models live: one peak for the pair
    rates = time_interleaved(
        steps,
        batches,
        batch_size=B,
        rounds=plan.rounds,
        steps_per_round=plan.steps,
        warmup=plan.warmup,
        sync=dev.sync,
    )
    for label, model, fwd in (("mmptm", ours, fwd_ours), ("open_clip", theirs, fwd_theirs)):
        row = throughput_row(
            f"CLIP {plan.clip} {label}",
            steps[label],
            fwd,
            model,
            batches,
            B,
            plan,
            dev,
            rates[label],
        )
        rec["rows"].append(row)
        print(row, flush=True)
    rec["clip_ratio"] = statistics.median(rates["mmptm"]) / statistics.median(rates["open_clip"])


def part_compile(rec: dict, plan: Plan, dev: Device, tol: float) -> None:
    """Eager against ``torch.compile`` (the trainer's ``train.compile``), same weights and
    batches, dropout off, the device's autocast."""
    from torch._dynamo.utils import counters

    cfg, vocab, model = recipe_model(plan.single, dev)
    no_dropout(model)
    init = copy.deepcopy(model.state_dict())
    batches = vl_batches(cfg, vocab, plan, plan.check_batch, dev)
    opt, _ = build_optimizer(model, constant_lr(cfg), fused=dev.cuda)
    step = step_fn(lambda b: model(b).loss, model, opt, dev, clip_norm=1.0)
    eager, rec["eager_steps_per_s"] = run_losses(step, batches, plan.check_steps, dev)
    rec.update(recipe=plan.single, backend=plan.compile_backend, eager_losses=eager)
    model.load_state_dict(init)
    torch._dynamo.reset()
    counters.clear()
    net = torch.compile(model, backend=plan.compile_backend)
    opt, _ = build_optimizer(model, constant_lr(cfg), fused=dev.cuda)
    step = step_fn(lambda b: net(b).loss, model, opt, dev, clip_norm=1.0)
    t0 = time.perf_counter()
    first = float(step(batches[0]))
    dev.sync()
    rec["compile_s"] = time.perf_counter() - t0
    # the same batch at every step as in eager mode: batches[i % 4] at step i
    rest, rec["compiled_steps_per_s"] = run_losses(
        step, batches[1:] + batches[:1], plan.check_steps - 1, dev
    )
    compiled = [first, *rest]
    breaks = counters["graph_break"]
    rec.update(
        batch=plan.check_batch,
        compiled_losses=compiled,
        graphs=counters["stats"].get("unique_graphs"),
        dynamo_stats=dict(counters["stats"]),
        graph_breaks=sum(breaks.values()),
        graph_break_reasons={k.splitlines()[0]: n for k, n in breaks.items()},
    )
    rec.update(compare(eager, compiled, tol))
    torch._dynamo.reset()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def part_fsdp(rec: dict, plan: Plan, dev: Device, tol: float) -> None:
    """The trainer's FSDP2 sharding in a world-size-1 process group against no sharding."""
    import torch.distributed as dist

    from mmptm.train import parallel

    dist.init_process_group(
        "nccl" if dev.cuda else "gloo",
        rank=0,
        world_size=1,
        init_method=f"tcp://127.0.0.1:{free_port()}",
    )
    try:
        cfg, vocab, model = recipe_model(plan.single, dev)
        no_dropout(model)
        init = copy.deepcopy(model.state_dict())
        batches = vl_batches(cfg, vocab, plan, plan.check_batch, dev)
        opt, _ = build_optimizer(model, constant_lr(cfg), fused=dev.cuda)
        step = step_fn(lambda b: model(b).loss, model, opt, dev, clip_norm=1.0)
        plain, rec["plain_steps_per_s"] = run_losses(step, batches, plan.check_steps, dev)
        del model, opt, step
        dev.free()
        _, _, model = recipe_model(plan.single, dev)
        no_dropout(model).load_state_dict(init)
        whole = parallel.shard(model, cfg.train.block_modules, bf16=dev.cuda)
        rec["fsdp_units"] = sum(type(m).__name__.startswith("FSDP") for m in model.modules())
        opt, _ = build_optimizer(model, constant_lr(cfg), fused=dev.cuda)
        step = step_fn(
            lambda b: model(b).loss,
            model,
            opt,
            dev,
            clip_norm=1.0,
            after_backward=lambda: parallel.average_gradients(whole),
        )
        dev.reset_peak()
        sharded, rec["fsdp_steps_per_s"] = run_losses(step, batches, plan.check_steps, dev)
        rec.update(
            recipe=plan.single,
            batch=plan.check_batch,
            plain_losses=plain,
            fsdp_losses=sharded,
            peak_gib=dev.peak_gib(),
            backend=dist.get_backend(),
        )
        rec.update(compare(plain, sharded, tol))
    finally:
        dist.destroy_process_group()


def make_world(out: Path, scenes: int, image_size: int) -> None:
    """toyworld's image-text view and a tokenizer: the loader part's data."""
    from mmptm import toyworld
    from mmptm.tokenizers.sentencepiece import train_tokenizer

    toyworld.generate(
        out,
        n_train=scenes,
        n_val=16,
        n_test=16,
        seed=0,
        image_size=image_size,
        shard_size=128,
        languages=("en",),
        views=["image_text"],
    )
    shards = sorted((out / "image_text").glob("train-*.tar"))
    train_tokenizer(
        shards, out / "tokenizer", vocab_size=1000, model_type="bpe", seed=0, num_threads=4
    )
    (out / "READY").write_text("ok")


def start_worlds(plan: Plan, tmp: Path) -> dict[str, subprocess.Popen]:
    """Write the loader's and the memory part's data in the background (CPU only)."""
    py = sys.executable
    procs = {
        "loader": subprocess.Popen(
            [
                py,
                __file__,
                "--make-world",
                str(tmp / "loader"),
                "--scenes",
                str(plan.loader_scenes),
                "--image-size",
                str(plan.loader_image_size),
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / "loader.log", "w"),  # noqa: SIM115
        )
    }
    procs["memory"] = subprocess.Popen(
        [py, str(HERE / "peak_memory.py"), "--make-world", str(tmp / "memory")],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "memory.log", "w"),  # noqa: SIM115
    )
    return procs


def wait_world(proc: subprocess.Popen, where: Path, log: Path) -> Path:
    rc = proc.wait()
    if rc != 0 or not (where / "READY").is_file():
        last = (log.read_text().strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"writing {where} failed (exit {rc}): {last}")
    return where


def part_loader(rec: dict, plan: Plan, dev: Device, world: Path) -> None:
    """Training steps/s fed by the loader's workers vs the same batches from memory."""
    from bench_train_loader import children_cpu_s, kept

    from mmptm.batch import move_to
    from mmptm.data.pipeline import Loader
    from mmptm.studies import relocated
    from mmptm.train.trainer import Trainer

    W = plan.loader_workers
    with tempfile.TemporaryDirectory() as out:
        over = [
            *relocated(plan.loader_recipe, world),
            f"data.num_workers={W}",
            "data.resampled=true",
            f"output_dir={out}",
            "train.progress=false",
            "train.tensorboard=false",
        ]
        if plan.batch:
            over.append(f"data.batch_size={plan.batch}")
        t = Trainer(load_run_config(plan.loader_recipe, over))
        B = t.cfg.data.batch_size
        loader = iter(Loader(t.stream, W))
        for _ in range(plan.warmup + 2):  # workers start, shuffle buffers fill, Adam's state
            t.train_step(loader)
        rounds: dict[str, list[float]] = {k: [] for k in ("loader", "memory", "wait", "worker_cpu")}
        for r in range(plan.loader_rounds):
            held, waited = [], []
            w0, t0 = children_cpu_s(), time.perf_counter()
            it = kept(loader, held, waited)
            for _ in range(plan.loader_steps):
                t.train_step(it)
            dev.sync()
            wall, worker = time.perf_counter() - t0, children_cpu_s() - w0
            t1 = time.perf_counter()
            replay = iter(held)
            for _ in range(plan.loader_steps):
                t.train_step(replay)
            dev.sync()
            rounds["loader"].append(plan.loader_steps / wall)
            rounds["memory"].append(plan.loader_steps / (time.perf_counter() - t1))
            rounds["wait"].append(sum(waited) / plan.loader_steps)
            rounds["worker_cpu"].append(worker / plan.loader_steps)
            print(
                f"  round {r + 1}: steps/s loader {rounds['loader'][-1]:.2f} memory "
                f"{rounds['memory'][-1]:.2f}, waiting {rounds['wait'][-1]:.4f} s/step",
                flush=True,
            )
        med = {k: statistics.median(v) for k, v in rounds.items()}
        rec.update(
            recipe=plan.loader_recipe,
            batch=B,
            workers=W,
            rounds=rounds,
            loader_steps_per_s=med["loader"],
            memory_steps_per_s=med["memory"],
            ratio=med["loader"] / med["memory"],
            wait_s_per_step=med["wait"],
            worker_cpu_s_per_step=med["worker_cpu"],
            samples_per_s_loader=med["loader"] * B,
            gflop_per_step=(t.flops_per_step or 0) / 1e9,
        )
        rec.update(host_to_device(held[0], dev, move_to))


def host_to_device(batch: Batch, dev: Device, move_to) -> dict[str, Any]:
    """One batch's copy to the device as the trainer does it (pageable memory) and pinned."""
    nbytes = sum(
        v.numel() * v.element_size() for v in batch.values() if isinstance(v, torch.Tensor)
    )
    out: dict[str, Any] = {"batch_mb": nbytes / 1e6}
    if not dev.cuda:
        return out
    pinned = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    for name, b in (("pageable", batch), ("pinned", pinned)):
        times = []
        for _ in range(5):
            dev.sync()
            t0 = time.perf_counter()
            move_to(b, dev.dev)
            dev.sync()
            times.append(time.perf_counter() - t0)
        out[f"h2d_{name}_ms"] = statistics.median(times) * 1e3
    return out


def part_memory(rec: dict, plan: Plan, dev: Device, world: Path, report: Report) -> None:
    """Peak memory of a training step per recipe at its default batch, while time lasts."""
    import peak_memory

    rows = rec["rows"] = []
    for recipe in peak_memory.recipe_names(plan.memory_recipes):
        try:
            row = peak_memory.measure(
                recipe, world, batch=0, steps=plan.memory_steps, device=str(dev.dev)
            )
        except OutOfTime:
            raise
        except Exception as e:  # one recipe's failure (e.g. out of memory) is its row
            row = {"recipe": recipe, "error": f"{type(e).__name__}: {e}"[:300]}
        dev.free()
        rows.append(peak_memory.brief(row))
        print(rows[-1], flush=True)
        report.write()


# -- main -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "runs/gpu_check"))
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, seconds")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--only", default="", help=f"comma list of parts ({','.join(SECTIONS)})")
    p.add_argument("--skip", default="", help="comma list of parts to leave out")
    p.add_argument("--budget-s", type=float, default=None, help="seconds for the whole run")
    p.add_argument("--tolerance", type=float, default=0.02, help="relative loss difference")
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="FIELD=VALUE",
        help="change the plan, e.g. batch=128 loader_workers=15",
    )
    p.add_argument("--make-world", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--scenes", type=int, default=4096, help=argparse.SUPPRESS)
    p.add_argument("--image-size", type=int, default=224, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def make_plan(args: argparse.Namespace) -> Plan:
    plan = SMOKE if args.smoke else Plan()
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in Plan.__dataclass_fields__ or key == "limits":
            raise SystemExit(f"--set {item}: no plan field {key!r}")
        kind = type(getattr(plan, key))
        plan = replace(plan, **{key: kind(value)})
    if args.budget_s:
        plan = replace(plan, budget_s=args.budget_s)
    return plan


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.make_world:
        make_world(args.make_world, args.scenes, args.image_size)
        return 0
    start = time.monotonic()
    plan = make_plan(args)
    dev = Device(args.device or ("cuda" if torch.cuda.is_available() and not args.smoke else "cpu"))
    if args.smoke:
        torch.set_num_threads(1)
    wanted = [s for s in (args.only.split(",") if args.only else SECTIONS) if s]
    unknown = set(wanted) - set(SECTIONS) | set(filter(None, args.skip.split(","))) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"unknown part(s) {sorted(unknown)}; parts: {', '.join(SECTIONS)}")
    wanted = [s for s in SECTIONS if s in wanted and s not in args.skip.split(",")]
    meta = {
        "command": " ".join(["benchmarks/gpu_check.py", *(argv or sys.argv[1:])]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "smoke": args.smoke,
        "plan": asdict(plan),
        "parts": wanted,
    }
    report = Report(args.out, meta, start + plan.budget_s)
    limits = dict(plan.limits)
    tmp = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    worlds = start_worlds(plan, tmp) if {"loader", "memory"} & set(wanted) else {}
    world = {k: (p, tmp / k, tmp / f"{k}.log") for k, p in worlds.items()}
    parts: dict[str, Callable[[dict], None]] = {
        "env": lambda rec: part_env(rec, dev),
        "precision": lambda rec: part_precision(rec, plan, dev, args.tolerance),
        "throughput": lambda rec: part_throughput(rec, plan, dev, report),
        "compile": lambda rec: part_compile(rec, plan, dev, args.tolerance),
        "fsdp": lambda rec: part_fsdp(rec, plan, dev, args.tolerance),
        "loader": lambda rec: part_loader(rec, plan, dev, wait_world(*world["loader"])),
        "memory": lambda rec: part_memory(rec, plan, dev, wait_world(*world["memory"]), report),
    }
    try:
        for name in wanted:
            report.run(name, limits[name], parts[name])
            dev.free()
    finally:
        for proc in worlds.values():
            if proc.poll() is None:
                proc.kill()
    states = {n: r["status"] for n, r in report.data["sections"].items()}
    print(f"\n{report.out / 'gpu_check.json'}: {states}  ({time.monotonic() - start:.0f} s)")
    print(markdown(report.data))
    return 0 if all(s == "ok" for s in states.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
