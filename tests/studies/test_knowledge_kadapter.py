"""K-Adapter in `mmptm demo knowledge` (``--recipes kadapter``): the graph's relation items
for the factual adapter, and the whole path at toy sizes (base → facts → cloze adapters →
typing and relations, with and without the adapters' training)."""

from __future__ import annotations

import json

import pytest
from kworld import adapter_of, base_of, equal_sd

from mmptm.cli import main
from mmptm.eval.cloze import evaluate_cloze
from mmptm.models import checkpoint
from mmptm.recipe import load_run_config
from mmptm.studies.knowledge import CLOZE_WORDINGS, FACT_FRAMES, GROUPS, graph_fact_items
from mmptm.toyworld.knowledge_sets import RELATION_FRAMES


def _graph(tmp_path):
    g = tmp_path / "graph"
    g.mkdir()
    (g / "train.txt").write_text(
        "T0\tmade_of\tM0\nT0\towned_by\tP1\nT1\tmade_of\tM1\nT1\towned_by\tP0\n"
        "T1\tfriend_of\tT0\nT2\tmade_of\tM2\nT2\towned_by\tP0\n"
    )
    names = {"T0": "Difi", "T1": "Liru", "T2": "Kasgo", "M0": "wood", "M1": "wool",
             "M2": "stone", "P0": "Elena", "P1": "Hugo"}  # fmt: skip
    (g / "aliases.en.txt").write_text("".join(f"{k}\t{v}\n" for k, v in names.items()))
    toys = [{"id": "T0", "facts_in_text": True}, {"id": "T1", "facts_in_text": False},
            {"id": "T2", "facts_in_text": True}]  # fmt: skip
    (g / "toys.json").write_text(json.dumps(toys))
    return g, names


def test_graph_fact_items_state_every_fact_and_a_wrong_value_in_unseen_frames(tmp_path):
    g, names = _graph(tmp_path)
    items = graph_fact_items(g, seed=0)
    facts = {("T0", "M0"): "made_of", ("T0", "P1"): "owned_by", ("T1", "M1"): "made_of",
             ("T1", "P0"): "owned_by", ("T2", "M2"): "made_of",
             ("T2", "P0"): "owned_by"}  # fmt: skip
    # per fact (friend_of is no probed relation) each frame once true, once a wrong value
    assert len(items) == 6 * len(FACT_FRAMES) * 2
    values = {"made_of": {"M0", "M1", "M2"}, "owned_by": {"P0", "P1"}}
    for it in items:
        s, o = it["subj_id"], it["obj_id"]
        assert it["token"][it["subj_start"]] == names[s] and it["subj_end"] == it["subj_start"]
        assert it["token"][it["obj_start"]] == names[o] and it["obj_end"] == it["obj_start"]
        assert it["relation"] == facts.get((s, o), "no_relation")
        assert it["facts"] == ("graph" if s == "T1" else "text")
        assert o in (values["made_of"] if it["obj_type"] == "MATERIAL" else values["owned_by"])
    assert sum(it["relation"] == "no_relation" for it in items) == len(items) // 2
    # no sentence of the relations test's frames: the adapter learns facts, not test items
    test = {f.replace("{s}", "S").replace("{o}", "O") for f in RELATION_FRAMES}
    for frame in FACT_FRAMES:
        said = " ".join(frame).replace(" .", ".").replace("{s}", "S").replace("{o}", "O")
        assert said not in test


@pytest.mark.slow
def test_demo_knowledge_kadapter_rows_with_and_without_the_adapters(tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["demo", "knowledge", "--out", str(out), "--n-train", "48", "--n-test", "16",
            "--steps", "4", "--ft-steps", "2", "--recipes", "kadapter",
            "--set", "data.batch_size=8", "--set", "data.num_workers=0",
            "--set", "train.warmup_steps=1", "--set", "train.lr=3e-3"]  # fmt: skip
    assert main(argv) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert list(runs) == ["kadapter with graph", "kadapter without graph"]
    for row in runs.values():
        for wording in CLOZE_WORDINGS:
            assert all(0 <= row["cloze"][wording][g] <= 1 for g in GROUPS)
        for task in ("typing", "relations"):
            assert all(0 <= row[task][g] <= 1 for g in GROUPS)
    facts = runs["kadapter with graph"]["facts_adapter"]
    assert all(0 <= facts[k] <= 1 for k in (*GROUPS, "own"))
    # "with": the cloze adapter's run scores the cloze; "without": the base's MLM head
    probe = out / "toyworld" / "knowledge" / "probe" / "cloze.de.jsonl"
    for name, run in (("with graph", "kadapter_cloze"), ("without graph", "ernie1_tiny_nograph")):
        got = evaluate_cloze(str(out / run), str(probe), sentence=CLOZE_WORDINGS["text wording"])
        row = runs[f"kadapter {name}"]["cloze"]["text wording"]["per_language"]["de"]
        assert row == {g: got["by_facts"][g]["p@1"] for g in GROUPS}
    chain = {k: out / k for k in ("ernie1_tiny_nograph", "kadapter_facts", "kadapter_cloze")}
    tuned = {f"{tag}_{t}": out / f"kadapter_{tag}_{t}"
             for tag in ("graph", "nograph") for t in ("typing", "relations")}  # fmt: skip
    sd = {k: checkpoint.read(str(r)).model for k, r in {**chain, **tuned}.items()}
    base = base_of(sd["ernie1_tiny_nograph"])
    for k in sd:  # the frozen base is the plain MLM run's, tensor for tensor, in every run
        assert equal_sd(base_of(sd[k]), base), k
    # each adapter learnt in its own step, away from its near-identity start (std 2e-4)
    assert sd["kadapter_facts"]["fusion.adapters.facts.layers.0.up.weight"].abs().mean() > 1e-3
    facts_before, facts_after = sd["kadapter_facts"], sd["kadapter_cloze"]
    assert equal_sd(adapter_of(facts_after, "facts"), adapter_of(facts_before, "facts"))
    assert sd["kadapter_cloze"]["fusion.adapters.cloze.layers.0.up.weight"].abs().mean() > 1e-3
    # the two arms' fine-tunings start from the chain and from the base respectively
    for task in ("typing", "relations"):
        with_cfg = load_run_config(str(out / f"kadapter_graph_{task}" / "config.yaml"))
        without = load_run_config(str(out / f"kadapter_nograph_{task}" / "config.yaml"))
        assert (with_cfg.init, without.init) == (str(chain["kadapter_cloze"]),
                                                 str(chain["ernie1_tiny_nograph"]))  # fmt: skip
        assert set(without.model.fusion.adapters) == {"facts", "cloze"}  # same shape, untrained
        fresh = sd[f"nograph_{task}"]["fusion.adapters.facts.layers.0.up.weight"]
        assert fresh.abs().mean() < 1e-3  # 2 fine-tuning steps under warm-up: near its start
    assert "kadapter with graph" in capsys.readouterr().out
