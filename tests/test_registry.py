"""Registry: double registration, Config requirement, unknown names, the built-in parts."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import mmptm.encoders
import mmptm.fusion
import mmptm.objectives  # noqa: F401  (registers the parts)
from mmptm.registry import (
    ENCODERS,
    FUSIONS,
    OBJECTIVES,
    Commands,
    Registry,
    RegistryError,
    default_of,
)


def _registry_with_parts() -> Registry:
    reg: Registry = Registry("widget")

    @reg.register("alpha")
    class Alpha:
        @dataclass
        class Config:
            type: str = "alpha"
            size: int = 3

        def __init__(self, cfg, **context):
            self.cfg = cfg
            self.context = context

    @reg.register("beta")
    class Beta:
        @dataclass
        class Config:
            type: str = "beta"

    return reg


def test_register_get_and_build() -> None:
    reg = _registry_with_parts()
    assert reg.names() == ["alpha", "beta"]
    assert "alpha" in reg and "gamma" not in reg
    alpha_cls = reg.get("alpha")
    assert alpha_cls.registry_name == "alpha"
    assert reg.config_class("alpha") is alpha_cls.Config
    part = reg.build(alpha_cls.Config(size=7), width=5)
    assert isinstance(part, alpha_cls)
    assert part.cfg.size == 7
    assert part.context == {"width": 5}


def test_register_twice_raises() -> None:
    reg = _registry_with_parts()
    with pytest.raises(ValueError, match="'alpha' is registered twice"):

        @reg.register("alpha")
        class Other:
            @dataclass
            class Config:
                type: str = "alpha"

    # the first registration is untouched
    assert reg.get("alpha").__name__ == "Alpha"


def test_class_without_config_dataclass_raises() -> None:
    reg: Registry = Registry("widget")
    with pytest.raises(TypeError, match="needs a Config dataclass"):

        @reg.register("bare")
        class Bare:
            pass

    with pytest.raises(TypeError, match="needs a Config dataclass"):

        @reg.register("plain")
        class Plain:
            class Config:  # not a dataclass
                type: str = "plain"

    assert reg.names() == []


def test_unknown_name_lists_choices_and_suggests() -> None:
    reg = _registry_with_parts()
    with pytest.raises(RegistryError) as info:
        reg.get("alpah", where="model.encoders.x")
    msg = str(info.value)
    assert "unknown widget 'alpah'" in msg
    assert "at 'model.encoders.x'" in msg
    assert "did you mean 'alpha'?" in msg
    assert "choices: alpha, beta" in msg
    # a RegistryError is a KeyError, so callers catching KeyError still see it
    assert isinstance(info.value, KeyError)


def test_unknown_name_without_close_match_has_no_hint() -> None:
    reg = _registry_with_parts()
    with pytest.raises(RegistryError) as info:
        reg.config_class("zzzzzzzz")
    msg = str(info.value)
    assert "did you mean" not in msg
    assert "choices: alpha, beta" in msg


def test_builtin_parts_are_registered() -> None:
    assert {"text", "timm_image"} <= set(ENCODERS.names())
    assert {"single_stream", "dual"} <= set(FUSIONS.names())
    assert {"mlm", "itm", "contrastive"} <= set(OBJECTIVES.names())
    for reg in (ENCODERS, FUSIONS, OBJECTIVES):
        for name in reg.names():
            cfg = reg.config_class(name)()
            assert cfg.type == name, f"{reg.kind} {name!r} has Config.type {cfg.type!r}"


def test_commands_are_listed_by_name_and_registered_once() -> None:
    commands = Commands("widget command", ())

    @commands.register("zeta", "the last", lambda p: None)
    def zeta(args) -> int:
        return 0

    commands.register("alpha", "the first", lambda p: None)(lambda args: 1)
    assert [(c.name, c.summary) for c in commands] == [("alpha", "the first"), ("zeta", "the last")]
    assert next(iter(commands)).run(None) == 1 and zeta(None) == 0  # the function is kept
    with pytest.raises(ValueError, match="'zeta' is registered twice"):
        commands.register("zeta", "again", lambda p: None)(zeta)


def test_default_of_reads_a_signature_or_a_dataclass() -> None:
    @dataclass
    class Settings:
        size: int = 3

    def fit(data, *, iters: int = 100, seed=None) -> None: ...

    assert default_of(fit, "iters") == 100 and default_of(fit, "seed") is None
    assert default_of(Settings, "size") == 3
    with pytest.raises(TypeError, match="'data' has no default"):
        default_of(fit, "data")
