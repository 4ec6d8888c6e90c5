"""MLQA's metric through a fine-tuned QA run: ``mmptm eval transfer --metric mlqa`` scores
with the answer language's normalisation, the default with SQuAD's."""

from __future__ import annotations

import json

import torch

from mmptm.cli import main
from mmptm.data.shards import ShardWriter
from mmptm.objectives.qa import ExtractiveQA

COMMON = ["data.batch_size=2", "data.num_workers=0", "train.max_steps=2", "train.warmup_steps=1",
          "train.log_every=1", "train.progress=false"]  # fmt: skip


def _write(path, lang, n):
    """Questions whose training span is "dem Vater" and whose scoring answer is "Vater"."""
    with ShardWriter(path / f"test-{lang}-%06d.tar", 100) as w:
        for i in range(n):
            context = f"Der Ball {i} gehört dem Vater ."
            a = context.index("dem Vater")
            w.write({"__key__": f"q{i}", "json": {
                "premise": "Wem gehört der Ball", "hypothesis": context,
                "answer": {"hypothesis": [[a, a + len("dem Vater"), 0]]},
                "context_span": {"hypothesis": [[0, len(context), 0]]},
                "answers": [{"text": "Vater", "answer_start": a + 4}], "id": f"q{i}",
                "language": lang}})  # fmt: skip


def test_transfer_metric_mlqa_drops_the_languages_articles(toy_text_run, tmp_path, monkeypatch,
                                                            capsys):  # fmt: skip
    data = tmp_path / "qa"
    _write(data, "de", 3)
    _write(data, "xx", 1)
    run = tmp_path / "ft"
    assert main(["finetune", "xquad", f"init={toy_text_run}", f"output_dir={run}",
                 f"data.train={data}/test-de-*.tar", "data.eval={}",
                 f"data.eval.de={data}/test-de-*.tar", *COMMON]) == 0  # fmt: skip

    def oracle(self, out, batch):  # points at the training span, "dem Vater"
        start_R, end_R = self.targets(batch)
        shape = batch["attention_mask"].shape
        s, e = torch.zeros(shape), torch.zeros(shape)
        rows = torch.arange(shape[0])
        s[rows, start_R], e[rows, end_R] = 10.0, 10.0
        return s, e

    monkeypatch.setattr(ExtractiveQA, "logits", oracle)
    capsys.readouterr()
    de = f"de={data}/test-de-*.tar"
    assert main(["eval", "transfer", str(run), "--set", de]) == 0
    squad = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["sets"]["de"]
    # SQuAD keeps "dem": "dem vater" vs "vater", p 1/2, r 1
    assert (squad["em"], round(squad["f1"], 6)) == (0.0, round(2 / 3, 6))
    assert main(["eval", "transfer", str(run), "--set", de, "--metric", "mlqa"]) == 0
    mlqa = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["sets"]["de"]
    assert (mlqa["em"], mlqa["f1"], mlqa["n"]) == (1.0, 1.0, 3)
    # a language MLQA's script does not know is one line naming the shards and the sample
    assert main(["eval", "transfer", str(run), "--set", f"xx={data}/test-xx-*.tar",
                 "--metric", "mlqa"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "test-xx-*.tar: sample 'q0' has language 'xx'; metric mlqa needs one of" in err
