"""Fine-tuning from a pre-trained checkpoint (init=...), its baseline, and its evaluation."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_overrides

from mmptm.eval.classification import evaluate_classification, evaluate_sets
from mmptm.eval.xlingual import evaluate_xlingual
from mmptm.models import checkpoint
from mmptm.recipe import load_run_config
from mmptm.train.trainer import Trainer, pretrain

XNLI = "xnli"
LANGS = ("en", "de", "fr", "ru", "es")


@pytest.fixture(scope="module")
def pretrained(tiny_world, tmp_path_factory):
    run = tmp_path_factory.mktemp("xlm")
    cfg = load_run_config(
        "xlm_tlm_tiny",
        # language embeddings: not the recipe's default, so the fine-tuning can only have
        # them from the checkpoint's architecture
        [*tiny_overrides(tiny_world, run, "xlm_tlm_tiny"), "train.max_steps=4",
         "model.encoders.text.language_embeddings=true"],
    )  # fmt: skip
    pretrain(cfg)
    return run


def _xnli(world, out, init, *extra):
    return load_run_config(
        XNLI,
        [
            f"init={init}",
            f"output_dir={out}",
            f"data.train={world}/nli/train-en-*.tar",
            *[f"data.eval.{lang}={world}/nli/test-{lang}-*.tar" for lang in LANGS],
            "data.batch_size=8",
            "data.num_workers=0",
            "train.max_steps=3",
            "train.progress=false",
            *extra,
        ],
    )


def test_init_loads_the_pretrained_encoder_and_adds_a_fresh_head(tiny_world, pretrained, tmp_path):
    cfg = _xnli(tiny_world, tmp_path / "ft", pretrained)
    trainer = Trainer(cfg)
    # The architecture and tokenizer came from the checkpoint, the head from the recipe.
    assert cfg.model.width == 32 and list(cfg.model.objectives) == ["xnli"]
    assert cfg.model.encoders["text"].language_embeddings
    source = checkpoint.read(pretrained).model
    own = trainer.model.state_dict()
    for name in ("encoders.text.word.weight", "fusion.stack.blocks.1.mlp.2.weight"):
        torch.testing.assert_close(own[name], source[name])
    assert "objectives.xnli.head.1.weight" in own and not any(
        k.startswith("objectives.mlm") for k in own
    )
    trainer.fit()
    result = evaluate_sets(trainer.model, cfg, trainer.tokenizer, cfg.data.eval)
    assert set(result) == {*LANGS, "avg"}
    assert all(0.0 <= v <= 1.0 for v in result.values())
    # The saved fine-tuned run evaluates the same from disk.
    again = evaluate_classification(str(tmp_path / "ft"))
    assert again == pytest.approx(result)


def test_a_routed_pretraining_fine_tunes_with_the_recipes_own_routes(tiny_world, tmp_path):
    recipe = "xlm_xlco_tiny"  # routes mono/tlm → mlm, xlco → xlco: none exists downstream
    over = [
        *tiny_overrides(tiny_world, tmp_path / "pre", recipe),
        "train.max_steps=2",
        "model.fusion.modality_pooling=first",
    ]  # not the default: must come from the run
    pretrain(load_run_config(recipe, over))
    cfg = _xnli(tiny_world, tmp_path / "ft", tmp_path / "pre")
    trainer = Trainer(cfg)
    assert cfg.model.routes == {} and cfg.model.fusion.modality_pooling == "first"
    trainer.fit()
    assert trainer.step == 3


def test_init_mode_architecture_is_the_same_shape_with_fresh_weights(
    tiny_world, pretrained, tmp_path
):
    trainer = Trainer(_xnli(tiny_world, tmp_path / "scratch", pretrained, "init_mode=architecture"))
    source = checkpoint.read(pretrained).model
    own = trainer.model.state_dict()
    assert own["encoders.text.word.weight"].shape == source["encoders.text.word.weight"].shape
    assert not torch.equal(own["encoders.text.word.weight"], source["encoders.text.word.weight"])


def test_init_from_a_mismatching_checkpoint_names_the_tensor(tiny_world, pretrained, tmp_path):
    state = torch.load(checkpoint.resolve(pretrained), weights_only=False)
    state["model"]["encoders.text.word.weight"] = torch.zeros(3, 3)
    bad = tmp_path / "bad.pt"
    checkpoint.save_atomic(state, bad)
    with pytest.raises(ValueError, match=r"encoders\.text\.word\.weight"):
        Trainer(_xnli(tiny_world, tmp_path / "x", bad))


def test_cross_lingual_retrieval_reports_every_language(tiny_world, pretrained):
    result = evaluate_xlingual(str(pretrained), f"{tiny_world}/parallel/test-*.tar", pivot="en")
    assert set(result) == {"de", "fr", "ru", "es", "avg"}
    assert all(0.0 <= v <= 1.0 for v in result.values())
    with pytest.raises(ValueError, match="pivot language 'xx'"):
        evaluate_xlingual(str(pretrained), f"{tiny_world}/parallel/test-*.tar", pivot="xx")
