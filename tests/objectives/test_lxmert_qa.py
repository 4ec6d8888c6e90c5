"""LXMERT's image-QA pre-training task: the vqa head on the questions of a VQA-style source,
matched pairs only, beside the caption source; the head and its answer list carry over to
VQA fine-tuning.

Legend: B batch, D width, A answers.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_overrides

from mmptm.converters.answers import build_answer_vocab, shard_answers, write_answer_vocab
from mmptm.data.pipeline import Loader, stream_config
from mmptm.encoders.base import VocabInfo
from mmptm.fusion.base import FusionOutput
from mmptm.models.load import build_model, count_parameters, load_pretrained
from mmptm.models.pretrain import data_transforms
from mmptm.objectives.vqa import VQAHead
from mmptm.recipe import load_run_config
from mmptm.train.trainer import pretrain

WIDTH = 8


def _bce_by_hand(logits_BA: torch.Tensor, targets_BA: torch.Tensor) -> float:
    """Σ over answers of -[t log σ(x) + (1 - t) log(1 - σ(x))], averaged over the rows."""
    total = 0.0
    for x_row, t_row in zip(logits_BA.tolist(), targets_BA.tolist()):
        for x, t in zip(x_row, t_row):
            p = 1 / (1 + math.exp(-x))
            total -= t * math.log(p) + (1 - t) * math.log(1 - p)
    return total / len(logits_BA)


def test_only_matched_pairs_are_answered() -> None:
    torch.manual_seed(0)
    head = VQAHead(VQAHead.Config(num_answers=3), width=WIDTH)
    out = FusionOutput(hidden={}, mask={}, pooled={"joint": torch.randn(4, WIDTH)})
    targets = torch.tensor([[1.0, 0, 0], [0, 0.3, 1], [0, 0, 0], [0.6, 0, 0.3]])
    logits = head.logits(out).detach()
    plain = head(out, {"vqa_targets": targets})["loss"].item()
    assert plain == pytest.approx(_bce_by_hand(logits, targets), rel=1e-5)
    itm = torch.tensor([1, 0, 1, 0])  # rows 1 and 3: questions paired with another image
    got = head(out, {"vqa_targets": targets, "itm_labels": itm})
    assert got["loss"].item() == pytest.approx(_bce_by_hand(logits[[0, 2]], targets[[0, 2]]),
                                               rel=1e-5)  # fmt: skip
    assert got["score"].item() == pytest.approx(
        (targets[0, logits[0].argmax()] + targets[2, logits[2].argmax()]).item() / 2
    )
    none = head(out, {"vqa_targets": targets, "itm_labels": torch.zeros(4, dtype=torch.long)})
    assert none["loss"].item() == 0 and none["loss"].requires_grad


@pytest.fixture(scope="module")
def answers(tiny_world, tmp_path_factory):
    path = tmp_path_factory.mktemp("answers") / "answers.txt"
    write_answer_vocab(
        build_answer_vocab(shard_answers([f"{tiny_world}/vqa/train-*.tar"]), min_count=1), path
    )
    return path


def _overrides(tiny_world, out, answers) -> list[str]:
    return [*tiny_overrides(tiny_world, out, "lxmert_full_tiny"),
            f"model.objectives.vqa.answers={answers}"]  # fmt: skip


def test_captions_and_questions_train_every_weight_qa_on_questions_only(
    tiny_world, tmp_path, answers
):
    cfg = load_run_config("lxmert_full_tiny", _overrides(tiny_world, tmp_path, answers))
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    stream = stream_config(
        cfg.data, tok, needs=model.data_needs(),
        transforms=data_transforms(cfg.model, VocabInfo.from_tokenizer(tok)),
    )  # fmt: skip
    batches = {}
    for _, batch in zip(range(50), Loader(stream, 0)):
        batches.setdefault(batch["__source__"], batch)
    assert set(batches) == {"captions", "questions"}
    assert "answers" not in batches["captions"] and "vqa_targets" in batches["questions"]
    model.train()
    terms = {}
    for source, batch in batches.items():
        out = model(batch)
        out.loss.backward()
        terms[source] = out.terms
    assert "vqa_loss" not in terms["captions"]
    assert torch.isfinite(terms["questions"]["vqa_loss"]) and terms["questions"]["vqa_loss"] > 0
    assert {"mlm_loss", "itm_loss", "mrc_loss", "mrfr_loss"} <= set(terms["questions"])
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing


def test_the_answer_head_carries_over_to_vqa_fine_tuning(tiny_world, tmp_path, answers):
    pre = tmp_path / "lxmert_full"
    over = [*_overrides(tiny_world, pre, answers), "train.max_steps=3", "train.ckpt_every=3"]
    pretrain(load_run_config("lxmert_full_tiny", over))
    ft = tmp_path / "vqa"
    ft_over = [f"init={pre}", f"output_dir={ft}", f"data.train={tiny_world}/vqa/train-*.tar",
               f"model.objectives.vqa.answers={answers}", "data.batch_size=8",
               "data.num_workers=0", "train.max_steps=1", "train.lr=0", "train.warmup_steps=0",
               "train.progress=false"]  # fmt: skip
    pretrain(load_run_config("vqa", ft_over))
    pre_model, _, _ = load_pretrained(str(pre))
    ft_model, _, _ = load_pretrained(str(ft))
    # lr 0: the fine-tuning step leaves the weights where init put them
    for name, p in pre_model.objectives["vqa"].state_dict().items():
        torch.testing.assert_close(ft_model.objectives["vqa"].state_dict()[name], p)


def test_lxmert_full_base_has_the_published_228m_parameters(tmp_path):
    """LXMERT reports 228M parameters: its 9 + 5 + 5 layers, BERT's 30522 word pieces and the
    QA head over 9500 answers (counted on the meta device)."""
    answers = tmp_path / "answers.txt"
    answers.write_text("".join(f"a{i}\n" for i in range(9500)))
    cfg = load_run_config("lxmert_full_base", [f"model.objectives.vqa.answers={answers}"])
    n = count_parameters(cfg, 30522)
    assert 226e6 < n < 230e6, n / 1e6
    head = 768 * 1536 + 1536 + 2 * 1536 + 1536 * 9500 + 9500  # Linear, LN, Linear
    assert n - count_parameters(load_run_config("lxmert_base"), 30522) == head


def test_a_late_start_trains_image_qa_only_from_its_step(tiny_world, tmp_path, answers):
    """``model.starts: {vqa: 0.5}`` (LXMERT's paper: image QA in the second half): the
    question batches of the first half train every other objective but not QA, and the
    answer head stays as initialised; from the half on, question batches train QA."""
    import json

    run = tmp_path / "late"
    over = [*_overrides(tiny_world, run, answers), "train.max_steps=12", "train.ckpt_every=6",
            "train.keep_checkpoints=0", "model.starts={vqa: 0.5}",
            "data.sources.questions.weight=4"]  # fmt: skip
    cfg = load_run_config("lxmert_full_tiny", over)
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    init_head = {k: v.clone() for k, v in model.objectives["vqa"].state_dict().items()}
    stream = stream_config(
        cfg.data, tok, needs=model.data_needs(),
        transforms=data_transforms(cfg.model, VocabInfo.from_tokenizer(tok)),
    )  # fmt: skip
    # the sources the run's steps read (the loader is seeded: the trainer reads the same)
    sources = [b["__source__"] for _, b in zip(range(12), Loader(stream, 0))]
    pretrain(cfg)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in rows if "mlm_loss" in r}
    assert sorted(steps) == list(range(1, 13))
    early = [s for s in range(1, 7) if sources[s - 1] == "questions"]
    late = [s for s in range(7, 13) if sources[s - 1] == "questions"]
    assert early and late  # the check below sees question batches on both sides
    assert not any("vqa_loss" in steps[s] for s in early)
    assert all("vqa_loss" in steps[s] for s in late)
    half = torch.load(run / "checkpoints" / "step_00000006.pt", map_location="cpu",
                      weights_only=False)["model"]  # fmt: skip
    for k, v in init_head.items():
        torch.testing.assert_close(half[f"objectives.vqa.{k}"], v)  # untouched until the half
    end = load_pretrained(str(run))[0].objectives["vqa"].state_dict()
    assert any(not torch.equal(end[k], v) for k, v in init_head.items())
    # fine-tuning from the run takes its architecture, not its schedule: VQA from step 1
    from mmptm.models.load import init_from

    ft = load_run_config("vqa", [f"init={run}", f"model.objectives.vqa.answers={answers}"])
    init_from(ft)
    assert ft.model.starts == {} and ft.model.fusion == cfg.model.fusion


@pytest.mark.parametrize(("starts", "message"), [
    ("{qa: 0.5}", "model.starts names 'qa'"),
    ("{vqa: 1.0}", "model.starts.vqa must be a share"),
])  # fmt: skip
def test_a_bad_start_is_named(tiny_world, tmp_path, answers, starts, message):
    over = [*_overrides(tiny_world, tmp_path, answers), f"model.starts={starts}"]
    with pytest.raises(ValueError, match=message):
        load_run_config("lxmert_full_tiny", over)


def test_the_study_counts_a_late_objective_for_the_steps_it_trains(tiny_world, tmp_path, answers):
    from mmptm.studies.vqa import model_budget

    over = [*_overrides(tiny_world, tmp_path, answers), "model.starts={vqa: 0.25}"]
    cfg = load_run_config("lxmert_full_tiny", over)
    shares = model_budget(build_model(cfg)[0], cfg)["objectives"]
    assert shares["vqa"] == 0.75 and shares["mlm"] == 1.0


def test_the_study_counts_a_routed_objective_for_its_sources_share(tiny_world, tmp_path, answers):
    from mmptm.studies.vqa import model_budget

    routes = "model.routes={captions: [itm, mlm, mrc, mrfr], questions: [mlm, mrc, mrfr, vqa]}"
    over = [*_overrides(tiny_world, tmp_path, answers), routes, "model.starts={vqa: 0.5}"]
    cfg = load_run_config("lxmert_full_tiny", over)
    shares = model_budget(build_model(cfg)[0], cfg)["objectives"]
    # captions : questions = 2 : 1 by batch (the recipe's source weights)
    assert shares == pytest.approx({"mlm": 1.0, "mrc": 1.0, "mrfr": 1.0, "itm": 2 / 3,
                                    "vqa": 1 / 3 * 0.5})  # fmt: skip
