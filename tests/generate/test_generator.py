"""Generation from trained runs: a translation model and VLP/BLIP-style captioners trained on
tiny_world, then decoded through :class:`~mmptm.generate.generator.Generator`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mmptm.batch import KEY
from mmptm.data.shards import ShardWriter, SkipCounter, expand_shards, tar_samples
from mmptm.generate.decoding import DecodeConfig
from mmptm.generate.generator import Generator
from mmptm.recipe import load_run_config
from mmptm.train.trainer import pretrain
from tests.conftest import tiny_overrides

#: four English sentences and their German translations: a model that learnt them must
#: write each translation back exactly
PAIRS = [
    ("a red circle is above a square", "ein roter Kreis ist über einem Quadrat"),
    ("a blue square is left of a star", "ein blaues Quadrat ist links von einem Stern"),
    ("two green stars are below it", "zwei grüne Sterne sind darunter"),
    ("the yellow triangle is small", "das gelbe Dreieck ist klein"),
]


def write_pairs(path: Path) -> str:
    with ShardWriter(str(path / "pairs-%06d.tar"), max_count=1000) as w:
        for rep in range(8):
            for i, (en, de) in enumerate(PAIRS):
                meta = {"languages": ["en", "de"], "texts": [en, de]}
                w.write({KEY: f"p{rep}_{i}", "json": meta})
    return f"{path}/pairs-*.tar"


@pytest.fixture(scope="module")
def translation_run(tiny_world: Path, tmp_path_factory) -> Path:
    """An encoder–decoder (mbart_tiny's shape at width 32) trained to translate PAIRS."""
    out = tmp_path_factory.mktemp("translation_run")
    shards = write_pairs(out)
    over = [
        *tiny_overrides(tiny_world, out, "mbart_tiny"),
        "data.sources=__delete__",
        f"data.train={shards}",
        "model.objectives.lm.noise=none",
        "model.objectives.lm.target=text2",
        "model.objectives.lm.context=[text]",
        "model.objectives.lm.label_smoothing=0.0",
        "model.objectives.lm.decoder.layers=1",
        "model.objectives.lm.decoder.heads=2",
        "model.fusion.transformer.dropout=0.0",
        "model.objectives.lm.decoder.dropout=0.0",
        "train.max_steps=300",
        "train.warmup_steps=20",
        "train.lr=3e-3",
        "train.ckpt_every=300",
        "train.log_every=100",
    ]
    pretrain(load_run_config("mbart_tiny", over))
    return out


def text_samples(texts: list[str], lang: str) -> list[dict]:
    return [
        {KEY: f"q{i}", "txt": t.encode(), "json": json.dumps({"language": lang}).encode()}
        for i, t in enumerate(texts)
    ]


def test_translation_run_writes_what_it_learnt(translation_run: Path):
    gen = Generator.load(str(translation_run))
    sources = text_samples([en for en, _ in PAIRS], "en")
    want = [de for _, de in PAIRS]
    greedy = gen.generate(sources, DecodeConfig(max_len=16), lang="de")
    assert [g.text for g in greedy] == want
    beam = gen.generate(sources, DecodeConfig(max_len=16, beam=3), lang="de")
    assert [g.text for g in beam] == want
    # the cached and uncached decoders agree token for token, greedy and beam
    for cfg in (DecodeConfig(max_len=16), DecodeConfig(max_len=16, beam=3)):
        cached = gen.generate(sources, cfg, lang="de")
        uncached = gen.generate(sources, cfg, lang="de", use_cache=False)
        assert [g.ids for g in cached] == [g.ids for g in uncached]
    # one row alone decodes as it does in the batch
    alone = gen.generate(sources[2:3], DecodeConfig(max_len=16, beam=3), lang="de")
    assert alone[0].ids == beam[2].ids


def test_translation_run_refuses_a_prompt_and_unknown_language(translation_run: Path):
    gen = Generator.load(str(translation_run))
    with pytest.raises(ValueError, match="unknown language 'xx'"):
        gen.generate(text_samples(["a red circle"], "en"), lang="xx")
    with pytest.raises(ValueError, match="takes no prompt"):
        gen.generate(text_samples(["a red circle"], "en"), lang="de", prompt="ein")


@pytest.mark.parametrize("recipe", ["vlp_tiny", "blip_tiny", "xlm_clm_tiny"])
def test_generative_recipes_train_and_write(recipe: str, tiny_world: Path, tmp_path: Path):
    """Each generative recipe trains a few steps and writes text for held-out samples."""
    pretrain(load_run_config(recipe, tiny_overrides(tiny_world, tmp_path, recipe)))
    gen = Generator.load(str(tmp_path))
    if recipe == "xlm_clm_tiny":
        out = gen.generate([{KEY: "prompt"}], DecodeConfig(max_len=5), prompt="a red")
    else:
        shards = expand_shards(f"{tiny_world}/regions/test-*.tar")
        samples = [s for _, s in zip(range(3), tar_samples(shards, SkipCounter()))]
        out = gen.generate(samples, DecodeConfig(max_len=5, beam=2))
        assert len(out) == 3
    assert all(isinstance(g.text, str) and len(g.ids) <= 5 for g in out)
    assert all(torch.isfinite(torch.tensor(g.score)) for g in out)


def test_cli_generate_and_eval_translation(translation_run: Path, capsys):
    from mmptm.cli import main

    assert main(["generate", str(translation_run), "--text", PAIRS[2][0], "--lang", "de",
                 "--beam", "2"]) == 0  # fmt: skip
    assert capsys.readouterr().out.strip() == f"text\t{PAIRS[2][1]}"
    shards = f"{translation_run}/pairs-*.tar"
    assert main(["eval", "translation", str(translation_run), "--src", "en", "--tgt", "de",
                 "--shards", shards, "--limit", "8"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["bleu"] == pytest.approx(100.0) and result["n"] == 8
    # the baselines learn from the same pairs: copying English scores near nothing
    assert result["baselines"]["copy"]["bleu"] < 10
    assert result["baselines"]["dictionary"]["chrf"] > result["baselines"]["copy"]["chrf"]


def test_cli_generate_one_line_errors(translation_run: Path, tiny_clip_run: Path, capsys):
    from tests.conftest import cli_error

    err = cli_error(capsys, ["generate", str(tiny_clip_run), "--text", "a red circle"])
    assert "cannot write text" in err and "contrastive" in err
    err = cli_error(capsys, ["generate", str(translation_run), "--image", "nowhere.jpg"])
    assert "no such file: nowhere.jpg" in err
    err = cli_error(capsys, ["generate", str(translation_run)])
    assert "give --text" in err
    err = cli_error(capsys, ["generate", str(translation_run), "--text", "x", "--beam", "0"])
    assert "beam must be at least 1" in err


def test_video_captioning_from_a_video_text_run(tiny_world: Path, tmp_path: Path, capsys):
    """video_clip_tiny, then the video_captioning recipe on its run: `mmptm generate --video`
    describes an mp4 file and `mmptm eval captioning` scores the test clips."""
    from mmptm.cli import main

    pre = tmp_path / "pre"
    pretrain(load_run_config("video_clip_tiny", tiny_overrides(tiny_world, pre, "video_clip_tiny")))
    ft = tmp_path / "ft"
    over = [*tiny_overrides(tiny_world, ft, "video_captioning"), f"init={pre}"]
    over = [o for o in over if not o.startswith(("model.fusion", "model.width", "model.encoders"))]
    pretrain(load_run_config("video_captioning", over))
    shards = expand_shards(f"{tiny_world}/video/test-*.tar")
    sample = next(iter(tar_samples(shards, SkipCounter())))
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(sample["mp4"])
    assert main(["generate", str(ft), "--video", str(clip), "--max-len", "6", "--json"]) == 0
    written = json.loads(capsys.readouterr().out.strip())
    assert written["key"] == "clip" and isinstance(written["text"], str)
    assert main(["eval", "captioning", str(ft), "--limit", "4", "--max-len", "6"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["n"] == 4 and result["lang"] == "en"


def test_an_encoder_run_starts_a_decoder_recipe(tiny_world: Path, tmp_path: Path):
    """init_mode=encoders: mbart_tiny started from an mbert_tiny run keeps its text encoder
    (at lr 0 the checkpoint still holds mbert's weights) and builds its decoder new."""
    from mmptm.models import checkpoint

    mbert = tmp_path / "mbert"
    pretrain(load_run_config("mbert_tiny", tiny_overrides(tiny_world, mbert, "mbert_tiny")))
    mbart = tmp_path / "mbart"
    over = [*tiny_overrides(tiny_world, mbart, "mbart_tiny"), f"init={mbert}",
            "init_mode=encoders", "train.lr=0", "model.objectives.lm.decoder.heads=2"]  # fmt: skip
    pretrain(load_run_config("mbart_tiny", over))
    src, dst = checkpoint.read(mbert).model, checkpoint.read(mbart).model
    enc = [k for k in src if k.startswith("encoders.text.")]
    assert enc and all(torch.equal(src[k], dst[k]) for k in enc)
    assert any(k.startswith("objectives.lm.decoder.") for k in dst)
    assert not any(k.startswith("objectives.lm.") for k in src)
