"""``mmptm data NAME``: every command is a registered converter; flags state the library's
defaults; toyworld writes the languages the recipes read."""

from __future__ import annotations

import argparse
import json

import pytest

from mmptm.cli import build_parser, main
from mmptm.config import load_yaml_tree
from mmptm.converters.audio import DEFAULT_SHARD_SIZE
from mmptm.registry import CONVERTERS, default_of
from mmptm.studies import LANGS
from mmptm.toyworld import generate

DATA_COMMANDS = {
    "toyworld", "parallel", "text", "xnli", "coco", "vqa", "answers", "msrvtt", "videos",
    "video-features", "clotho", "audiocaps", "esc50", "librispeech", "typing", "relations",
    "link", "triples", "karpathy", "manifest", "conll", "conllu", "pawsx", "squad", "candidates",
    "toyworld-tasks", "toyworld-refexp", "refcoco", "toyworld-nlvr2", "nlvr2", "toyworld-vcr",
    "vcr", "tatoeba", "bucc", "toyworld-retrieval",
}  # fmt: skip


def _data_parser() -> argparse.ArgumentParser:
    data = build_parser()._subparsers._group_actions[0].choices["data"]  # type: ignore[union-attr]
    data.format_help()  # the group is filled on first use
    return data


def _data_commands() -> dict[str, argparse.ArgumentParser]:
    return _data_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]


def test_every_data_command_comes_from_the_registry():
    commands = _data_commands()
    assert set(commands) == {c.name for c in CONVERTERS} == DATA_COMMANDS
    assert list(commands) == sorted(commands)  # listed by name


def test_a_new_converter_is_one_registered_entry(monkeypatch, capsys):
    list(CONVERTERS)  # the built-in entries, before the registry is swapped for a copy
    monkeypatch.setattr(CONVERTERS, "_commands", dict(CONVERTERS._commands))

    @CONVERTERS.register("echo", "print --word", lambda p: p.add_argument("--word"))
    def echo(args: argparse.Namespace) -> int:
        print(args.word)
        return 0

    help_ = _data_parser().format_help()
    assert "echo" in help_ and "print --word" in help_
    assert main(["data", "echo", "--word", "hi"]) == 0
    assert capsys.readouterr().out == "hi\n"


def test_flags_default_to_what_the_functions_do():
    parse = build_parser().parse_args
    tw = parse(["data", "toyworld", "--out", "x"])
    assert (tw.n_train, tw.n_val, tw.image_size, tw.voice) == tuple(
        default_of(generate, n) for n in ("n_train", "n_val", "image_size", "voice")
    )
    assert parse(["data", "clotho", "--csv", "c", "--audio-dir", "a", "--out", "o"]).shard_size == (
        DEFAULT_SHARD_SIZE
    )
    # the command's own: 10000 samples a shard (the VL functions' default is 1000), split train
    coco = parse(["data", "coco", "--input", "c.json", "--out", "o"])
    assert (coco.split, coco.shard_size) == ("train", 10000)


def test_toyworld_writes_the_five_languages_the_recipes_and_readme_name(tmp_path, capsys):
    """The multilingual recipes read mono shards of en, de, fr, ru and es (as the README
    says); the command's default left out es, so mbert_tiny found no es shards."""
    out = tmp_path / "tw"
    assert main(["data", "toyworld", "--out", str(out), "--n-train", "5", "--n-val", "0",
                 "--n-test", "0", "--image-size", "16"]) == 0  # fmt: skip
    languages = json.loads((out / "manifest.json").read_text())["languages"]
    recipe = load_yaml_tree("_toyworld_text")
    assert languages == recipe["data"]["sources"]["mono"]["languages"] == list(LANGS)


def test_writer_flags_take_the_types_and_defaults_of_the_writer():
    """`register_writer`: int, float and str flags typed from the writer's defaults, a tuple
    default a comma list; what the command line gives reaches the writer as that type."""
    from mmptm.toyworld.refexp import write_refexp
    from mmptm.toyworld.retrieval import write_retrieval
    from mmptm.toyworld.tasks import write_tasks

    parse = build_parser().parse_args
    ret = parse(["data", "toyworld-retrieval", "--out", "o"])
    assert ret.languages == tuple(default_of(write_retrieval, "languages"))
    assert ret.parallel == default_of(write_retrieval, "parallel") == 0.25
    ret = parse(["data", "toyworld-retrieval", "--out", "o", "--languages", "de, ru,",
                 "--parallel", "0.5", "--n-bucc", "7"])  # fmt: skip
    assert (ret.languages, ret.parallel, ret.n_bucc) == (("de", "ru"), 0.5, 7)
    ref = parse(["data", "toyworld-refexp", "--out", "o", "--lang", "fr"])
    assert (ref.lang, ref.n_train) == ("fr", default_of(write_refexp, "n_train"))
    tasks = parse(["data", "toyworld-tasks", "--out", "o", "--languages", "en,ru"])
    assert tasks.languages == ("en", "ru")
    assert tasks.shard_size == default_of(write_tasks, "shard_size")
    with pytest.raises(SystemExit):
        parse(["data", "toyworld-retrieval", "--out", "o", "--parallel", "half"])
