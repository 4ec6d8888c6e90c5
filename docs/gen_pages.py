"""Generate what the documentation must not keep by hand; run by mkdocs-gen-files at build time.

Nothing this writes is committed. A page asks for generated content with a marker line:

- ``<!-- results: NAME -->``: the table of ``docs/results/NAME.yaml`` with the command, date and
  hardware that produced it;
- ``<!-- recipes: FAMILY -->``: a card per recipe of the family (its parts, what it reproduces,
  the result tables that name it); ``<!-- recipes: all -->``: one table of every recipe;
- ``<!-- parts: KIND -->``: every registered part of a plug point (``modality``, ``encoder``,
  ``fusion``, ``objective``) or the recipe's own sections (``recipe``), every key with its
  type, default and doc (the ``#:`` comment above the field);
- ``<!-- floors -->``: the floors of the house, from pyproject's import-linter layers;
- ``<!-- converters -->``: the ``mmptm data`` commands with their options.

It also writes ``benchmarks/index.md`` and ``benchmarks/results.md`` from ``benchmarks/``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import os
import posixpath
import re
import textwrap
import typing
from pathlib import Path
from typing import Any

import mkdocs_gen_files
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from mmptm import config
from mmptm.recipe import (
    DataConfig,
    ModelConfig,
    RecipeInfo,
    Reference,
    RunConfig,
    SourceConfig,
    TrainConfig,
    list_recipes,
    load_recipe,
    recipe_kind,
    recipe_path,
)
from mmptm.registry import CONVERTERS, ENCODERS, FUSIONS, MODALITIES, OBJECTIVES

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MARKER = re.compile(
    r"^( *)<!-- (results|recipes|parts|floors|converters)(?:: ([a-z0-9_-]+))? -->$", re.M
)
PLUG_POINTS = {
    "modality": MODALITIES,
    "encoder": ENCODERS,
    "fusion": FUSIONS,
    "objective": OBJECTIVES,
}
FAMILIES = {  # a recipe's info.family (fine-tuning recipes: "finetune") → its page under recipes/
    "vision-language": "Vision–language",
    "multilingual": "Multilingual text",
    "video": "Video",
    "audio": "Audio and speech",
    "knowledge": "Knowledge",
    "finetune": "Fine-tuning",
}


def md(text: str) -> str:
    """A docstring or comment (reST-ish) as Markdown that fits a table cell."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    parts = " ".join(text.replace("``", "`").split()).split("`")
    for i in range(0, len(parts), 2):  # outside code spans: "|" would end a table cell and
        parts[i] = re.sub(r"([|{}])", r"\\\1", parts[i])  # "{...}" read as attributes
    return "`".join(parts)


def first_paragraph(doc: str | None) -> str:
    return md((doc or "").strip().split("\n\n")[0])


def link(page: str, target: str) -> str:
    """A relative link from generated ``page`` to ``target`` (both under docs/, ``#`` allowed)."""
    path, _, anchor = target.partition("#")
    rel = posixpath.relpath(path, posixpath.dirname(page) or ".") if path else ""
    return rel + (f"#{anchor}" if anchor else "")


# ---------------------------------------------------------------------------------------------
# Config dataclasses: every key with its type, default and doc


def field_docs(cls: type) -> dict[str, str]:
    """The ``#:`` comments of a dataclass's fields (above the field, or after it on its line)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        lines = textwrap.dedent(inspect.getsource(klass)).splitlines()
        for node in ast.parse("\n".join(lines)).body[0].body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            above, i = [], node.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#:"):
                above.insert(0, lines[i].strip()[2:].strip())
                i -= 1
            after = lines[node.lineno - 1].partition("#:")[2].strip()
            docs[node.target.id] = " ".join([*above, after]).strip()
    return docs


def default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def show_default(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "required"
    value = config.to_dict(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    text = text.removesuffix("\n...").removesuffix("...").strip()
    return f"`{text}`" if text else "`''`"


def key_rows(cls: type, prefix: str = "", nested: bool = True) -> list[str]:
    """Table rows of a Config dataclass; nested dataclass fields become dotted keys."""
    hints, docs, rows = typing.get_type_hints(cls), field_docs(cls), []
    for f in dataclasses.fields(cls):
        if not f.init or (f.name == "type" and cls.__name__ == "Config"):  # a part's name
            continue
        tp, key = hints[f.name], prefix + f.name
        doc = md(docs.get(f.name, ""))
        if "registry" in f.metadata:
            reg = f.metadata["registry"]
            many = "one per name, each " if f.metadata.get("many") else ""
            kind = f"{many}a registered {reg.kind} (`type` picks it)"
            rows.append(f"| `{key}` | {kind} | {show_default(default_of(f))} | {doc} |")
            continue
        bounds = f.metadata.get("bounds")
        rng = " ".join(
            f"{op} {b}" for op, b in zip((">=", ">", "<="), bounds or ()) if b is not None
        )
        doc += f" (must be {rng})" if rng else ""
        if dataclasses.is_dataclass(tp):
            rows.append(f"| `{key}` | a mapping | | {doc or first_paragraph(tp.__doc__)} |")
            rows += key_rows(tp, key + ".") if nested else []
            continue
        tname = md(config._type_name(tp))
        rows.append(f"| `{key}` | {tname} | {show_default(default_of(f))} | {doc} |")
    return rows


def keys_table(cls: type, prefix: str = "", nested: bool = True) -> str:
    rows = key_rows(cls, prefix, nested)
    if not rows:
        return "No keys besides `type`.\n"
    return "| key | type | default | doc |\n|---|---|---|---|\n" + "\n".join(rows) + "\n"


def parts(kind: str) -> str:
    if kind == "recipe":
        sections = [("", RunConfig), ("info.", RecipeInfo), ("info.reproduces[i].", Reference),
                    ("data.", DataConfig), ("data.sources.NAME.", SourceConfig),
                    ("model.", ModelConfig), ("train.", TrainConfig)]  # fmt: skip
        out = []
        for prefix, cls in sections:
            title = prefix.rstrip(".") or "top level"
            anchor = "recipe-" + re.sub(r"[^a-z]+", "-", title.lower()).strip("-")
            out.append(f"### `{title}` {{#{anchor}}}\n\n{first_paragraph(cls.__doc__)}\n")
            out.append(keys_table(cls, prefix, nested=bool(prefix)))
        return "\n".join(out)
    registry, out = PLUG_POINTS[kind], []
    for name in registry.names():
        cls = registry.get(name)
        extra = ""
        if kind == "encoder":
            extra = f" Reads the `{cls.modality}` modality."
        members, keys = getattr(cls, "members", None), getattr(cls, "keys", None)
        if kind == "modality" and isinstance(members, tuple):
            extra = " Shard members: " + (", ".join(f"`{m}`" for m in members) or "none") + "."
            if isinstance(keys, tuple):
                extra += " Batch keys: " + ", ".join(f"`{k}`" for k in keys) + "."
        out.append(f"### `{name}` {{#{kind}-{name}}}\n")
        out.append(f"{first_paragraph(cls.__doc__)}{extra} `{cls.__module__}.{cls.__name__}`\n")
        out.append(keys_table(cls.Config))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Recipes


def recipe_files() -> dict[str, tuple[str, Path]]:
    """Every recipe that ships with mmptm by name: (kind: pretrain | finetune, file); those of
    the user's folders (``MMPTM_RECIPE_PATH``) are left out."""
    paths = {name: recipe_path(name) for name in list_recipes()}
    return {
        name: (recipe_kind(name), path)
        for name, path in paths.items()
        if path.is_relative_to(config.PACKAGE_RECIPES)
    }


def leading_comment(path: Path) -> str:
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


@functools.cache
def recipe_trees() -> dict[str, dict[str, Any]]:
    out = {}
    for name, (kind, path) in recipe_files().items():
        info = load_recipe(name).info
        tree, family = (
            config.load_yaml_tree(path),
            "finetune" if kind == "finetune" else info.family,
        )
        out[name] = {"kind": kind, "path": path, "tree": tree, "family": family, "info": info}
    return out


def cite(info: RecipeInfo) -> str:
    """What a recipe reproduces: ``CLIP (Radford et al., 2021)``, several joined by "; "."""
    return "; ".join(map(str, info.reproduces))


def part_link(page: str, kind: str, part: Any) -> str:
    name = part.get("type", "") if isinstance(part, dict) else str(part)
    return f"[`{name}`]({link(page, f'parts.md#{kind}-{name}')})"


def recipe_card(
    page: str, name: str, r: dict[str, Any], results: dict[str, list[tuple[str, str]]]
) -> str:
    tree, model = r["tree"], r["tree"].get("model", {})
    run = "pretrain" if r["kind"] == "pretrain" else "finetune"
    rows = [f"| run | `mmptm {run} {name}" + (" init=RUN`" if run == "finetune" else "`") + " |"]
    enc = ", ".join(
        f"`{v}`: {part_link(page, 'encoder', e)}" for v, e in model.get("encoders", {}).items()
    )
    if enc:
        rows.append(f"| encoders | {enc} |")
    if "fusion" in model:
        rows.append(f"| fusion | {part_link(page, 'fusion', model['fusion'])} |")
    objectives = ", ".join(
        f"`{k}`: {part_link(page, 'objective', o)}" for k, o in model.get("objectives", {}).items()
    )
    rows.append(f"| objectives | {objectives or 'those of the run it starts from'} |")
    for key in ("task_mix", "routes"):
        if model.get(key):
            rows.append(f"| `model.{key}` | {show_default(model[key])} |")
    data = tree.get("data", {})
    if data.get("sources"):
        rows.append("| data sources | " + ", ".join(f"`{s}`" for s in data["sources"]) + " |")
    if tree.get("init"):
        rows.append(f"| `init` | `{tree['init']}` |")
    if r["info"].reproduces:
        rows.append(f"| reproduces | {md(cite(r['info']))} |")
    if name in results:
        rows.append(
            "| results | " + ", ".join(f"[{t}]({link(page, to)})" for t, to in results[name]) + " |"
        )
    # as the repository names it (the package imported may be another checkout's)
    rel = r["path"].relative_to(config.PACKAGE_RECIPES.parent.parent).as_posix()
    text = r["path"].read_text(encoding="utf-8").rstrip()
    return (
        f"### `{name}` {{#{name}}}\n\n{md(leading_comment(r['path']))}\n\n| | |\n|---|---|\n"
        + "\n".join(rows)
        + f'\n\n??? note "{rel}"\n\n'
        + textwrap.indent(f"```yaml\n{text}\n```", "    ")
        + "\n"
    )


def recipes(arg: str, page: str, results: dict[str, list[tuple[str, str]]]) -> str:
    trees = recipe_trees()
    if arg == "all":
        out = ["| recipe | family | reproduces | what it is |", "|---|---|---|---|"]
        for name, r in trees.items():
            where = link(page, f"recipes/{r['family']}.md#{name}")
            about, cited = md(r["info"].summary), md(cite(r["info"])) or "—"
            out.append(f"| [`{name}`]({where}) | {FAMILIES[r['family']]} | {cited} | {about} |")
        return "\n".join(out) + "\n"
    cards = [recipe_card(page, n, r, results) for n, r in trees.items() if r["family"] == arg]
    if not cards:
        raise ValueError(f"{page}: no recipe of family {arg!r}")
    return "\n".join(cards)


# ---------------------------------------------------------------------------------------------
# Result tables: docs/results/NAME.yaml


def result_table(name: str, page: str) -> str:
    path = DOCS / "results" / f"{name}.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    for key in ("title", "command", "date", "hardware", "columns", "rows"):
        if key not in data:
            raise ValueError(f"{path}: missing {key!r}")
    cols = data["columns"]
    out = [
        f'<a id="r-{name}"></a>',
        "",
        "| " + " | ".join(map(str, cols)) + " |",
        "|" + "---|" * len(cols),
    ]
    for row in data["rows"]:
        if len(row) != len(cols):
            raise ValueError(f"{path}: a row of {len(row)} cells under {len(cols)} columns: {row}")
        out.append("| " + " | ".join("" if c is None else str(c) for c in row) + " |")
    src = link(page, f"results/{name}.yaml")
    out.append(
        f"\n<small>{md(data['title'])}. Command: `{data['command']}`. Date: {data['date']}. "
        f"Hardware: {md(data['hardware'])}. Data: [{name}.yaml]({src}).</small>\n"
    )
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Floors and converters


def floors() -> str:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = pyproject["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    out = ["| floor (top first) | modules | what lives there |", "|---|---|---|"]
    for i, layer in enumerate(layers):
        cells = []
        for module in (m.strip() for m in layer.split("|")):
            path = ROOT / Path(*module.split(".")) / "__init__.py"
            if not path.is_file():
                path = path.parent.with_suffix(".py")
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
            cells.append((module, first_paragraph(doc)))
        names = ", ".join(f"`{m.removeprefix('mmptm.')}`" for m, _ in cells)
        what = " ".join(
            f"**{m.removeprefix('mmptm.')}**: {d}" if len(cells) > 1 else d for m, d in cells
        )
        out.append(f"| {len(layers) - i} | {names} | {what} |")
    return "\n".join(out) + "\n"


def converters() -> str:
    out = []
    os.environ["COLUMNS"] = "100"  # argparse wraps help text to the terminal's width
    for cmd in CONVERTERS:
        parser = argparse.ArgumentParser(prog=f"mmptm data {cmd.name}", description=cmd.summary)
        cmd.add_arguments(parser)
        out.append(f"### `mmptm data {cmd.name}` {{#data-{cmd.name}}}\n\n{md(cmd.summary)}\n")
        out.append(f"```text\n{parser.format_help().rstrip()}\n```\n")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------


def expand(page: str, text: str, results: dict[str, list[tuple[str, str]]]) -> str:
    def one(m: re.Match[str]) -> str:
        indent, what, arg = m.groups()
        if what == "results":
            text = result_table(arg, page)
        elif what == "recipes":
            text = recipes(arg, page, results)
        elif what == "parts":
            text = parts(arg)
        else:
            text = floors() if what == "floors" else converters()
        return textwrap.indent(text, indent)  # a marker inside a list item stays in it

    return MARKER.sub(one, text)


def result_links() -> dict[str, list[tuple[str, str]]]:
    """recipe → links to the result tables that name it (from each data file's ``recipes``)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for page in sorted(DOCS.rglob("*.md")):
        rel = page.relative_to(DOCS).as_posix()
        for name in re.findall(
            r"^ *<!-- results: ([a-z0-9_-]+) -->$", page.read_text("utf-8"), re.M
        ):
            data = yaml.safe_load((DOCS / "results" / f"{name}.yaml").read_text("utf-8"))
            for recipe in data.get("recipes", []):
                out.setdefault(recipe, []).append((md(data["title"]), f"{rel}#r-{name}"))
    return out


def main() -> None:
    results = result_links()
    for page in sorted(DOCS.rglob("*.md")):
        rel = page.relative_to(DOCS).as_posix()
        text = page.read_text(encoding="utf-8")
        new = expand(rel, text, results)
        if new != text:
            with mkdocs_gen_files.open(rel, "w") as f:
                f.write(new)
    bench = ROOT / "benchmarks"
    for src, dest in (
        ("README.md", "benchmarks/index.md"),
        ("RESULTS.md", "benchmarks/results.md"),
    ):
        text = (bench / src).read_text(encoding="utf-8").replace("(RESULTS.md)", "(results.md)")
        with mkdocs_gen_files.open(dest, "w") as f:
            f.write(text)


# mkdocs-gen-files runs this file with runpy.run_path, whose module name is "<run_path>";
# outside a build mkdocs_gen_files.open writes into docs/ itself, so importing this file (to
# preview a table) must not run it.
if __name__ == "<run_path>":
    main()
