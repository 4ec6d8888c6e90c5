"""One registry mechanism shared by every plug point (modalities, encoders, fusion, objectives).

A registered part is a class with a nested ``Config`` dataclass whose first field is
``type: str``. Recipes name parts by that string; the config loader validates the part's keys
against its ``Config`` and the part is built with ``Part(cfg, **context)``.

Command-line sub-commands that plug in the same way (``mmptm data NAME``: one per converter)
register in :class:`Commands`, as a parser and the function it runs.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import json
import pkgutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")
Run = TypeVar("Run", bound=Callable[..., int])


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


@dataclasses.dataclass(frozen=True)
class Command:
    """A command-line sub-command, declared in the module that does its work."""

    name: str
    summary: str  #: one line, listed in the group's --help
    add_arguments: Callable[[Any], None]  #: (argparse.ArgumentParser) -> None
    run: Callable[[Any], int]  #: (argparse.Namespace) -> exit status


class Commands:
    """The sub-commands of one command group, registered by the modules that implement them.

    Unlike a :class:`Registry` of parts (built from a recipe's ``Config``), an entry here is a
    parser and the function it runs: the CLI adds a sub-parser per entry, so a new command is
    one registered function in its own module and nothing else names it. The packages that
    define entries are imported on the first lookup.
    """

    def __init__(self, kind: str, packages: tuple[str, ...]) -> None:
        self.kind = kind
        self.packages = packages
        self._loaded = False
        self._commands: dict[str, Command] = {}

    def register(
        self, name: str, summary: str, add_arguments: Callable[[Any], None]
    ) -> Callable[[Run], Run]:
        """Decorate the function a command runs; ``add_arguments`` adds its flags to a parser."""

        def deco(run: Run) -> Run:
            if name in self._commands:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._commands[name] = Command(name, summary, add_arguments, run)
            return run

        return deco

    def register_writer(
        self, name: str, summary: str, write: Callable[..., Any], flags: tuple[str, ...],
        example: str, helps: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        """Register ``write(out, **flags)`` as a command: ``--out`` plus a flag per keyword of
        ``flags``, typed and defaulted by ``write``'s signature (an int, float or str; a
        tuple or list: a comma list), ``helps`` its help texts; it prints what ``write``
        returns as json."""

        def add_arguments(p: Any) -> None:
            p.add_argument("--out", required=True, help=f"e.g. {example}")
            for key in flags:
                default = default_of(write, key)
                listed = isinstance(default, (tuple, list))
                p.add_argument(
                    "--" + key.replace("_", "-"), type=comma_list if listed else type(default),
                    default=tuple(default) if listed else default,
                    help=(helps or {}).get(key, "comma list" if listed else None),
                )  # fmt: skip

        def run(args: Any) -> int:
            stats = write(args.out, **{key: getattr(args, key) for key in flags})
            print(json.dumps(stats, indent=1))
            return 0

        self.register(name, summary, add_arguments)(run)

    def __iter__(self) -> Iterator[Command]:
        """The commands in the order of their names."""
        if not self._loaded:
            self._loaded = True
            for package in self.packages:
                import_all(package, importlib.import_module(package).__path__)
        return iter(sorted(self._commands.values(), key=lambda c: c.name))


#: ``mmptm data NAME``: the converters (one module per format family) and toyworld's generator
CONVERTERS = Commands("data command", ("mmptm.converters", "mmptm.toyworld"))


def comma_list(text: str) -> tuple[str, ...]:
    """A command-line comma list: ``"de, fr,"`` → ``("de", "fr")``."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def default_of(fn: Callable[..., Any], name: str) -> Any:
    """The default of ``fn``'s parameter ``name``, so that a command-line flag states it once.

    ``fn`` is a function or a dataclass (its fields are ``__init__``'s parameters).
    """
    default = inspect.signature(fn).parameters[name].default
    if default is inspect.Parameter.empty:
        raise TypeError(f"{fn.__qualname__}: parameter {name!r} has no default")
    return default
