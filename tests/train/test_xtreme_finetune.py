"""XTREME-style tasks through the CLI: convert, fine-tune on English, score every language
(mmptm finetune and mmptm eval transfer), for tagging, PAWS-X and extractive QA."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import MATERIALS, OWNERS, TOYS

from mmptm.cli import main
from mmptm.eval.qa import evaluate_qa_set
from mmptm.models.load import load_pretrained
from mmptm.objectives.qa import ExtractiveQA

COMMON = ["data.batch_size=4", "data.num_workers=0", "train.max_steps=3", "train.warmup_steps=1",
          "train.log_every=1", "train.progress=false"]  # fmt: skip


def _ner_file(path, n: int, lang: str) -> None:
    lines = []
    for i in range(n):
        toy, owner = TOYS[i % len(TOYS)], OWNERS[i % len(OWNERS)]
        words = [(owner, "B-PER"), ("owns", "O"), (toy, "B-TOY"), (".", "O")]
        if i % 2:
            words = [("Kato", "B-TOY"), ("and", "O"), ("Anna", "B-PER"), ("Boris", "I-PER")]
        lines += [f"{lang}:{w}\t{t}" for w, t in words] + [""]
    path.write_text("\n".join(lines) + "\n")


def _losses(run, head):
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r[f"{head}_loss"] for r in logged if f"{head}_loss" in r]


def test_tagging_finetune_then_transfer(toy_text_run, tmp_path, capsys):
    data = tmp_path / "wikiann"
    for split, lang, n in (("train", "en", 16), ("test", "en", 6), ("test", "de", 5)):
        f = tmp_path / f"{lang}-{split}"
        _ner_file(f, n, lang)
        argv = ["data", "conll", "--input", str(f), "--out", str(data), "--lang", lang]
        assert main(argv) == 0
    capsys.readouterr()
    run = tmp_path / "ft"
    argv = ["finetune", "wikiann", f"init={toy_text_run}", f"output_dir={run}",
            f"data.train={data}/train-en-*.tar", "data.eval={}",
            f"data.eval.en={data}/test-en-*.tar", f"data.eval.de={data}/test-de-*.tar",
            f"model.objectives.ner.labels={data}/labels.txt", *COMMON]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "avg" in printed and printed.splitlines()[1].startswith("f1")
    losses = _losses(run, "ner")
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    saved = json.loads((run / "eval.json").read_text())
    assert saved["task"] == "token_tagging" and saved["metric"] == "f1"
    assert saved["sets"]["en"]["n"] == 6 and saved["sets"]["de"]["words"] == 20
    en, de = saved["sets"]["en"]["f1"], saved["sets"]["de"]["f1"]
    assert saved["avg"]["f1"] == pytest.approx((en + de) / 2)
    # the run on disk, every language from one pattern: the same scores
    out = tmp_path / "r.json"
    argv = ["eval", "transfer", str(run), "--pattern", f"{data}/test-{{lang}}-*.tar",
            "--languages", "en,de", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert json.loads(out.read_text()) == saved


def test_pawsx_finetuned_and_scored_in_one_command(toy_text_run, tmp_path, capsys):
    data = tmp_path / "pawsx"
    for split, lang, n in (("train", "en", 16), ("test", "en", 6), ("test", "fr", 6)):
        f = tmp_path / f"{split}_{lang}.tsv"
        rows = [f"{i}\t{TOYS[i % 6]} is made of {MATERIALS[i % 5]} .\t"
                f"{TOYS[i % 6]} is made of {MATERIALS[(i + i % 2) % 5]} .\t{1 - i % 2}"
                for i in range(n)]  # fmt: skip
        f.write_text("id\tsentence1\tsentence2\tlabel\n" + "\n".join(rows) + "\n")
        assert main(["data", "pawsx", "--input", str(f), "--out", str(data), "--lang", lang]) == 0
    capsys.readouterr()
    out = tmp_path / "r.json"
    argv = ["eval", "transfer", "pawsx", f"init={toy_text_run}", f"output_dir={tmp_path / 'ft'}",
            f"data.train={data}/train-en-*.tar", *COMMON, "--finetune",
            "--set", f"en={data}/test-en-*.tar", "--set", f"fr={data}/test-fr-*.tar",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["task"] == "classification" and list(result["sets"]) == ["en", "fr"]
    assert result["avg"]["acc"] == pytest.approx(
        (result["sets"]["en"]["acc"] + result["sets"]["fr"]["acc"]) / 2
    )
    # the classification path scores it the same: mmptm eval xnli
    assert main(["eval", "xnli", str(tmp_path / "ft"), "--set", f"fr={data}/test-fr-*.tar"]) == 0
    xnli = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert xnli["fr"] == pytest.approx(result["sets"]["fr"]["acc"])


def _squad(n: int) -> dict:
    paras = []
    for i in range(n):
        toy, owner = TOYS[i % 6], OWNERS[i % 3]
        filler = " ".join(f"{TOYS[(i + k) % 6]} is made of {MATERIALS[(i + k) % 5]} ."
                          for k in range(1, 4))  # fmt: skip
        context = f"{filler} {toy} belongs to {owner} ."
        start = context.rindex(owner)
        paras.append({"context": context, "qas": [{"id": f"q{i}", "question": f"{toy} belongs to",
                      "answers": [{"text": owner, "answer_start": start}]}]})  # fmt: skip
    return {"data": [{"title": "toys", "paragraphs": paras}]}


def test_qa_doc_stride_finetune_and_an_oracle_scores_full_marks(toy_text_run, tmp_path,
                                                                 monkeypatch, capsys):  # fmt: skip
    data = tmp_path / "qa"
    for split, n in (("train", 12), ("test", 5)):
        f = tmp_path / f"{split}.json"
        f.write_text(json.dumps(_squad(n)))
        assert main(["data", "squad", "--input", str(f), "--out", str(data), "--lang", "en"]) == 0
    run = tmp_path / "ft"
    # rows of 24 pieces: every context is cut into several windows
    argv = [
        "finetune",
        "xquad",
        f"init={toy_text_run}",
        f"output_dir={run}",
        f"data.train={data}/train-en-*.tar",
        "data.eval={}",
        f"data.eval.en={data}/test-en-*.tar",
        "model.objectives.qa.max_len=24",
        "model.objectives.qa.stride=8",
        "model.objectives.qa.max_query_len=8",
        *COMMON,
    ]
    assert main(argv) == 0
    assert "em" in capsys.readouterr().out
    assert all(math.isfinite(x) for x in _losses(run, "qa"))
    saved = json.loads((run / "eval.json").read_text())
    assert saved["task"] == "extractive_qa" and saved["sets"]["en"]["n"] == 5

    # an oracle head that points at the gold answer wherever a window holds all of it: the
    # windows, the offsets back into the context and the text cut from it are all right
    def oracle(self, out, batch):
        start_R, end_R = self.targets(batch)
        shape = batch["attention_mask"].shape
        s, e = torch.zeros(shape), torch.zeros(shape)
        rows = torch.arange(shape[0])
        s[rows, start_R], e[rows, end_R] = 10.0, 10.0
        return s, e

    monkeypatch.setattr(ExtractiveQA, "logits", oracle)
    model, tokenizer, cfg = load_pretrained(str(run))
    result = evaluate_qa_set(model, cfg, tokenizer, f"{data}/test-en-*.tar")
    assert result == {"n": 5, "em": 1.0, "f1": 1.0, "unanswered": 0}
