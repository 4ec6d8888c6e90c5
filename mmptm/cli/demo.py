"""``mmptm demo [STUDY]``: the reproducible toyworld studies (:data:`mmptm.studies.STUDIES`).

Each option sets the study function's keyword of the same name. An option left out (or
``--steps`` / ``--ft-steps`` 0) leaves the study's own default: the defaults live in the study
functions' signatures, and ``--help`` reads them from there.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmptm.registry import default_of


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``mmptm demo``; the studies are imported when it is used."""
    sub.add_parser(
        "demo", help="reproducible toyworld studies (default: clip)",
        argument_default=argparse.SUPPRESS, fill=_fill,
    )  # fmt: skip


@dataclass(frozen=True)
class _Option:
    """An option of ``mmptm demo``: it sets the study functions' keyword of the same name."""

    flag: str
    help: str
    type: Callable[[str], Any] = int
    #: the option's value → the keyword's value
    to_keyword: Callable[[Any], Any] = lambda value: value
    #: a study's default as the option would write it
    shown: Callable[[Any], str] = str
    #: how ``--help`` words a default that means something special
    words: Mapping[Any, str] = field(default_factory=dict)
    #: 0 leaves the study's default as well (the step counts have always read it so)
    zero_is_default: bool = False

    @property
    def keyword(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def defaults(self, studies: Mapping[str, Callable[..., Any]]) -> str:
        """This option's default in each study that takes it, studies alike grouped: "4000",
        or "clip 2500; video, audio the recipe's"."""
        groups: dict[str, list[str]] = {}
        for name, study in studies.items():
            if self.keyword in inspect.signature(study).parameters:
                value = default_of(study, self.keyword)
                shown = self.words.get(value) or self.shown(value)
                groups.setdefault(shown, []).append(name)
        if len(groups) == 1 and len(next(iter(groups.values()))) == len(studies):
            return next(iter(groups))
        return "; ".join(f"{', '.join(names)} {shown}" for shown, names in groups.items())


_OPTIONS = (
    _Option(
        "--recipes",
        "comma list of the study's recipes or runs",
        type=str,
        to_keyword=lambda value: tuple(value.split(",")),
    ),
    _Option("--qa-steps", "video QA fine-tuning steps, 0 for none"),
    _Option("--n-train", "toyworld training scenes"),
    _Option("--n-test", "toyworld validation and test scenes, each"),
    _Option(
        "--steps",
        "pre-training steps, 0 for the study's own",
        words={0: "the recipe's"},
        zero_is_default=True,
    ),
    _Option(
        "--seeds",
        "fine-tuning seeds",
        to_keyword=lambda n: tuple(range(n)),
        shown=lambda seeds: str(len(seeds)),
    ),
    _Option(
        "--ft-steps",
        "fine-tuning steps, 0 for the study's own",
        words={None: "each task's own"},
        zero_is_default=True,
    ),
    _Option(
        "--retrieval-items",
        "test items ranked after pre-training, vqa: 0 for none (VQA only)",
        words={None: "the whole test split"},
    ),
    _Option("--seed", "seed of the data, the tokenizer and pre-training"),
    _Option("--shared-looks", "knowledge: toyworld's toys per look, 1 each its own"),
)


def _fill(de: argparse.ArgumentParser) -> None:
    from mmptm.studies import RECIPES, STUDIES

    de.add_argument("study", nargs="?", default="clip", choices=list(STUDIES),
                    help="which study (default: clip)")  # fmt: skip
    de.add_argument("--out", default=None, help="default: runs/demo-<study>")
    for option in _OPTIONS:
        if option.keyword == "recipes":  # the choices differ by study, and so does "all"
            help = f"{option.help}; {_recipe_choices(RECIPES, STUDIES)}"
        else:
            help = f"{option.help} (default: {option.defaults(STUDIES)})"
        de.add_argument(option.flag, type=option.type, help=help)
    de.add_argument("--set", dest="overrides", action="append",
                    help="key=value override of the pre-training recipe")  # fmt: skip
    de.set_defaults(fn=_demo)


def _recipe_choices(
    recipes: Mapping[str, tuple[str, ...]], studies: Mapping[str, Callable[..., Any]]
) -> str:
    """What each study may run, and its default."""
    parts = []
    for name, choices in recipes.items():
        default = default_of(studies[name], "recipes")
        chosen = "all" if tuple(default) == tuple(choices) else ",".join(default)
        parts.append(f"{name}: of {', '.join(choices)} (default: {chosen})")
    return "; ".join(parts) + "; vqa also any VL recipe"


def _demo(args: argparse.Namespace) -> int:
    from mmptm.studies import STUDIES

    study = STUDIES[args.study]
    study(Path(args.out or f"runs/demo-{args.study}"), **_settings(args, study))
    return 0


def _settings(args: argparse.Namespace, study: Callable[..., Any]) -> dict[str, Any]:
    """The keywords of ``study`` that the command line gave; the others keep its defaults (an
    option the study does not take is passed over)."""
    takes = inspect.signature(study).parameters
    settings: dict[str, Any] = {}
    for option in _OPTIONS:
        value = getattr(args, option.keyword, None)  # absent: not given
        if value is None or option.keyword not in takes:
            continue
        if not (option.zero_is_default and value == 0):
            settings[option.keyword] = option.to_keyword(value)
    if getattr(args, "overrides", None):
        settings["overrides"] = args.overrides
    return settings
