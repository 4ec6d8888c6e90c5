"""A study moves a recipe's toyworld paths to its own data, and writes the views it reads."""

from __future__ import annotations

from pathlib import Path

from mmptm.studies.common import recipe_views, relocated


def test_every_toyworld_path_of_a_recipe_moves_with_its_key():
    moved = dict(o.split("=", 1) for o in relocated("video_clip_tiny", Path("/d")))
    assert moved == {
        "data.sources.video.shards": "/d/video/train-*.tar",
        "data.sources.images.shards": "/d/image_text/train-*.tar",
        "data.val": "/d/video/val-*.tar",
        "data.test": "/d/video/test-*.tar",
        "data.tokenizer": "/d/tokenizer.model",  # from the base recipe, _toyworld.yaml
    }
    units = dict(o.split("=", 1) for o in relocated("videobert_tiny", Path("/d")))
    assert units["model.encoders.units.codebook"] == "/d/video_features/codebook.npy"


def test_the_views_a_recipe_reads():
    assert recipe_views("video_clip_tiny") == {"video", "image_text"}  # images as 1-frame clips
    assert recipe_views("videoclip_tiny") == {"video_features"}
    assert recipe_views("clip_tiny") == {"image_text"}
    assert recipe_views("ernie_vl_tiny") == {"knowledge"}


def _vqa_config(world: Path, run: Path, out: Path, *extra: str):
    from conftest import tiny_overrides

    from mmptm.recipe import load_run_config

    answers = world / "vqa" / "answers_test.txt"
    if not answers.is_file():
        answers.write_text("".join(f"{a}\n" for a in ("yes", "no", "2", "red", "circle")))
    over = [o for o in tiny_overrides(world, out, "vqa") if not o.startswith("model.")]
    return load_run_config("vqa", [*over, f"init={run}", "train.max_steps=2",
                                   f"model.objectives.vqa.answers={answers}", *extra])  # fmt: skip


def test_run_key_is_the_run_a_from_scratch_fine_tuning_trains(tiny_world, tmp_path):
    """Same key: the same weights after training (checked bitwise), whichever run the
    architecture came from; another architecture, seed or weights start: another key."""
    import torch
    from conftest import tiny_overrides

    from mmptm.recipe import load_run_config
    from mmptm.studies.common import run_key
    from mmptm.train.trainer import pretrain

    runs = {}
    for recipe in ("visualbert_tiny", "uniter_tiny", "lxmert_tiny"):
        runs[recipe] = tmp_path / recipe
        over = [*tiny_overrides(tiny_world, runs[recipe], recipe), "train.max_steps=1"]
        pretrain(load_run_config(recipe, over))
    scratch = "init_mode=architecture"
    visualbert = _vqa_config(tiny_world, runs["visualbert_tiny"], tmp_path / "a", scratch)
    uniter = _vqa_config(tiny_world, runs["uniter_tiny"], tmp_path / "b", scratch)
    assert run_key(visualbert) == run_key(uniter)  # UNITER adds pre-training heads only
    others = [
        _vqa_config(tiny_world, runs["lxmert_tiny"], tmp_path / "c", scratch),
        _vqa_config(tiny_world, runs["uniter_tiny"], tmp_path / "d", scratch, "seed=1"),
        _vqa_config(tiny_world, runs["uniter_tiny"], tmp_path / "e"),  # its weights
        _vqa_config(tiny_world, runs["visualbert_tiny"], tmp_path / "f"),
    ]
    keys = [run_key(c) for c in (visualbert, *others)]
    assert len(set(keys)) == len(keys)
    trained = {}
    for name, cfg in (("a", visualbert), ("b", uniter), ("e", others[2]), ("f", others[3])):
        pretrain(cfg)
        trained[name] = torch.load(tmp_path / name / "checkpoints" / "step_00000002.pt",
                                   map_location="cpu", weights_only=False)["model"]  # fmt: skip
    same = [torch.equal(trained["a"][k], trained["b"][k]) for k in trained["a"]]
    assert trained["a"].keys() == trained["b"].keys() and all(same)
    assert not all(torch.equal(trained["e"][k], trained["f"][k]) for k in trained["e"])


def test_an_evaluation_is_redone_only_when_its_inputs_change(tmp_path):
    from mmptm.studies.common import checkpoint_stamp, evaluated_once

    calls = []

    def evaluate(value):
        calls.append(value)
        return {"R@1": value, "rows": [1, 2]}

    run = tmp_path / "run" / "checkpoints"
    run.mkdir(parents=True)
    (run / "step_00000010.pt").write_bytes(b"x" * 10)
    inputs = {**checkpoint_stamp(tmp_path / "run"), "items": 500}
    assert inputs["checkpoint"].endswith("step_00000010.pt") and inputs["bytes"] == 10
    first = evaluated_once(tmp_path, "retrieval_a", inputs, lambda: evaluate(0.5))
    again = evaluated_once(tmp_path, "retrieval_a", dict(inputs), lambda: evaluate(0.7))
    assert first == again == {"R@1": 0.5, "rows": [1, 2]} and calls == [0.5]
    other = evaluated_once(tmp_path, "retrieval_a", {**inputs, "items": 100}, lambda: evaluate(0.6))
    assert other["R@1"] == 0.6 and calls == [0.5, 0.6]
    (run / "step_00000020.pt").write_bytes(b"y" * 12)  # the run trained on: another checkpoint
    later = {**checkpoint_stamp(tmp_path / "run"), "items": 100}
    assert later != {**inputs, "items": 100}
    assert evaluated_once(tmp_path, "retrieval_a", later, lambda: evaluate(0.8))["R@1"] == 0.8
    (tmp_path / "evaluations" / "retrieval_a.json").write_text("{not json")  # damaged
    assert evaluated_once(tmp_path, "retrieval_a", later, lambda: evaluate(0.9))["R@1"] == 0.9
    assert calls == [0.5, 0.6, 0.8, 0.9]
