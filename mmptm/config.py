"""Typed run configs: YAML recipes with inheritance and overrides, validated into dataclasses.

Recipes are named (``clip_tiny``) or given by path; a name is looked up in the user's recipe
folders, then in those that ship inside the package (:func:`find_recipe`).

A schema is a tree of dataclasses. Plain fields are checked against their annotations; fields
declared with :func:`component` / :func:`components` hold the ``Config`` dataclass of whichever
registered part their ``type`` key names, so each part validates its own keys.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import os
import re
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml

from mmptm.io import write_atomic
from mmptm.registry import Registry, RegistryError

T = TypeVar("T")

DELETE = "__delete__"
"""A YAML value that removes the inherited key instead of setting it."""

_MISSING: Any = dataclasses.MISSING


class ConfigError(ValueError):
    """An invalid config; the message names the dotted key and, when known, the file."""


# ---------------------------------------------------------------------------------------------
# Schema declaration helpers


def component(registry: Registry[Any], default: Any = _MISSING) -> Any:
    """Declare a field holding one part's ``Config``, chosen by the ``type`` key of its dict.

    ``default`` may be omitted (required), ``None``, a part name (that part's default Config),
    a mapping, or a Config instance.
    """
    meta = {"registry": registry}
    if default is _MISSING or default is None:
        return dataclasses.field(default=default, metadata=meta)
    if isinstance(default, str):
        default = {"type": default}
    if isinstance(default, Mapping):
        # Built lazily: parts are usually registered after the schema module is imported.
        frozen = copy.deepcopy(dict(default))
        factory = functools.partial(_convert_component, registry, frozen, registry.kind)
        return dataclasses.field(default_factory=factory, metadata=meta)
    if dataclasses.is_dataclass(default) and not isinstance(default, type):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    raise TypeError(f"component default must be None, a name, a mapping or a Config: {default!r}")


def bounded(
    default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None
) -> Any:
    """Declare a number field with bounds, checked on loading: ``log_every: int = bounded(10,
    ge=1)``. A value outside them is an error naming the dotted key and the range."""
    return dataclasses.field(default=default, metadata={"bounds": (ge, gt, le)})


def components(registry: Registry[Any], *, keyed: bool = False) -> Any:
    """Declare a ``dict[str, <part Config>]`` field (e.g. encoders by modality), default empty.

    ``keyed``: each key names its part (``type`` may be left out), e.g. ``data.modalities``.
    """
    meta = {"registry": registry, "many": True, "keyed": keyed}
    return dataclasses.field(default_factory=dict, metadata=meta)


# ---------------------------------------------------------------------------------------------
# Validation


def _join(where: str, key: object) -> str:
    return f"{where}.{key}" if where else str(key)


def _show(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (typing.Union, types.UnionType)


def _type_name(tp: Any) -> str:
    if tp is type(None) or tp is None:
        return "None"
    if tp is Any:
        return "Any"
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if _is_union(tp):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else _type_name(a) for a in args)
        return f"{getattr(origin, '__name__', origin)}[{inner}]"
    if dataclasses.is_dataclass(tp):
        return f"a mapping ({tp.__name__})"
    return getattr(tp, "__name__", repr(tp))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_dict(cls: type[T], data: Mapping[str, Any], where: str = "") -> T:
    """Validate a plain mapping (parsed YAML) against dataclass ``cls`` and build an instance."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"from_dict needs a dataclass type, got {cls!r}")
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or '<config>'}: expected a mapping, got {_show(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields:
            near = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean '{_join(where, near[0])}'?)" if near else ""
            known = ", ".join(fields) or "none"
            raise ConfigError(f"unknown key '{_join(where, key)}'{hint}; known keys: {known}")
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        key = _join(where, name)
        if name not in data:
            if f.default is _MISSING and f.default_factory is _MISSING:
                raise ConfigError(f"missing required key '{key}'")
            continue
        value = data[name]
        registry = f.metadata.get("registry")
        if registry is None:
            kwargs[name] = _convert(hints[name], value, key)
            if "bounds" in f.metadata:
                _check_bounds(kwargs[name], f.metadata["bounds"], key)
        elif f.metadata.get("many"):
            if not isinstance(value, Mapping):
                raise ConfigError(
                    f"{key}: expected a mapping of {registry.kind}s, got {_show(value)}"
                )
            keyed = f.metadata.get("keyed")
            kwargs[name] = {
                k: _convert_component(registry, _typed(k, v) if keyed else v, _join(key, k))
                for k, v in value.items()
            }
        elif value is None and f.default is None:
            kwargs[name] = None
        else:
            kwargs[name] = _convert_component(registry, value, key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as e:  # __post_init__ checks
        raise ConfigError(f"{where or cls.__name__}: {e}") from e


def _check_bounds(value: Any, bounds: tuple[Any, Any, Any], key: str) -> None:
    ge, gt, le = bounds
    checks = [(ge, ">=", lambda lo: value >= lo), (gt, ">", lambda lo: value > lo),
              (le, "<=", lambda hi: value <= hi)]  # fmt: skip
    if value is not None and not all(ok(b) for b, _, ok in checks if b is not None):
        allowed = " and ".join(f"{op} {b}" for b, op, _ in checks if b is not None)
        raise ConfigError(f"{key}: must be {allowed}, got {value!r}")


def _typed(key: str, value: Any) -> Any:
    """A keyed component's mapping with ``type`` defaulting to its key."""
    if isinstance(value, Mapping) and "type" not in value:
        return {"type": key, **value}
    if value is None:  # `image:` alone in YAML: the part's defaults
        return {"type": key}
    return value


def _convert_component(registry: Registry[Any], value: Any, where: str) -> Any:
    """Build the Config of the part named by ``value['type']``."""
    choices = ", ".join(registry.names())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = to_dict(value)
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{where}: expected a mapping with a 'type' key ({registry.kind}: {choices}), "
            f"got {_show(value)}"
        )
    name = value.get("type")
    if not isinstance(name, str):
        what = "missing" if name is None else f"must be a string, got {_show(name)}"
        raise ConfigError(f"{where}.type: {registry.kind} type {what}; choices: {choices}")
    try:
        cfg_cls = registry.config_class(name)
    except RegistryError as e:
        raise ConfigError(f"{where}.type: {e}") from None
    return from_dict(cfg_cls, value, where)


def _convert(tp: Any, value: Any, where: str, lenient: bool = True) -> Any:
    """Check ``value`` against annotation ``tp``; ``lenient`` allows float strings for floats."""
    if tp is Any:
        return copy.deepcopy(value)
    if tp is None or tp is type(None):
        if value is None:
            return None
    elif _is_union(tp):
        members = get_args(tp)
        if value is None and type(None) in members:
            return None
        options = [m for m in members if m is not type(None)]
        if len(options) == 1:  # Optional[X]: let X report its own, more precise error
            return _convert(options[0], value, where, lenient)
        # Exact matches win over coercions, so `float | str` keeps "1e-3" a string.
        for strict_pass in (True, False) if lenient else (True,):
            for member in options:
                try:
                    return _convert(member, value, where, lenient=not strict_pass)
                except ConfigError:
                    pass
    elif get_origin(tp) is Literal:
        if any(type(value) is type(a) and value == a for a in get_args(tp)):
            return value
    elif tp in (list, tuple, dict) or get_origin(tp) in (list, tuple, dict):
        return _convert_container(tp, value, where, lenient)
    elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return copy.deepcopy(value)
        if isinstance(value, Mapping):
            return from_dict(tp, value, where)
    elif tp is bool or tp is str:
        if type(value) is tp:
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        # PyYAML reads `1e-3` (no dot) as a string; users write it constantly.
        if lenient and isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    else:
        raise TypeError(f"{where}: unsupported field type {tp!r} in the config schema")
    raise ConfigError(f"{where}: expected {_type_name(tp)}, got {_show(value)}")


def _convert_container(tp: Any, value: Any, where: str, lenient: bool) -> Any:
    origin = get_origin(tp) or tp
    args = get_args(tp)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected {_type_name(tp)}, got {_show(value)}")
        key_tp, val_tp = args or (Any, Any)
        return {
            _convert(key_tp, k, where, lenient=False): _convert(val_tp, v, _join(where, k), lenient)
            for k, v in value.items()
        }
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {_show(value)}")
    if origin is list:
        item = args[0] if args else Any
        return [_convert(item, v, f"{where}[{i}]", lenient) for i, v in enumerate(value)]
    if not args or (len(args) == 2 and args[1] is Ellipsis):
        item = args[0] if args else Any
        return tuple(_convert(item, v, f"{where}[{i}]", lenient) for i, v in enumerate(value))
    if len(args) != len(value):
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {_show(value)}")
    return tuple(
        _convert(a, v, f"{where}[{i}]", lenient) for i, (a, v) in enumerate(zip(args, value))
    )


def to_dict(cfg: Any) -> Any:
    """Turn a config (or any part of one) into plain nested dicts and lists."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.init}
    if isinstance(cfg, Mapping):
        return {k: to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    return copy.deepcopy(cfg)


# ---------------------------------------------------------------------------------------------
# YAML files, inheritance and overrides


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``over`` onto ``base``: dicts key by key, anything else replaces; honours DELETE.

    A dict naming another ``type`` than the inherited one replaces it whole: the keys of a
    different part (e.g. a single-stream fusion's ``transformer``) do not carry over.
    """
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, str) and value == DELETE:
            out.pop(key, None)
        elif isinstance(value, Mapping):
            # Also merges onto {} when nothing is inherited, to strip nested DELETE markers.
            prev = out.get(key)
            if not isinstance(prev, Mapping) or prev.get("type", value.get("type")) != value.get(
                "type", prev.get("type")
            ):
                prev = {}
            out[key] = deep_merge(prev, value)
        else:
            out[key] = value
    return out


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        line = e.object.count(b"\n", 0, e.start) + 1
        bad = e.object[e.start : e.end].hex()
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte 0x{bad} at offset {e.start}); "
            "save the file as UTF-8"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{path}{at}: YAML syntax error: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {_show(data)}")
    return data


def load_yaml_tree(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a YAML recipe, by name or path (:func:`find_recipe`), and, recursively, the
    recipes its top-level ``base:`` key names (names, or paths relative to the file)."""
    return _load_tree(find_recipe(path), ())


def _load_tree(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    resolved = path.resolve()
    if resolved in chain:
        _cycle(path, (*chain, resolved))
    data = _read_yaml(path)
    bases = data.pop("base", None)
    if bases is None:
        bases = []
    elif isinstance(bases, str):
        bases = [bases]
    elif not (isinstance(bases, list) and all(isinstance(b, str) for b in bases)):
        raise ConfigError(
            f"{path}: base: expected a recipe name or path, or a list of them, got {_show(bases)}"
        )
    merged: dict[str, Any] = {}
    for base in bases:
        file = find_recipe(base, folder=path.parent, skip=(*chain, resolved))
        merged = deep_merge(merged, _load_tree(file, (*chain, resolved)))
    return deep_merge(merged, data)


def _cycle(path: Path, chain: tuple[Path, ...]) -> typing.NoReturn:
    start = chain.index(chain[-1])
    cycle = " -> ".join(str(p) for p in chain[start:])
    raise ConfigError(f"{path}: config inheritance cycle: {cycle}")


# ---------------------------------------------------------------------------------------------
# Recipes by name: the search path

#: the recipes that ship with mmptm (package data), looked up after the user's folders
PACKAGE_RECIPES = Path(__file__).resolve().parent / "recipes"
#: the environment variable that lists folders of the user's recipes (``os.pathsep`` apart)
RECIPE_PATH_ENV = "MMPTM_RECIPE_PATH"
YAML_SUFFIXES = (".yaml", ".yml")
_ADDED_DIRS: list[Path] = []  # add_recipe_dir's folders, the latest first
_NAME = re.compile(r"[\w-][\w.-]*(/[\w-][\w.-]*)?")  # no path: no "..", no "a/b/c"


def add_recipe_dir(path: str | os.PathLike[str]) -> Path:
    """Look recipe names up in the folder ``path`` (its YAML files and those one folder down),
    before the folders added earlier, those of ``MMPTM_RECIPE_PATH`` and the package's.
    Returns the folder, resolved; ``ConfigError`` if it is no folder."""
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise ConfigError(f"{path}: no such folder of recipes")
    if folder in _ADDED_DIRS:
        _ADDED_DIRS.remove(folder)
    _ADDED_DIRS.insert(0, folder)
    return folder


def recipe_dirs() -> list[Path]:
    """Where recipe names are looked up, in order (the first match wins): the folders given to
    :func:`add_recipe_dir` (the latest first), those of ``MMPTM_RECIPE_PATH``, the package's."""
    env = os.environ.get(RECIPE_PATH_ENV, "")
    return [*_ADDED_DIRS, *(Path(p).expanduser() for p in env.split(os.pathsep) if p),
            PACKAGE_RECIPES]  # fmt: skip


def _yaml_files(folder: Path, stem: str = "*") -> list[Path]:
    """``folder``'s YAML files named ``stem``, then those one folder down."""
    found = [p for pattern in (stem, f"*/{stem}") for p in sorted(folder.glob(pattern + ".y*ml"))]
    return [p for p in found if p.suffix in YAML_SUFFIXES and p.is_file()]


def recipe_files() -> dict[str, Path]:
    """Every recipe on the search path by name (a file's stem; the first folder that has it
    wins). Files whose name starts with ``_`` are shared bases, not listed (``base:`` names
    them all the same)."""
    found: dict[str, Path] = {}
    for folder in recipe_dirs():
        for path in _yaml_files(folder):
            if not path.stem.startswith("_"):
                found.setdefault(path.stem, path)
    return found


def find_recipe(
    spec: str | os.PathLike[str], *, folder: Path | None = None, skip: Iterable[Path] = ()
) -> Path:
    """The YAML file a recipe name or path means.

    A ``Path``, or a string that names an existing file, ends in ``.yaml`` / ``.yml`` or is no
    name, is a path: relative to ``folder`` if given (a ``base:`` is relative to the file that
    names it), else to the working directory. A name is ``clip_tiny``, or with its folder
    ``pretrain/clip_tiny``: looked up beside ``folder``, then in :func:`recipe_dirs`. Files in
    ``skip`` (those being loaded) are passed over, so a user's ``clip_tiny.yaml`` may extend
    the package's with ``base: clip_tiny``. An unknown name is a one-line ``ConfigError``
    with the nearest names.
    """
    here = Path(folder or "") / spec
    if here.is_file():
        return here
    if isinstance(spec, str) and _NAME.fullmatch(spec) and not spec.endswith(YAML_SUFFIXES):
        return _named(spec, folder, tuple(skip))
    if here.stem in recipe_files():  # e.g. configs/pretrain/x.yaml, where recipes were
        raise ConfigError(f"{here}: no such file; a recipe {here.stem!r} ships with mmptm: name it")
    return here  # _read_yaml says why it cannot be read


def _named(name: str, folder: Path | None, skip: tuple[Path, ...]) -> Path:
    matches: list[Path] = []
    if folder is not None:  # a base beside the file that names it
        matches += [p for p in (folder / f"{name}{s}" for s in YAML_SUFFIXES) if p.is_file()]
    for where in recipe_dirs():
        found = _yaml_files(where, name) if where.is_dir() else []
        if len(found) > 1:
            raise ConfigError(
                f"recipe {name!r} is ambiguous in {where}: {', '.join(map(str, found))}; name "
                "it with its folder or by path"
            )
        matches += found
    for path in matches:
        if path.resolve() not in skip:
            return path
    if matches:  # every match is being loaded: e.g. a recipe whose base is its own name
        _cycle(matches[0], (*skip, matches[0].resolve()))
    raise ConfigError(_unknown(name))


def _unknown(spec: str) -> str:
    """The one-line error of an unknown recipe name: the nearest names, missing folders."""
    names = list(recipe_files())
    near = difflib.get_close_matches(spec.rpartition("/")[2], names, n=3, cutoff=0.5)
    hint = f"; nearest: {', '.join(near)}" if near else ""
    missing = [str(d) for d in recipe_dirs() if not d.is_dir()]
    gone = f"; no such folder on the recipe path: {', '.join(missing)}" if missing else ""
    return f"unknown recipe {spec!r} (no such file either){hint}{gone}; `mmptm recipes` lists them"


def apply_overrides(tree: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``dotted.key=value`` overrides (values parsed as YAML) to a copy of ``tree``."""
    out = copy.deepcopy(dict(tree))
    for item in overrides:
        key, sep, raw = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise ConfigError(f"malformed override {item!r}: expected dotted.key=value")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: cannot parse value: {e}") from None
        node: Any = out
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise ConfigError(f"override {item!r}: '{where}' is {_show(child)}, not a mapping")
            node = child
        if isinstance(value, str) and value == DELETE:
            node.pop(parts[-1], None)
        else:
            node[parts[-1]] = value
    return out


def load_config(
    path: str | os.PathLike[str], overrides: Iterable[str] = (), *, schema: type[T]
) -> T:
    """Load a recipe (with its bases), apply overrides and validate it into ``schema``."""
    tree = load_yaml_tree(path)
    try:
        return from_dict(schema, apply_overrides(tree, overrides))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def save_config(cfg: Any, path: str | os.PathLike[str]) -> None:
    """Write ``cfg`` as YAML that :func:`load_config` reads back; atomic, so never half-written."""
    text = yaml.safe_dump(to_dict(cfg), sort_keys=False, allow_unicode=True)
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))


__all__ = [
    "DELETE",
    "PACKAGE_RECIPES",
    "RECIPE_PATH_ENV",
    "ConfigError",
    "add_recipe_dir",
    "apply_overrides",
    "bounded",
    "component",
    "components",
    "deep_merge",
    "find_recipe",
    "from_dict",
    "load_config",
    "load_yaml_tree",
    "recipe_dirs",
    "recipe_files",
    "save_config",
    "to_dict",
]
