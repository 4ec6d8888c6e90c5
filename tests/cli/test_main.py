"""``mmptm``: ``python -m mmptm.cli``, and a group's library imported only when it is used."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mmptm.cli import build_parser

LIBRARY = ("torch", "mmptm.converters", "mmptm.toyworld", "mmptm.eval", "mmptm.train")


def _imported_after(code: str) -> list[str]:
    """The library modules a fresh interpreter holds after ``code``."""
    probe = f"import sys\n{code}\nprint(*sorted(m for m in sys.modules if m.startswith({LIBRARY})))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return r.stdout.split()


def test_a_group_imports_its_library_only_when_used():
    assert _imported_after("from mmptm.cli import build_parser; build_parser().format_help()") == []
    parse = "from mmptm.cli import build_parser; build_parser().parse_args(['pretrain', 'x.yaml'])"
    assert _imported_after(parse) == []  # the trainer is imported by the command, not the parser
    imported = _imported_after(
        "from mmptm.cli import build_parser; build_parser().parse_args(['units', 'fit', "
        "'--shards', 's', '--out', 'o'])"
    )
    assert "mmptm.train.units" in imported
    assert not [m for m in imported if m.startswith(("mmptm.converters", "mmptm.eval."))]


def test_python_dash_m_runs_the_command_line():
    r = subprocess.run([sys.executable, "-m", "mmptm.cli", "data", "--help"],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0 and "toyworld" in r.stdout and "the embedded" in r.stdout
    r = subprocess.run([sys.executable, "-m", "mmptm.cli", "nope"], capture_output=True, text=True)
    assert r.returncode == 2 and "invalid choice: 'nope'" in r.stderr


def test_every_group_parses_its_defaults():
    parse = build_parser().parse_args
    assert parse(["eval", "retrieval", "run"]).max_items == 1000
    assert parse(["retrieve", "index", "a query"]).k == 10
    assert parse(["plot", "run", "--out", "c.png"]).smooth == 0.6
    assert parse(["tokenizer", "train", "--input", "t", "--out", "o"]).vocab_size == 8000
    assert not hasattr(parse(["kg", "train-embeddings", "t", "--out", "o"]), "dim")


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "IDX"],
        ["index", "RUN", "--shards", "x.tar", "--out", "o"],
        ["retrieve", "IDX", "red"],
        ["units", "fit", "--shards", "x.tar", "--k", "2", "--out", "c.npy"],
        ["kg", "train-embeddings", "triples.txt", "--out", "o"],
        ["eval", "probe", "RUN", "--cloze", "c.jsonl"],
        ["eval", "spans", "RUN"],
    ],
)
def test_every_device_flag_refuses_a_device_the_machine_lacks(capsys, argv):
    """Checked when the command line is parsed: one line, exit 2, before anything loads."""
    from mmptm.cli import main

    assert main([*argv, "--device", "cuda:99"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    command = " ".join(argv[:2] if argv[0] in ("units", "kg", "eval") else argv[:1])
    assert err[0].startswith(f"mmptm {command}: error: argument --device: cuda:99: ")
