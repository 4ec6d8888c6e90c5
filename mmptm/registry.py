"""One registry mechanism shared by every plug point (modalities, encoders, fusion, objectives).

A registered part is a class with a nested ``Config`` dataclass whose first field is
``type: str``. Recipes name parts by that string; the config loader validates the part's keys
against its ``Config`` and the part is built with ``Part(cfg, **context)``.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import pkgutil
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown name was asked of a registry."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class Registry(Generic[T]):
    """Maps names to part classes that carry a ``Config`` dataclass."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._parts: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        def deco(cls: type[T]) -> type[T]:
            if name in self._parts:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            cfg_cls = getattr(cls, "Config", None)
            if cfg_cls is None or not dataclasses.is_dataclass(cfg_cls):
                raise TypeError(f"{self.kind} {name!r}: {cls.__name__} needs a Config dataclass")
            self._parts[name] = cls
            cls.registry_name = name  # type: ignore[attr-defined]
            return cls

        return deco

    def names(self) -> list[str]:
        return sorted(self._parts)

    def get(self, name: str, where: str = "") -> type[T]:
        if name not in self._parts:
            near = difflib.get_close_matches(name, self._parts, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            at = f" at '{where}'" if where else ""
            raise RegistryError(
                f"unknown {self.kind} {name!r}{at}{hint}; choices: {', '.join(self.names())}"
            )
        return self._parts[name]

    def config_class(self, name: str, where: str = "") -> type:
        return self.get(name, where).Config  # type: ignore[attr-defined]

    def build(self, cfg: Any, **context: Any) -> T:
        return self.get(cfg.type)(cfg, **context)

    def __contains__(self, name: object) -> bool:
        return name in self._parts


ENCODERS: Registry[Any] = Registry("encoder")
FUSIONS: Registry[Any] = Registry("fusion")
OBJECTIVES: Registry[Any] = Registry("objective")
MODALITIES: Registry[Any] = Registry("modality")


def import_all(package: str, path: Iterable[str]) -> None:
    """Import every module of a plug-point package, so that each registers its parts.

    A new part is then one new file in the package's folder; nothing else names it.
    """
    for info in sorted(pkgutil.iter_modules(list(path)), key=lambda i: i.name):
        importlib.import_module(f"{package}.{info.name}")
