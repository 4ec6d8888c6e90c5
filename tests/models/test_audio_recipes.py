"""The audio recipes on real toyworld shards: each tiny one takes a training step on a batch
the audio plug-in decoded, with a gradient reaching every weight; the base recipes build at
their published shapes; SpeechBERT's audio encoder carries over to spoken caption ↔ image."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_overrides

from mmptm import toyworld
from mmptm.data.pipeline import Loader, stream_config
from mmptm.encoders.base import VocabInfo
from mmptm.models.load import NO_TEXT, build_model, load_pretrained
from mmptm.models.pretrain import data_transforms
from mmptm.recipe import load_run_config
from mmptm.train.trainer import pretrain
from mmptm.train.units import fit_audio_codebook

AUDIO_TINY = ["clap_tiny", "audio_image_tiny", "wav2vec2_tiny", "hubert_tiny", "speechbert_tiny"]
TERMS = {
    "clap_tiny": {"contrastive_loss", "contrastive_acc"},
    "audio_image_tiny": {"contrastive_loss"},
    "wav2vec2_tiny": {"wav2vec2_loss", "wav2vec2_diversity_loss", "wav2vec2_acc"},
    "hubert_tiny": {"hubert_loss", "hubert_acc_masked"},
    "speechbert_tiny": {"mlm_loss", "masked_frames_loss", "masked_frames_acc"},
}


@pytest.fixture(scope="module")
def speech_world(tiny_world, tmp_path_factory):
    """Spoken English captions of a few toyworld scenes (tiny_world has no speech view)."""
    out = tmp_path_factory.mktemp("speech")
    toyworld.generate(
        out, n_train=16, n_val=8, n_test=8, seed=0, image_size=32, shard_size=8,
        languages=("en",), views=("speech",),
    )  # fmt: skip
    return out


def _config(recipe, tiny_world, speech_world, tmp_path, extra=()):
    over = tiny_overrides(tiny_world, tmp_path, recipe)
    if recipe == "speechbert_tiny":
        over += [f"data.{s}={speech_world}/speech/{s}-*.tar" for s in ("train", "val", "test")]
    if recipe == "hubert_tiny":
        book = tmp_path / "mfcc_k8.npy"
        fit_audio_codebook(f"{tiny_world}/audio/train-*.tar", book, k=8, seed=0)
        over.append(f"model.objectives.hubert.codebook={book}")
    return load_run_config(recipe, [*over, *extra])


@pytest.mark.parametrize("recipe", AUDIO_TINY)
def test_audio_tiny_recipe_steps_on_decoded_shards(recipe, tiny_world, speech_world, tmp_path):
    cfg = _config(recipe, tiny_world, speech_world, tmp_path)
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    vocab = VocabInfo.from_tokenizer(tok) if tok is not None else NO_TEXT
    stream = stream_config(
        cfg.data, tok, needs=model.data_needs(), transforms=data_transforms(cfg.model, vocab)
    )
    batch = next(Loader(stream, 0)._epoch_batches())
    model.train()
    out = model(batch)
    assert torch.isfinite(out.loss)
    assert TERMS[recipe] <= set(out.terms), sorted(out.terms)
    out.loss.backward()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    missing = [n for n, p in trainable if p.grad is None or not p.grad.abs().sum() > 0]
    # image backbones may hold parameters a 32-pixel input leaves unused; the single-stream
    # pooler serves fine-tuning heads, which SpeechBERT's pre-training objectives are not
    unused = (".backbone.", "fusion.pooler.") if recipe == "speechbert_tiny" else (".backbone.",)
    assert not [n for n in missing if not any(u in n for u in unused)], missing


@pytest.mark.parametrize("recipe", ["clap_base", "wav2vec2_base", "hubert_base", "speechbert_base"])
def test_audio_base_recipes_build_at_published_shapes(recipe, tiny_world, tmp_path):
    over = [f"data.tokenizer={tiny_world}/tokenizer.model"]
    if recipe == "hubert_base":
        book = tmp_path / "k100.npy"
        import numpy as np

        np.save(book, np.zeros((100, 39), np.float32))
        over.append(f"model.objectives.hubert.codebook={book}")
    cfg = load_run_config(recipe, over)
    model, _ = build_model(cfg)
    audio = sum(p.numel() for p in model.encoders["audio"].parameters()) / 1e6
    # wav2vec 2.0 / HuBERT BASE: 94.4 M in the encoder; AST-B ~86 M; SpeechBERT: 6 layers
    want = {"wav2vec2_base": 94.4, "hubert_base": 94.4, "clap_base": 86.0, "speechbert_base": 43}
    assert audio == pytest.approx(want[recipe], rel=0.08), audio


@pytest.mark.slow
def test_hubert_iteration_2_learns_from_a_sharded_teacher_run(tiny_world, speech_world, tmp_path):
    """A one-process ``train.parallel=fsdp`` run writes ``step_N.dcp``: ``units fit`` fits a
    codebook on its layer 1 and HuBERT's second iteration trains against it, the teacher
    being that run's audio encoder, loaded by mmptm.models."""
    from mmptm.models import checkpoint

    teacher = tmp_path / "w2v"
    over = ["train.max_steps=2", "train.parallel=fsdp"]
    pretrain(_config("wav2vec2_tiny", tiny_world, speech_world, teacher, over))
    ckpt = checkpoint.read(teacher)
    assert ckpt.path.suffix == ".dcp"
    book = tmp_path / "teacher_k8.npy"
    audio = f"{tiny_world}/audio/train-*.tar"
    record = fit_audio_codebook(audio, book, features=str(teacher), layer=1, k=8, seed=0)
    assert record["features"] == {"kind": "teacher", "run": str(teacher), "layer": 1}
    hubert = [
        "model.objectives.hubert.features=teacher", f"model.objectives.hubert.teacher={teacher}",
        "model.objectives.hubert.teacher_layer=1", f"model.objectives.hubert.codebook={book}",
    ]  # fmt: skip
    cfg = _config("hubert_tiny", tiny_world, speech_world, tmp_path / "hubert", hubert)
    torch.manual_seed(0)
    model, _ = build_model(cfg)
    enc = model.objectives["hubert"].featurizer.encoder
    for k, v in enc.state_dict().items():  # the run's weights, frozen, outside the model
        torch.testing.assert_close(v, ckpt.model[f"encoders.audio.{k}"])
    assert not any(p.requires_grad for p in enc.parameters())
    assert not any(k.startswith("objectives.hubert.featurizer") for k in model.state_dict())
    stream = stream_config(
        cfg.data, None, needs=model.data_needs(), transforms=data_transforms(cfg.model, NO_TEXT)
    )
    out = model.train()(next(Loader(stream, 0)._epoch_batches()))
    assert torch.isfinite(out.terms["hubert_loss"]) and out.terms["hubert_acc_masked"] >= 0


@pytest.mark.slow
def test_speechbert_audio_encoder_carries_over_to_speech_image(tiny_world, speech_world, tmp_path):
    cfg = _config(
        "speechbert_tiny", tiny_world, speech_world, tmp_path / "sb", ["train.max_steps=2"]
    )
    pretrain(cfg)
    over = [
        f"init={tmp_path / 'sb'}", f"output_dir={tmp_path / 'si'}", "train.max_steps=1",
        f"data.tokenizer={tiny_world}/tokenizer.model", "data.batch_size=4",
        "data.num_workers=0", "model.width=32", "train.progress=false",
        *[f"data.{s}={speech_world}/speech/{s}-*.tar" for s in ("train", "val", "test")],
    ]  # fmt: skip
    ft = load_run_config("speech_image", over)
    pretrain(ft)
    src, _, _ = load_pretrained(str(tmp_path / "sb"))
    dst, _, _ = load_pretrained(str(tmp_path / "si"))
    # the audio encoder started from SpeechBERT's: one fine-tuning step moves it far less
    # than the distance to a freshly initialised one
    fresh, _ = build_model(load_run_config("speech_image", over))
    a = src.encoders["audio"].state_dict()
    b = dst.encoders["audio"].state_dict()
    c = fresh.encoders["audio"].state_dict()
    assert a.keys() == b.keys() == c.keys()
    moved = sum(float((b[n] - a[n]).norm()) for n in a)
    apart = sum(float((c[n] - a[n]).norm()) for n in a)
    assert moved < 0.2 * apart, (moved, apart)


@pytest.mark.slow
def test_audio_classification_finetunes_a_pretrained_encoder(tiny_world, speech_world, tmp_path):
    """`mmptm finetune audio_classification init=RUN`: the wav2vec 2.0
    encoder of the run with a new head on its pooled vector, scored on data.eval."""
    import json

    from mmptm.cli import main

    cfg = _config(
        "wav2vec2_tiny", tiny_world, speech_world, tmp_path / "w2v", ["train.max_steps=2"]
    )
    pretrain(cfg)
    audio = f"{tiny_world}/audio"
    argv = [
        "finetune", "audio_classification",
        f"init={tmp_path / 'w2v'}", f"output_dir={tmp_path / 'cls'}", "train.max_steps=2",
        f"data.train={audio}/train-*.tar", f"data.test={audio}/test-*.tar",
        f"data.eval.test={audio}/test-*.tar", "data.batch_size=8", "data.num_workers=0",
        "train.progress=false",
    ]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((tmp_path / "cls" / "eval.json").read_text())
    assert 0 <= result["test"] <= 1
    model, _, _ = load_pretrained(str(tmp_path / "cls"))
    src, _, _ = load_pretrained(str(tmp_path / "w2v"))
    a = src.encoders["audio"].state_dict()
    b = model.encoders["audio"].state_dict()
    assert a.keys() == b.keys()  # the pre-trained encoder, then 2 fine-tuning steps
    assert sum(float((a[k].float() - b[k].float()).norm()) for k in a) < 0.2 * sum(
        float(a[k].float().norm()) for k in a
    )
