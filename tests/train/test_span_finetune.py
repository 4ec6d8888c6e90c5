"""Entity typing and relation classification through the CLI: convert, fine-tune, evaluate."""

from __future__ import annotations

import json
import math

import pytest
from conftest import MATERIALS, OWNERS, TOYS

from mmptm.cli import main


def _typing_items(n: int) -> list[dict]:
    out = []
    for i in range(n):
        toy = TOYS[i % len(TOYS)]
        if i % 2:
            item = {"left_context_token": [toy, "belongs", "to"],
                    "mention_span": OWNERS[i % len(OWNERS)], "right_context_token": ["."],
                    "y_str": ["person", "owner"]}  # fmt: skip
        else:
            item = {"left_context_token": [], "mention_span": toy,
                    "right_context_token": ["is", "made", "of", MATERIALS[i % 5], "."],
                    "y_str": ["toy"], "entity": f"T{i % len(TOYS):03d}"}  # fmt: skip
        out.append({**item, "facts": "text" if i % 3 else "graph"})
    return out


def _relation_items(n: int) -> list[dict]:
    out = []
    for i in range(n):
        toy = TOYS[i % len(TOYS)]
        if i % 3 == 0:
            tok, rel = [toy, "is", "made", "of", MATERIALS[i % 5], "."], "made_of"
        elif i % 3 == 1:
            tok, rel = [toy, "belongs", "to", OWNERS[i % 3], "."], "owned_by"
        else:
            tok, rel = [toy, "and", OWNERS[i % 3], "met", "."], "no_relation"
        obj = 4 if rel == "made_of" else (3 if rel == "owned_by" else 2)
        out.append({"id": f"r{i}", "token": tok, "subj_start": 0, "subj_end": 0,
                    "obj_start": obj, "obj_end": obj, "relation": rel,
                    "facts": "text" if i % 2 else "graph"})  # fmt: skip
    return out


@pytest.mark.parametrize("task", ["typing", "relations"])
def test_convert_finetune_evaluate(toy_text_run, tmp_path, capsys, task):
    data = tmp_path / "shards"
    make = _typing_items if task == "typing" else _relation_items
    for split, n in (("train", 24), ("test", 9)):
        f = tmp_path / f"{split}.json"
        items = make(n)
        if task == "typing":
            f.write_text("".join(json.dumps(x) + "\n" for x in items))
        else:
            f.write_text(json.dumps(items))
        assert main(["data", task, "--input", str(f), "--out", str(data)]) == 0
    capsys.readouterr()
    recipe, head = {
        "typing": ("entity_typing", "typing"),
        "relations": ("relation_classification", "relations"),
    }[task]
    run = tmp_path / "ft"
    argv = [
        "finetune", recipe, f"init={toy_text_run}",
        f"output_dir={run}", f"data.train={data}/train-*.tar", f"data.eval.dev={data}/test-*.tar",
        f"data.eval.test={data}/test-*.tar", f"model.objectives.{head}.labels={data}/labels.txt",
        "data.batch_size=4", "data.num_workers=0", "train.max_steps=3", "train.warmup_steps=1",
        "train.log_every=1", "train.progress=false",
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    metric = "micro_f1" if task == "typing" else "f1"
    assert metric in printed and "facts=graph" in printed
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r[f"{head}_loss"] for r in logged if f"{head}_loss" in r]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    # the saved run evaluates the same from disk, with the group breakdown
    out = tmp_path / "r.json"
    argv = ["eval", "spans", str(run), "--shards", f"{data}/test-*.tar", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())["test"]
    assert result == json.loads((run / "eval.json").read_text())["test"]
    assert result["overall"]["n"] == 9 and result["task"] == recipe
    assert sum(g["n"] for g in result["by_facts"].values()) == 9
    assert 0.0 <= result["overall"][metric] <= 1.0
