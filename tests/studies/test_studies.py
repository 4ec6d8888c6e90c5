"""The studies table and ``mmptm demo``: the flags set the study functions' keywords, and a
flag left out leaves the study's own default (the one place the defaults live)."""

from __future__ import annotations

import functools
import inspect

import pytest

from mmptm import studies
from mmptm.cli import build_parser, main
from mmptm.registry import default_of


@pytest.fixture
def calls(monkeypatch) -> list[tuple[str, str, dict]]:
    """Every study recorded instead of run: (name, out, keywords given)."""
    made: list[tuple[str, str, dict]] = []
    for name, fn in list(studies.STUDIES.items()):

        @functools.wraps(fn)
        def record(out, _name=name, **kw):
            made.append((_name, str(out), kw))

        monkeypatch.setitem(studies.STUDIES, name, record)
    return made


def test_every_study_takes_its_folder_then_keywords_with_defaults():
    for name, fn in studies.STUDIES.items():
        out, *rest = inspect.signature(fn).parameters.values()
        assert out.name == "out", name
        for p in rest:
            assert p.kind is p.KEYWORD_ONLY and p.default is not p.empty, (name, p.name)
    for name, choices in studies.RECIPES.items():
        assert set(default_of(studies.STUDIES[name], "recipes")) <= set(choices)


def test_demo_passes_only_what_was_given(calls):
    assert main(["demo"]) == 0
    assert calls.pop() == ("clip", "runs/demo-clip", {})
    # 0 steps: the study's own, as ever; a flag the study does not take is passed over
    assert main(["demo", "--steps", "0", "--ft-steps", "5", "--seed", "0"]) == 0
    assert calls.pop() == ("clip", "runs/demo-clip", {"seed": 0})
    argv = ["demo", "vqa", "--out", "o", "--recipes", "oscar_tiny,albef_tiny", "--seeds", "2",
            "--ft-steps", "0", "--retrieval-items", "0",
            "--set", "a=1", "--set", "b=2"]  # fmt: skip
    assert main(argv) == 0
    assert calls.pop() == ("vqa", "o", {"recipes": ("oscar_tiny", "albef_tiny"),
                                        "seeds": (0, 1), "retrieval_items": 0,
                                        "overrides": ["a=1", "b=2"]})  # fmt: skip
    assert main(["demo", "video", "--qa-steps", "3", "--n-train", "8", "--n-test", "4"]) == 0
    assert calls.pop() == ("video", "runs/demo-video", {"qa_steps": 3, "n_train": 8, "n_test": 4})


def test_demo_help_reads_the_defaults_from_the_studies(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    steps = {name: default_of(studies.STUDIES[name], "steps") for name in ("clip", "knowledge")}
    assert f"clip {steps['clip']};" in text and f"knowledge {steps['knowledge']})" in text
    assert f"(default: {default_of(studies.clip_study, 'n_train')})" in text
    assert f"(default: {','.join(studies.AUDIO_DEMO)})" in text
    assert "{clip,multilingual,vqa,video,audio,knowledge,captioning,tasks}" in text
