"""Shared fixtures: a tiny toyworld data set and tokenizer, built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmptm import toyworld
from mmptm.config import from_dict, load_yaml_tree
from mmptm.studies import relocated
from mmptm.tokenizers.sentencepiece import Tokenizer, train_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory) -> Path:
    """toyworld (5 languages) with 96 train / 32 val / 32 test scenes in shards of 16 (every
    view, video and scene sounds too, but not ``speech``: 800 spoken captions would take
    100 MB and several seconds), a tokenizer, a 16-unit codebook of the video features and
    an 8-unit MFCC codebook of the scene sounds."""
    from mmptm.converters.triples import write_triple_shards
    from mmptm.train.kge import KGETrainConfig, train_embeddings
    from mmptm.train.units import fit_audio_codebook, fit_codebook

    out = tmp_path_factory.mktemp("toyworld")
    views = [v for v in toyworld.ALL_VIEWS if v != "speech"]
    toyworld.generate(
        out, n_train=96, n_val=32, n_test=32, seed=0, image_size=32, shard_size=16,
        languages=("en", "de", "fr", "ru", "es"), views=views,
    )  # fmt: skip
    shards = sorted((out / "image_text").glob("train-*.tar"))
    train_tokenizer(shards, out / "tokenizer", vocab_size=400, seed=0, num_threads=1)
    codebook = out / "video_features" / "codebook.npy"
    fit_codebook(f"{out}/video_features/train-*.tar", codebook, k=16, seed=0)
    # HuBERT's iteration-1 units (hubert_tiny reads audio/mfcc_codebook.npy)
    fit_audio_codebook(f"{out}/audio/train-*.tar", out / "audio" / "mfcc_codebook.npy", k=8)
    # the knowledge recipes' entity vectors (ERNIE, K-BERT) and triple shards (KEPLER)
    graph = out / "knowledge" / "graph"
    train_embeddings(graph, out / "knowledge" / "transe", KGETrainConfig(epochs=2, dim=100),
                     progress=False)  # fmt: skip
    write_triple_shards(graph, graph / "descriptions.txt", out / "knowledge" / "triples")
    return out


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_world: Path) -> Tokenizer:
    return Tokenizer.load(tiny_world / "tokenizer.model")


def tiny_overrides(world: Path, out: Path, recipe: str = "clip_tiny") -> list[str]:
    """Overrides that point a recipe's ``data/toyworld`` paths at ``world`` and shrink it."""
    tree = load_yaml_tree(recipe)
    model = tree.get("model", {})
    # every data/toyworld path: shards of each split and source, codebooks, graph files
    over = [f"output_dir={out}", *relocated(recipe, world)]
    over.append(f"data.tokenizer={world}/tokenizer.model")
    over += [
        "data.batch_size=8",
        "data.num_workers=0",
        "data.shuffle_buffer=20",
        "model.width=32",
        "train.max_steps=6",
        "train.warmup_steps=2",
        "train.log_every=1",
        "train.ckpt_every=3",
        "train.progress=false",
    ]
    if model.get("fusion", {}).get("type") == "two_stream":
        over += ["model.fusion.language_heads=2", "model.fusion.vision_heads=2"]
    else:
        over += ["model.fusion.transformer.heads=2", "model.fusion.transformer.layers=2"]
    if (model.get("encoders") or {}).get("video"):
        over.append("model.encoders.video.backbone.image_size=32")
    image = model.get("encoders", {}).get("image")
    if image:
        over += ["model.encoders.image.backbone.image_size=32"]
        if image.get("backbone", {}).get("model_name", "").startswith("vit"):
            over.append(
                "model.encoders.image.backbone.model_kwargs={img_size: 32, patch_size: 8, "
                "embed_dim: 32, depth: 0, num_heads: 2}"
            )
    return over


@pytest.fixture(scope="session")
def tiny_clip_run(tiny_world: Path, tmp_path_factory) -> Path:
    """clip_tiny at width 32 trained for 30 steps of batch 16 on ``tiny_world``'s train
    split: a real (weak) dual encoder for the search index, the server and the browser."""
    from mmptm.recipe import load_run_config
    from mmptm.train.trainer import pretrain

    out = tmp_path_factory.mktemp("clip_run")
    over = [
        *tiny_overrides(tiny_world, out), "data.batch_size=16", "train.max_steps=30",
        "train.warmup_steps=5", "train.ckpt_every=30", "train.log_every=10",
    ]  # fmt: skip
    pretrain(load_run_config("clip_tiny", over))
    return out


@pytest.fixture(scope="session")
def tiny_index(tiny_clip_run: Path, tiny_world: Path, tmp_path_factory) -> Path:
    """An ``mmptm index`` of ``tiny_world``'s 32 test scenes (images, captions in five
    languages, thumbnails) by ``tiny_clip_run``."""
    from mmptm.search.index import build_index

    out = tmp_path_factory.mktemp("index") / "tiny_index"
    build_index(str(tiny_clip_run), f"{tiny_world}/image_text/test-*.tar", out)
    return out


#: a one-layer text MLM on toyworld's captions: the fastest recipe, for the fault tests
TEXT_MLM = str(ROOT / "tests" / "train" / "text_mlm.yaml")


def text_mlm_overrides(world: Path, out: Path) -> list[str]:
    """Overrides of ``TEXT_MLM`` for ``world``: 6 steps of 4 samples, a checkpoint every 3."""
    return [
        f"output_dir={out}",
        f"data.tokenizer={world}/tokenizer.model",
        f"data.train={world}/image_text/train-*.tar",
        "data.batch_size=4",
        "data.num_workers=0",
        "data.shuffle_buffer=20",
        "train.max_steps=6",
        "train.warmup_steps=2",
        "train.log_every=1",
        "train.ckpt_every=3",
        "train.progress=false",
    ]


def cli_error(capsys, argv: list[str]) -> str:
    """Run ``mmptm argv`` in this process; it must fail with status 2 and one line, no
    traceback. Returns that line."""
    from mmptm.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"mmptm {argv[0]}: error: ")
    return last


def text_image_model_config(**extra):
    """A tiny text + ViT-patch model config (width 16); ``extra`` replaces top-level keys."""
    from mmptm.recipe import ModelConfig

    tree = {
        "width": 16,
        "encoders": {
            "text": {"type": "text", "max_positions": 32},
            "image": {
                "type": "timm_image",
                "backbone": {
                    "model_name": "vit_tiny_patch16_224",
                    "model_kwargs": {"img_size": 16, "patch_size": 8, "embed_dim": 16,
                                     "depth": 0, "num_heads": 2},
                    "image_size": 16,
                },
            },
        },
        "fusion": {"type": "single_stream", "transformer": {"layers": 1, "heads": 2}},
        "objectives": {"mlm": {"type": "mlm"}, "itm": {"type": "itm"}},
        **extra,
    }  # fmt: skip
    return from_dict(ModelConfig, tree)


def synthetic_batch(model, vocab, B: int = 8, T: int = 5, seed: int = 0) -> dict:
    """A collated batch with the keys each view's plug-in writes (the contract's keys)."""
    import numpy as np
    import torch

    from mmptm.models.pretrain import data_transforms

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    real_BT = torch.arange(T)[None] < lengths[:, None]
    batch: dict = {"__key__": [f"s{i}" for i in range(B)]}
    for view, need in model.data_needs().items():
        p = "" if view == need.modality else f"{view}_"
        if need.modality == "text":
            L = 10
            ids = torch.randint(5, vocab.vocab_size, (B, L), generator=g)
            ids[:, 0] = vocab.cls_id
            mask = torch.arange(L)[None] < torch.randint(4, L + 1, (B,), generator=g)[:, None]
            batch[f"{p}input_ids"] = ids.masked_fill(~mask, vocab.pad_id)
            batch[f"{p}attention_mask"] = mask
            batch[f"{p}segment_ids"] = torch.zeros(B, L, dtype=torch.long)
        elif need.modality == "video":
            size = need.facts["size"]
            frames = torch.randn(B, T, 3, size, size, generator=g)
            batch[f"{p}frames"] = frames * real_BT[:, :, None, None, None]
            batch[f"{p}frames_mask"] = real_BT
        elif need.modality == "features":
            feats = torch.randn(B, T, need.facts["dim"], generator=g)
            batch[f"{p}features"] = feats * real_BT[..., None]
            batch[f"{p}features_mask"] = real_BT
        elif need.modality == "units":
            k = int(np.load(need.facts["codebook"], mmap_mode="r").shape[0])
            batch[f"{p}unit_ids"] = torch.randint(0, k, (B, T), generator=g) * real_BT
            batch[f"{p}unit_mask"] = real_BT
        elif need.modality != "answers":  # targets (answers) are the caller's to add
            raise AssertionError(f"no synthetic data for {need.modality!r}")
    for t in data_transforms(model.cfg, vocab):
        batch = t(batch, g)
    return batch


def read_shard_samples(paths: list[str]) -> list[tuple[str, dict[str, bytes]]]:
    """(key, {ext: bytes}) per sample, in shard order; checks that members stay grouped and
    that keys are unique and have no "/"."""
    import tarfile

    samples: list[tuple[str, dict[str, bytes]]] = []
    for path in paths:
        with tarfile.open(path) as tar:
            for member in tar.getmembers():
                key, ext = member.name.split(".", 1)
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                if not samples or samples[-1][0] != key:
                    samples.append((key, {}))
                samples[-1][1][ext] = data
    keys = [k for k, _ in samples]
    assert len(set(keys)) == len(keys) and not any("/" in k for k in keys)
    return samples


#: processes of the spawned gloo runs (tests/train/test_distributed.py, test_fsdp.py)
WORLD = 2


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(fn, args: tuple, deadline_s: float, done=lambda: False, world: int = WORLD):
    """Run ``fn(rank, *args)`` in ``world`` processes; fail the test past the deadline.
    ``done``: the test has what it needs (the other processes are then ended)."""
    import sys
    import time

    import torch.multiprocessing as mp

    # The spawned children import fn's module by its name; make its root importable.
    name = fn.__module__
    root = Path(sys.modules[name].__file__).resolve().parents[name.count(".")]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    ctx = mp.spawn(_rank_then_exit, args=(fn, args), nprocs=world, join=False)
    deadline = time.monotonic() + deadline_s
    try:
        while not ctx.join(timeout=1):
            if done():
                return
            if time.monotonic() > deadline:
                pytest.fail(f"the {world}-process gloo run did not finish within {deadline_s} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()


def _rank_then_exit(rank: int, fn, args: tuple) -> None:
    """``fn(rank, *args)``, then leave as ``mmptm`` ranks do (``exit_rank``); an exception
    goes to ``mp.spawn`` as it would without the wrapper."""
    from mmptm.train.trainer import exit_rank

    fn(rank, *args)
    exit_rank(0)


def rank_env(rank: int, port: int, world: int = WORLD) -> None:
    """What torchrun sets for a rank on 127.0.0.1, one torch thread per rank."""
    import multiprocessing
    import os

    import torch

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
        LOCAL_RANK=str(rank), OMP_NUM_THREADS="1",
    )  # fmt: skip
    torch.set_num_threads(1)
    # As under torchrun: loader workers fork (a spawned child would spawn them, re-importing
    # torch in every worker of every epoch)
    multiprocessing.set_start_method("fork", force=True)


# --- a tiny text MLM run on sentences about toys (knowledge probes and span tasks) ----------
TOYS = ["Bimo", "Kato", "Lumi", "Zepp", "Oroboro", "Tiki"]
MATERIALS = ["wood", "plastic", "felt", "tin", "porcelain"]
OWNERS = ["Anna", "Boris", "Clementine"]


def toy_sentences() -> list[str]:
    out = []
    for i, toy in enumerate(TOYS):
        out.append(f"{toy} is made of {MATERIALS[i % len(MATERIALS)]} .")
        out.append(f"{toy} belongs to {OWNERS[i % len(OWNERS)]} .")
    return out * 8


@pytest.fixture(scope="session")
def toy_text_run(tmp_path_factory) -> Path:
    """A one-layer text MLM (``TEXT_MLM``) trained 4 steps on :func:`toy_sentences`, with a
    60-piece BPE tokenizer: a real, weak run for the cloze and span-task tests."""
    from mmptm.data.shards import ShardWriter
    from mmptm.recipe import load_run_config
    from mmptm.train.trainer import pretrain

    root = tmp_path_factory.mktemp("toy_text")
    with ShardWriter(root / "train-%06d.tar", 1000) as w:
        for i, s in enumerate(toy_sentences()):
            w.write({"__key__": f"{i:05d}", "txt": s, "json": {"language": "en"}})
    corpus = root / "corpus.en.txt"
    corpus.write_text("\n".join(toy_sentences()) + "\n")
    train_tokenizer([corpus], root / "tok", vocab_size=60, model_type="bpe", seed=0,
                    num_threads=1, fit_to_data=True)  # fmt: skip
    run = root / "run"
    over = [
        f"output_dir={run}", f"data.tokenizer={root}/tok.model",
        f"data.train={root}/train-*.tar", 'data.val=""', 'data.test=""', "data.batch_size=8",
        "data.num_workers=0", "data.shuffle_buffer=10", "train.max_steps=4",
        "train.warmup_steps=1", "train.ckpt_every=4", "train.log_every=1",
        "train.progress=false",
    ]  # fmt: skip
    pretrain(load_run_config(TEXT_MLM, over))
    return run
