"""K-Adapter's three steps through `mmptm finetune` from a real text run: a factual adapter on
relation classification, a second adapter on entity-masked MLM, both combined for entity
typing. The base (encoders and fusion.stack) equals the text run's after every step; each
step's own adapter learns, a frozen one keeps its weights."""

from __future__ import annotations

import json

from conftest import MATERIALS, OWNERS, TOYS
from kworld import adapter_of, base_of, equal_sd

from mmptm.cli import main
from mmptm.data.shards import ShardWriter
from mmptm.models import checkpoint

# the init run's shape (tests/train/text_mlm.yaml: 32 wide, 1 layer, 2 heads, 64 positions)
SHAPE = ["model.width=32", "model.encoders.text.max_positions=64",
         "model.fusion.transformer.layers=1", "model.fusion.transformer.heads=2"]  # fmt: skip
SMALL = ["data.batch_size=4", "data.num_workers=0", "train.max_steps=4", "train.warmup_steps=1",
         "train.log_every=1", "train.progress=false", "train.lr=3e-3"]  # fmt: skip


def _adapter(name: str) -> list[str]:
    a = f"model.fusion.adapters.{name}"
    return [f"{a}.layers=[0,1]", f"{a}.width=8", f"{a}.depth=1", f"{a}.heads=2"]


def _data(tmp_path) -> dict[str, str]:
    rel = [{"id": f"r{i}", "token": [TOYS[i % 6], "is", "made", "of", MATERIALS[i % 5], "."]
            if i % 2 else [TOYS[i % 6], "belongs", "to", OWNERS[i % 3], "."],
            "subj_start": 0, "subj_end": 0, "obj_start": 4 if i % 2 else 3,
            "obj_end": 4 if i % 2 else 3, "relation": "made_of" if i % 2 else "owned_by"}
           for i in range(16)]  # fmt: skip
    typ = [{"left_context_token": [], "mention_span": TOYS[i % 6],
            "right_context_token": ["is", "made", "of", MATERIALS[i % 5], "."],
            "y_str": ["toy"] if i % 2 else ["toy", "thing"]} for i in range(16)]  # fmt: skip
    for name, body in (
        ("rel", json.dumps(rel)),
        ("typ", "".join(json.dumps(x) + "\n" for x in typ)),
    ):
        (tmp_path / name / "in").mkdir(parents=True)
        (tmp_path / name / "in" / "train.json").write_text(body)
        task = "relations" if name == "rel" else "typing"
        assert main(["data", task, "--input", str(tmp_path / name / "in" / "train.json"),
                     "--out", str(tmp_path / name)]) == 0  # fmt: skip
    ids = [f"T{i:03d}" for i in range(6)]
    (tmp_path / "entities.txt").write_text("".join(f"{i}\n" for i in ids))
    (tmp_path / "text").mkdir()
    with ShardWriter(str(tmp_path / "text" / "train-%06d.tar"), 100) as w:
        for i in range(24):
            toy, value = TOYS[i % 6], MATERIALS[i % 5]
            text = f"{toy} is made of {value} ."
            meta = {"language": "en", "mentions": [[0, len(toy), ids[i % 6]]]}
            w.write({"__key__": f"{i:04d}", "txt": text, "json": json.dumps(meta)})
    return {"rel": str(tmp_path / "rel"), "typ": str(tmp_path / "typ"),
            "text": str(tmp_path / "text"), "entities": str(tmp_path / "entities.txt")}  # fmt: skip


def test_kadapter_steps_keep_the_base_and_train_each_adapter(toy_text_run, tmp_path, capsys):
    d = _data(tmp_path)
    runs = {k: tmp_path / k for k in ("facts", "cloze", "typing")}
    assert main(["finetune", "kadapter_facts", f"init={toy_text_run}",
                 f"output_dir={runs['facts']}",
                 f"data.train={d['rel']}/train-*.tar", f"data.eval.dev={d['rel']}/train-*.tar",
                 f"data.eval.test={d['rel']}/train-*.tar",
                 f"model.objectives.relations.labels={d['rel']}/labels.txt",
                 'model.objectives.relations.negative=""',
                 *SHAPE, *SMALL, *_adapter("facts")]) == 0  # fmt: skip
    assert main(["finetune", "kadapter_cloze", f"init={runs['facts']}",
                 f"output_dir={runs['cloze']}",
                 f"data.train={d['text']}/train-*.tar",
                 f"data.modalities.text.span_vocabularies.entity={d['entities']}",
                 *SHAPE, *SMALL, *_adapter("facts"), *_adapter("cloze")]) == 0  # fmt: skip
    assert main(["finetune", "kadapter_typing", f"init={runs['cloze']}",
                 f"output_dir={runs['typing']}",
                 f"data.train={d['typ']}/train-*.tar", f"data.eval.dev={d['typ']}/train-*.tar",
                 f"data.eval.test={d['typ']}/train-*.tar",
                 f"model.objectives.typing.labels={d['typ']}/labels.txt",
                 *SHAPE, *SMALL, *_adapter("facts"), *_adapter("cloze")]) == 0  # fmt: skip
    capsys.readouterr()
    text = checkpoint.read(str(toy_text_run)).model
    sd = {k: checkpoint.read(str(r)).model for k, r in runs.items()}
    for k in runs:  # the frozen base is the text run's, tensor for tensor
        assert equal_sd(base_of(sd[k]), base_of(text)), k
    # step 1 trained its adapter away from its near-identity start (weights ~2e-4)
    assert sd["facts"]["fusion.adapters.facts.layers.0.up.weight"].abs().mean() > 1e-3
    # frozen in step 2
    assert equal_sd(adapter_of(sd["cloze"], "facts"), adapter_of(sd["facts"], "facts"))
    assert sd["cloze"]["fusion.adapters.cloze.layers.0.up.weight"].abs().mean() > 1e-3
    # fine-tuned
    assert not equal_sd(adapter_of(sd["typing"], "facts"), adapter_of(sd["cloze"], "facts"))
    assert not equal_sd(adapter_of(sd["typing"], "cloze"), adapter_of(sd["cloze"], "cloze"))
    assert sd["typing"]["fusion.combine.weight"].shape == (32, 96)  # [base; facts; cloze]
    assert (runs["typing"] / "eval.json").exists()
