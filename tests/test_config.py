"""Tests for the typed config system, against a small self-contained schema and registry."""

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from mmptm.config import (
    ConfigError,
    apply_overrides,
    component,
    components,
    from_dict,
    load_config,
    load_yaml_tree,
    save_config,
    to_dict,
)
from mmptm.registry import Registry

PARTS: Registry[Any] = Registry("encoder")


@PARTS.register("text")
class TextPart:
    @dataclass
    class Config:
        type: str = "text"
        width: int = 64
        vocab: str = "spm.model"


@PARTS.register("timm_image")
class ImagePart:
    @dataclass
    class Config:
        type: str = "timm_image"
        patch: int = 16
        model_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Train:
    max_steps: int
    lr: float = 1e-4
    precision: Literal["fp32", "bf16"] = "fp32"
    log_every: int | None = None
    compile: bool | str = False
    betas: tuple[float, ...] = (0.9, 0.999)


@dataclass
class Data:
    caption_languages: list[str] = field(default_factory=lambda: ["en"])
    weights: dict[str, float] = field(default_factory=dict)


@dataclass
class Model:
    encoders: dict[str, Any] = components(PARTS)
    head: Any = component(PARTS, default=None)
    fusion: Any = component(PARTS, default="text")


@dataclass
class Run:
    train: Train
    output_dir: str = "runs/default"
    model: Model = field(default_factory=Model)
    data: Data = field(default_factory=Data)
    extra: Any = None


@dataclass
class Quoted:
    """Annotations as strings, as under ``from __future__ import annotations``."""

    n: "int"
    names: "list[str] | None" = None


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def error(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    return str(info.value)


FULL = {
    "train": {"max_steps": 100, "lr": 3e-4, "precision": "bf16", "compile": "max-autotune"},
    "output_dir": "runs/x",
    "model": {
        "encoders": {
            "text": {"type": "text", "width": 128},
            "image": {"type": "timm_image", "model_kwargs": {"depth": 2}},
        },
        "head": {"type": "text"},
    },
    "data": {"caption_languages": ["en", "de"], "weights": {"cc3m": 1, "laion": 0.5}},
    "extra": {"anything": [1, {"goes": True}]},
}


# --- from_dict / to_dict -----------------------------------------------------------------------


def test_from_dict_builds_typed_tree() -> None:
    cfg = from_dict(Run, FULL)
    assert cfg.train == Train(max_steps=100, lr=3e-4, precision="bf16", compile="max-autotune")
    enc = cfg.model.encoders
    assert isinstance(enc["text"], TextPart.Config) and enc["text"].width == 128
    assert isinstance(enc["image"], ImagePart.Config) and enc["image"].model_kwargs == {"depth": 2}
    assert cfg.model.head == TextPart.Config()
    assert cfg.model.fusion == TextPart.Config()  # default given by part name
    assert cfg.data.weights == {"cc3m": 1.0, "laion": 0.5}
    assert isinstance(cfg.data.weights["cc3m"], float)
    assert cfg.extra == FULL["extra"] and cfg.extra is not FULL["extra"]  # Any is deep-copied


def test_defaults_and_optional() -> None:
    cfg = from_dict(Run, {"train": {"max_steps": 1, "log_every": None}})
    assert cfg.model.encoders == {} and cfg.model.head is None
    assert cfg.train.betas == (0.9, 0.999) and cfg.train.log_every is None
    cfg = from_dict(Run, {"train": {"max_steps": 1, "betas": [0.8, 1]}, "model": {"head": None}})
    assert cfg.train.betas == (0.8, 1.0) and cfg.model.head is None


def test_union_tries_members_in_order() -> None:
    assert from_dict(Train, {"max_steps": 1, "compile": True}).compile is True
    assert from_dict(Train, {"max_steps": 1, "compile": "true"}).compile == "true"
    msg = error(from_dict, Train, {"max_steps": 1, "compile": 3}, "train")
    assert "train.compile" in msg and "bool | str" in msg


def test_float_accepts_float_strings_but_int_does_not() -> None:
    assert from_dict(Train, {"max_steps": 1, "lr": "1e-3"}).lr == pytest.approx(1e-3)
    assert from_dict(Train, {"max_steps": 1, "lr": 2}).lr == 2.0
    msg = error(from_dict, Train, {"max_steps": 1, "lr": "fast"}, "train")
    assert "train.lr" in msg and "float" in msg and "'fast'" in msg
    msg = error(from_dict, Train, {"max_steps": "10"}, "train")
    assert "train.max_steps" in msg and "int" in msg and "'10'" in msg


def test_bool_is_not_an_int_or_float() -> None:
    msg = error(from_dict, Run, {"train": {"max_steps": True}})
    assert "train.max_steps" in msg and "expected int" in msg and "True" in msg
    assert "train.lr" in error(from_dict, Run, {"train": {"max_steps": 1, "lr": False}})


def test_wrong_type_errors_name_key_and_value() -> None:
    msg = error(from_dict, Run, {"train": {"max_steps": 1}, "output_dir": 5})
    assert "output_dir" in msg and "expected str" in msg and "5" in msg
    msg = error(from_dict, Run, {"train": {"max_steps": 1}, "data": {"caption_languages": "en"}})
    assert "data.caption_languages" in msg and "list[str]" in msg
    msg = error(
        from_dict, Run, {"train": {"max_steps": 1}, "data": {"caption_languages": ["en", 3]}}
    )
    assert "data.caption_languages[1]" in msg
    msg = error(from_dict, Run, {"train": {"max_steps": 1}, "data": {"weights": {"cc3m": "x"}}})
    assert "data.weights.cc3m" in msg
    msg = error(from_dict, Run, {"train": 3})
    assert "train" in msg and "mapping" in msg


def test_literal_error_lists_allowed_values() -> None:
    msg = error(from_dict, Run, {"train": {"max_steps": 1, "precision": "fp16"}})
    assert "train.precision" in msg and "'fp32'" in msg and "'bf16'" in msg and "'fp16'" in msg


def test_missing_required_key() -> None:
    assert "missing required key 'train.max_steps'" in error(from_dict, Run, {"train": {}})
    assert "'train'" in error(from_dict, Run, {})


def test_unknown_key_suggests_close_match() -> None:
    msg = error(from_dict, Run, {"train": {"max_step": 10}})
    assert "unknown key 'train.max_step'" in msg
    assert "did you mean 'train.max_steps'" in msg
    assert "known keys: max_steps, lr, precision" in msg


def test_unknown_component_key_is_checked_against_that_parts_config() -> None:
    data = {
        "train": {"max_steps": 1},
        "model": {"encoders": {"text": {"type": "text", "patch": 8}}},
    }
    msg = error(from_dict, Run, data)
    assert "model.encoders.text.patch" in msg and "width" in msg


def test_unknown_registry_name_lists_choices() -> None:
    data = {"train": {"max_steps": 1}, "model": {"encoders": {"image": {"type": "timm_imag"}}}}
    msg = error(from_dict, Run, data)
    assert "model.encoders.image.type" in msg
    assert "choices: text, timm_image" in msg and "did you mean 'timm_image'" in msg
    msg = error(from_dict, Run, {"train": {"max_steps": 1}, "model": {"head": {"width": 3}}})
    assert "model.head.type" in msg and "choices: text, timm_image" in msg
    msg = error(from_dict, Run, {"train": {"max_steps": 1}, "model": {"encoders": ["text"]}})
    assert "model.encoders" in msg


def test_string_annotations_are_resolved() -> None:
    assert from_dict(Quoted, {"n": 1, "names": ["a"]}) == Quoted(1, ["a"])
    assert "q.names[0]" in error(from_dict, Quoted, {"n": 1, "names": [1]}, "q")


def test_round_trip() -> None:
    cfg = from_dict(Run, FULL)
    plain = to_dict(cfg)
    assert plain["model"]["encoders"]["image"] == {
        "type": "timm_image",
        "patch": 16,
        "model_kwargs": {"depth": 2},
    }
    assert plain["train"]["betas"] == [0.9, 0.999]  # plain lists, not tuples
    assert from_dict(Run, plain) == cfg


# --- YAML inheritance --------------------------------------------------------------------------


def test_three_level_inheritance_deep_merges(tmp_path: Path) -> None:
    write(
        tmp_path / "base/root.yaml",
        """
train: {max_steps: 100, lr: 1.0e-4, precision: fp32}
data: {caption_languages: [en, de, fr], weights: {cc3m: 1.0}}
model:
  encoders:
    text: {type: text, width: 64}
    image: {type: timm_image, patch: 16, model_kwargs: {depth: 12, drop: 0.1}}
extra: {keep: 1}
""",
    )
    write(
        tmp_path / "base/mid.yaml",
        """
base: root.yaml
train: {lr: 3e-4}
model:
  encoders:
    image: {model_kwargs: {depth: 6}}
extra: null
""",
    )
    leaf = write(
        tmp_path / "runs/leaf.yaml",
        """
base: [../base/mid.yaml]
train: {max_steps: 10}
data: {caption_languages: [en]}
model:
  encoders:
    text: __delete__
    audio: __delete__
""",
    )
    tree = load_yaml_tree(leaf)
    assert "base" not in tree
    assert tree["train"] == {"max_steps": 10, "lr": "3e-4", "precision": "fp32"}
    assert tree["data"] == {"caption_languages": ["en"], "weights": {"cc3m": 1.0}}  # replaced
    assert tree["model"]["encoders"] == {
        "image": {"type": "timm_image", "patch": 16, "model_kwargs": {"depth": 6, "drop": 0.1}}
    }
    assert tree["extra"] is None  # null replaces a dict
    cfg = load_config(leaf, schema=Run)
    assert cfg.train.lr == pytest.approx(3e-4)
    assert list(cfg.model.encoders) == ["image"]


def test_delete_of_nothing_leaves_no_marker(tmp_path: Path) -> None:
    path = write(tmp_path / "a.yaml", "data: {weights: __delete__}\nextra: {x: __delete__}\n")
    assert load_yaml_tree(path) == {"data": {}, "extra": {}}


def test_inheritance_cycle_names_files(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", "base: b.yaml\n")
    write(tmp_path / "b.yaml", "base: c.yaml\n")
    write(tmp_path / "c.yaml", "base: a.yaml\n")
    msg = error(load_yaml_tree, tmp_path / "a.yaml")
    assert "cycle" in msg and "a.yaml" in msg and "b.yaml" in msg and "c.yaml" in msg


def test_diamond_inheritance_is_not_a_cycle(tmp_path: Path) -> None:
    write(tmp_path / "root.yaml", "train: {max_steps: 1}\n")
    write(tmp_path / "x.yaml", "base: root.yaml\noutput_dir: x\n")
    write(tmp_path / "y.yaml", "base: root.yaml\nextra: y\n")
    top = write(tmp_path / "top.yaml", "base: [x.yaml, y.yaml]\n")
    assert load_yaml_tree(top) == {"train": {"max_steps": 1}, "output_dir": "x", "extra": "y"}


def test_missing_file_and_syntax_errors_name_the_file(tmp_path: Path) -> None:
    msg = error(load_yaml_tree, tmp_path / "nope.yaml")
    assert "nope.yaml" in msg
    child = write(tmp_path / "child.yaml", "base: gone.yaml\n")
    assert "gone.yaml" in error(load_yaml_tree, child)
    bad = write(tmp_path / "bad.yaml", "train:\n  max_steps: 1\n  lr: [1, 2\n")
    msg = error(load_yaml_tree, bad)
    assert "bad.yaml:" in msg and "syntax" in msg
    assert "bad.yaml:4" in msg or "bad.yaml:3" in msg  # line of the problem
    scalar = write(tmp_path / "scalar.yaml", "- 1\n- 2\n")
    assert "scalar.yaml" in error(load_yaml_tree, scalar)


# --- overrides ---------------------------------------------------------------------------------


def test_overrides_types_nesting_and_lists() -> None:
    tree = {"train": {"max_steps": 100}, "model": {"encoders": {"image": {"type": "timm_image"}}}}
    out = apply_overrides(
        tree,
        [
            "train.max_steps=10",
            "train.compile=true",
            "train.log_every=null",
            "model.encoders.image.model_kwargs.depth=2",
            "output_dir=runs/x",
            "data.caption_languages=[en,de]",
            "model.encoders.text={type: text, width: 32}",
        ],
    )
    assert tree == {
        "train": {"max_steps": 100},
        "model": {"encoders": {"image": {"type": "timm_image"}}},
    }  # input untouched
    cfg = from_dict(Run, out)
    assert cfg.train.max_steps == 10 and cfg.train.compile is True and cfg.train.log_every is None
    assert cfg.model.encoders["image"].model_kwargs == {"depth": 2}
    assert cfg.model.encoders["text"] == TextPart.Config(width=32)
    assert cfg.output_dir == "runs/x"
    assert cfg.data.caption_languages == ["en", "de"]


def test_override_can_create_a_component_key() -> None:
    out = apply_overrides({"train": {"max_steps": 1}}, ["model.encoders.text.type=text"])
    assert from_dict(Run, out).model.encoders == {"text": TextPart.Config()}


def test_malformed_override() -> None:
    assert "'train.max_steps'" in error(apply_overrides, {}, ["train.max_steps"])
    assert "'=3'" in error(apply_overrides, {}, ["=3"])
    msg = error(apply_overrides, {"output_dir": "x"}, ["output_dir.sub=1"])
    assert "output_dir" in msg and "not a mapping" in msg


def test_override_of_unknown_key_fails_in_validation(tmp_path: Path) -> None:
    path = write(tmp_path / "run.yaml", "train: {max_steps: 5}\n")
    msg = error(load_config, path, ["train.max_step=3"], schema=Run)
    assert str(path) in msg and "train.max_step" in msg and "did you mean 'train.max_steps'" in msg
    msg = error(load_config, path, ["model.encoders.image.model_kwargs.depth=2"], schema=Run)
    assert "model.encoders.image.type" in msg  # created without a type


def test_load_config_errors_name_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "run.yaml", "train: {max_steps: ten}\n")
    msg = error(load_config, path, schema=Run)
    assert str(path) in msg and "train.max_steps" in msg and "'ten'" in msg


# --- saving ------------------------------------------------------------------------------------


def test_save_then_load_gives_the_same_config(tmp_path: Path) -> None:
    cfg = from_dict(Run, FULL)
    out = tmp_path / "out" / "config.yaml"
    save_config(cfg, out)
    assert load_config(out, schema=Run) == cfg
    assert out.read_text().startswith("train:")  # field order kept, not sorted
    assert [p.name for p in out.parent.iterdir()] == ["config.yaml"]  # no temp file left
    assert os.stat(out).st_mode & 0o777 == 0o644


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_saved_files_follow_the_umask_and_stale_temporaries_go(tmp_path: Path, umask) -> None:
    from mmptm.io import remove_temporaries, write_atomic

    out = tmp_path / "config.yaml"
    stale = tmp_path / ".config.yaml.1234abcd.tmp"  # a writer killed before its rename
    stale.write_text("half")
    old = os.umask(umask)
    try:
        save_config(from_dict(Run, FULL), out)
        write_atomic(tmp_path / "blob.bin", lambda f: f.write(b"x"))
    finally:
        os.umask(old)
    assert os.stat(out).st_mode & 0o777 == 0o666 & ~umask
    assert os.stat(tmp_path / "blob.bin").st_mode & 0o777 == 0o666 & ~umask
    assert remove_temporaries(out) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob.bin", "config.yaml"]


def test_save_overwrites_atomically(tmp_path: Path) -> None:
    out = write(tmp_path / "config.yaml", "old")
    cfg = dataclasses.replace(from_dict(Run, FULL), output_dir="runs/new")
    save_config(cfg, out)
    assert load_config(out, schema=Run).output_dir == "runs/new"


def test_a_component_of_another_type_replaces_the_inherited_one(tmp_path):
    (tmp_path / "base.yaml").write_text(
        "fusion: {type: single_stream, transformer: {layers: 4}, pooler: true}\n"
        "keep: {type: a, x: 1}\n"
    )
    (tmp_path / "child.yaml").write_text(
        "base: base.yaml\nfusion: {type: two_stream, variant: lxmert}\nkeep: {x: 2}\n"
    )
    tree = load_yaml_tree(tmp_path / "child.yaml")
    assert tree["fusion"] == {"type": "two_stream", "variant": "lxmert"}  # nothing inherited
    assert tree["keep"] == {"type": "a", "x": 2}  # same (or unnamed) type: merged


# --- ranges ------------------------------------------------------------------------------------


def test_bounded_fields_name_the_key_and_the_range() -> None:
    from mmptm.config import bounded

    @dataclass
    class Opt:
        every: int = bounded(10, ge=1)
        ratio: float = bounded(0.5, ge=0, le=1)
        eps: float = bounded(1e-6, gt=0)

    @dataclass
    class Top:
        opt: Opt = field(default_factory=Opt)

    assert from_dict(Top, {"opt": {"every": 1, "ratio": 1, "eps": 1e-9}}).opt.every == 1
    assert error(from_dict, Top, {"opt": {"every": 0}}) == "opt.every: must be >= 1, got 0"
    assert "opt.ratio: must be >= 0 and <= 1, got 1.5" in error(
        from_dict, Top, {"opt": {"ratio": 1.5}}
    )
    assert "opt.eps: must be > 0, got 0.0" in error(from_dict, Top, {"opt": {"eps": 0}})
