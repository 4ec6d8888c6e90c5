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

    def __init__(self, kind: str, package: str = "") -> None:
        self.kind = kind
        #: the plug-point package whose modules define the built-in parts: imported (every
        #: module of it) on the first lookup, so importing one part does not import all
        self.package = package
        self._loaded = not package
        self._parts: dict[str, type[T]] = {}

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            pkg = importlib.import_module(self.package)
            import_all(self.package, pkg.__path__)

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
        self._load()
        return sorted(self._parts)

    def get(self, name: str, where: str = "") -> type[T]:
        self._load()
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
        self._load()
        return name in self._parts


MODALITIES: Registry[Any] = Registry("modality", "mmptm.modalities")
ENCODERS: Registry[Any] = Registry("encoder", "mmptm.encoders")
FUSIONS: Registry[Any] = Registry("fusion", "mmptm.fusion")
OBJECTIVES: Registry[Any] = Registry("objective", "mmptm.objectives")


def import_all(package: str, path: Iterable[str]) -> None:
    """Import every module of a plug-point package, so that each registers its parts.

    A new part is then one new file in the package's folder; nothing else names it.
    (Registries call this on their first lookup.)
    """
    for info in sorted(pkgutil.iter_modules(list(path)), key=lambda i: i.name):
        importlib.import_module(f"{package}.{info.name}")
