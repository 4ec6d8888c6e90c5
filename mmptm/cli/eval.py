"""``mmptm eval TASK``: evaluate a checkpoint (retrieval, reversal, probes and clozes, link
prediction, XNLI, spans, VQA, cross-lingual retrieval, captioning, translation, zero-shot
cross-lingual transfer of any task head)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mmptm.cli.flags import decoding_arguments, decoding_config, device
from mmptm.registry import comma_list, default_of

_SPLITS = ["train", "val", "test"]


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``mmptm eval ...``."""
    sub.add_parser("eval", help="evaluate a checkpoint", fill=_fill)


def _fill(ev: argparse.ArgumentParser) -> None:
    ev_sub = ev.add_subparsers(dest="task", required=True)
    adds = (_retrieval, _reversal, _probe, _link_prediction, _xnli, _spans, _vqa, _xret,
            _captioning, _translation, _transfer, _pair_tasks, _bucc)  # fmt: skip
    for add in adds:
        add(ev_sub)


def _run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run directory or checkpoint file")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the saved config")


def _retrieval(ev_sub: argparse._SubParsersAction) -> None:
    from mmptm.eval.retrieval import evaluate_retrieval as fn

    er = ev_sub.add_parser(
        "retrieval", help="item (image, video, ...) ↔ text R@1/5/10 and median rank"
    )
    _run_arguments(er)
    er.add_argument("--split", default=default_of(fn, "split"), choices=_SPLITS)
    er.add_argument("--shards", default=None, help="shard spec instead of the split's")
    er.add_argument("--language", default=None, help="caption language (default: first)")
    er.add_argument("--max-items", type=int, default=default_of(fn, "max_items"))
    er.add_argument("--batch-size", type=int, default=default_of(fn, "batch_size"))
    er.add_argument("--rerank-k", type=int, default=default_of(fn, "rerank_k"),
                    help="re-rank the top-k with ITM")  # fmt: skip
    er.add_argument("--itm-all", action="store_true",
                    help="score every item-text pair with ITM (UNITER's protocol: N² fused "
                    "pairs)")  # fmt: skip
    er.add_argument("--captions", type=int, default=default_of(fn, "captions"),
                    help="captions per item (Clotho, AudioCaps: 5): every one is a query; adds "
                    "mAP@10")  # fmt: skip
    er.add_argument("--out", default=None, help="also write the result as JSON here")
    er.set_defaults(fn=_eval_retrieval)


def _eval_retrieval(args: argparse.Namespace) -> int:
    from mmptm.eval.retrieval import evaluate_retrieval, format_table

    overrides = list(args.overrides)
    if args.language:  # evaluation reads the first caption language
        overrides.append(f"data.modalities.text.caption_languages=[{args.language}]")
    result = evaluate_retrieval(
        args.run,
        split=args.split,
        shards=args.shards,
        max_items=args.max_items,
        batch_size=args.batch_size,
        rerank_k=args.rerank_k,
        overrides=overrides,
        captions=args.captions,
        itm_all=args.itm_all,
    )
    print(format_table({Path(args.run).name or args.run: result}))
    if result.get("fused_pairs"):
        print(f"{result['fused_pairs']:.0f} pairs through the fusion model, {result['seconds']} s")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


def _reversal(ev_sub: argparse._SubParsersAction) -> None:
    from mmptm.eval.retrieval import evaluate_reversal as fn

    rv = ev_sub.add_parser(
        "reversal", help="video: own caption vs. the caption of the clip played backwards"
    )
    _run_arguments(rv)
    rv.add_argument("--split", default=default_of(fn, "split"), choices=_SPLITS)
    rv.add_argument("--shards", default=None, help="shard spec instead of the split's")
    rv.add_argument("--language", default=None, help="caption language (default: first)")
    rv.add_argument("--field", default=default_of(fn, "field"),
                    help="json field of the negatives")  # fmt: skip
    rv.add_argument("--max-items", type=int, default=default_of(fn, "max_items"))
    rv.add_argument("--batch-size", type=int, default=default_of(fn, "batch_size"))
    rv.set_defaults(fn=_eval_reversal)


def _eval_reversal(args: argparse.Namespace) -> int:
    from mmptm.eval.retrieval import evaluate_reversal

    overrides = list(args.overrides)
    if args.language:
        overrides.append(f"data.modalities.text.caption_languages=[{args.language}]")
    result = evaluate_reversal(
        args.run, split=args.split, shards=args.shards, max_items=args.max_items,
        batch_size=args.batch_size, field=args.field, overrides=overrides,
    )  # fmt: skip
    name = Path(args.run).name or args.run
    print(f"{name}: reversal accuracy {100 * result['reversal_acc']:.1f}% over "
          f"{int(result['n'])} clips (a bag of frames scores 50%)")  # fmt: skip
    print(json.dumps(result))
    return 0


def _probe(ev_sub: argparse._SubParsersAction) -> None:
    from mmptm.eval.cloze import evaluate_cloze as cloze
    from mmptm.eval.probe import evaluate_probe

    pr = ev_sub.add_parser(
        "probe", help="linear-probe accuracy of a frozen encoder's vectors on json labels"
    )
    _run_arguments(pr)
    pr.add_argument("--train", default=None, help="shards the probe is fitted on")
    pr.add_argument("--test", default=None, help="shards it is scored on")
    pr.add_argument("--folds", nargs="+", default=None,
                    help="k-fold protocol (ESC-50): one spec per fold")  # fmt: skip
    pr.add_argument("--view", default=default_of(evaluate_probe, "view"),
                    help="encoder to probe (default: first non-text)")  # fmt: skip
    pr.add_argument("--label-names", default="",
                    help="comma list of the json label values in index order (default: the "
                    "recipe's data.modalities.label.names)")  # fmt: skip
    pr.add_argument("--random-init", action="store_true",
                    help="probe the untrained architecture instead")  # fmt: skip
    pr.add_argument("--out", default=None, help="also write the result as JSON here")
    pr.add_argument(
        "--cloze",
        nargs="+",
        default=None,
        help="LAMA T-REx jsonl files: cloze P@1/P@10/MRR instead of a linear probe",
    )
    pr.add_argument(
        "--candidates",
        default=None,
        help="cloze: candidate objects (.txt one per line, or .json [labels] or "
        "{predicate_id: [labels]}); default: each relation's answers in the file",
    )
    pr.add_argument("--language", default=default_of(cloze, "language"),
                    help="cloze: the queries' language (default: NAME.<lang>.jsonl)")  # fmt: skip
    pr.add_argument(
        "--group-by",
        default=",".join(default_of(cloze, "group_by")),
        help="cloze: comma list of line fields to break the metrics down by",
    )
    pr.add_argument("--sentence", type=int, default=None,
                    help="cloze: score each line's masked sentence of this index alone "
                    "(default: the mean over all of them)")  # fmt: skip
    pr.add_argument("--batch-size", type=int, default=default_of(cloze, "batch_size"),
                    help="cloze: sequences per batch")  # fmt: skip
    pr.add_argument("--device", type=device, default=default_of(cloze, "device"),
                    help="cloze: cpu, cuda, ...")  # fmt: skip
    pr.set_defaults(fn=_eval_probe)


def _eval_probe(args: argparse.Namespace) -> int:
    from mmptm.eval.probe import evaluate_probe, format_probe, probe_folds

    if args.cloze:
        return _eval_cloze(args)
    if bool(args.folds) == bool(args.train or args.test):
        raise SystemExit("mmptm eval probe: give --train and --test, or --folds (not both)")
    overrides = list(args.overrides)
    if args.label_names:  # json `label` values, in index order
        names = ", ".join(json.dumps(n) for n in args.label_names.split(","))
        overrides.append(f"data.modalities.label.names=[{names}]")
    common = dict(view=args.view, overrides=overrides, random_init=args.random_init)
    if args.folds:
        result = probe_folds(args.run, folds=args.folds, **common)
    else:
        if not (args.train and args.test):
            raise SystemExit("mmptm eval probe: --train and --test go together")
        result = evaluate_probe(args.run, train=args.train, test=args.test, **common)
    name = (Path(args.run).name or args.run) + (" (random init)" if args.random_init else "")
    print(format_probe({name: result}))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


def _eval_cloze(args: argparse.Namespace) -> int:
    from mmptm.eval.cloze import evaluate_cloze, format_cloze
    from mmptm.models.load import load_pretrained

    loaded = load_pretrained(args.run, args.overrides)
    groups = comma_list(args.group_by)
    results = {}
    for file in args.cloze:
        r = evaluate_cloze(args.run, file, language=args.language, candidates=args.candidates,
                           group_by=groups, model=loaded, batch_size=args.batch_size,
                           device=args.device, sentence=args.sentence)  # fmt: skip
        print(f"{file} ({r['language']})\n{format_cloze(r)}")
        results[file] = r
    result = results[args.cloze[0]] if len(results) == 1 else results
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _link_prediction(ev_sub: argparse._SubParsersAction) -> None:
    from mmptm.eval.kepler import kepler_link_prediction as fn

    lp = ev_sub.add_parser(
        "link-prediction", help="KEPLER: entities encoded from their descriptions, TransE ranks"
    )
    lp.add_argument("run", help="run directory or checkpoint file")
    lp.add_argument("--graph", required=True, help="graph folder (its SPLIT.txt is ranked)")
    lp.add_argument("--descriptions", default=None, help="default: GRAPH/descriptions.txt")
    lp.add_argument("--split", default=default_of(fn, "split"))
    lp.add_argument("--max-triples", type=int, default=default_of(fn, "max_triples"),
                    help="the first N only (0: all)")  # fmt: skip
    lp.set_defaults(fn=_eval_link_prediction)


def _eval_link_prediction(args: argparse.Namespace) -> int:
    from mmptm.eval.kepler import kepler_link_prediction_run
    from mmptm.eval.link_prediction import format_link_prediction

    result = kepler_link_prediction_run(args.run, args.graph, descriptions=args.descriptions,
                                        split=args.split, max_triples=args.max_triples)  # fmt: skip
    print(format_link_prediction(result, args.split))
    print(json.dumps(result))
    return 0


def _xnli(ev_sub: argparse._SubParsersAction) -> None:
    ex = ev_sub.add_parser("xnli", help="accuracy per language of a fine-tuned classifier")
    _run_arguments(ex)
    ex.add_argument("--set", action="append", help="NAME=SHARDS (default: the run's data.eval)")
    ex.set_defaults(fn=_eval_xnli)


def _eval_xnli(args: argparse.Namespace) -> int:
    from mmptm.eval.classification import evaluate_classification, format_accuracy

    sets = dict(s.split("=", 1) for s in args.set) if args.set else None
    result = evaluate_classification(args.run, sets, args.overrides)
    print(format_accuracy({Path(args.run).name or args.run: result}))
    print(json.dumps(result))
    return 0


def _spans(ev_sub: argparse._SubParsersAction) -> None:
    from mmptm.eval.spans import evaluate_spans as fn

    sp = ev_sub.add_parser(
        "spans", help="entity typing / relation classification metrics of a fine-tuned head"
    )
    _run_arguments(sp)
    sp.add_argument("--shards", default=None, help="shards to score (default: the run's data.eval)")
    sp.add_argument("--set", action="append", help="NAME=SHARDS, repeatable")
    sp.add_argument("--group-by", default=",".join(default_of(fn, "group_by")),
                    help="comma list of json fields")  # fmt: skip
    sp.add_argument("--device", type=device, default=default_of(fn, "device"))
    sp.add_argument("--out", default=None, help="also write the result as JSON here")
    sp.set_defaults(fn=_eval_spans)


def _eval_spans(args: argparse.Namespace) -> int:
    from mmptm.eval.spans import evaluate_spans, format_spans

    sets = dict(s.split("=", 1) for s in args.set or [])
    if args.shards:
        sets["test"] = args.shards
    groups = comma_list(args.group_by)
    result = evaluate_spans(args.run, sets or None, group_by=groups, overrides=args.overrides,
                            device=args.device)  # fmt: skip
    print(format_spans(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _vqa(ev_sub: argparse._SubParsersAction) -> None:
    from mmptm.eval.vqa import evaluate_vqa as fn

    vq = ev_sub.add_parser("vqa", help="VQA accuracy; --results writes the official format")
    _run_arguments(vq)
    vq.add_argument("--split", default=default_of(fn, "split"), choices=_SPLITS)
    vq.add_argument("--shards", default=None)
    vq.add_argument("--results", default=None, help='write [{"question_id", "answer"}] here')
    vq.set_defaults(fn=_eval_vqa)


def _eval_vqa(args: argparse.Namespace) -> int:
    from mmptm.eval.vqa import evaluate_vqa

    result = evaluate_vqa(
        args.run, split=args.split, shards=args.shards, results_file=args.results,
        overrides=args.overrides,
    )  # fmt: skip
    print(json.dumps(result))
    return 0


def _pair_tasks(ev_sub: argparse._SubParsersAction) -> None:
    """``mmptm eval refexp``, ``nlvr2`` and ``vcr``: accuracy of a fine-tuned run."""
    helps = {"refexp": "referring expressions: accuracy at IoU >= 0.5 (region_selection)",
             "nlvr2": "NLVR2: accuracy of the true/false judgements (image_pair)",
             "vcr": "VCR: Q->A, QA->R and Q->AR accuracy (multiple_choice)"}  # fmt: skip
    for task, text in helps.items():
        p = ev_sub.add_parser(task, help=text)
        _run_arguments(p)
        p.add_argument("--split", default="test", choices=_SPLITS)
        p.add_argument("--shards", default=None, help="a shard spec instead of the split's")
        p.add_argument("--set", action="append", help="NAME=SHARDS, repeatable (RefCOCO's "
                       "testA, testB): one result per set")  # fmt: skip
        p.set_defaults(fn=_eval_pair_task)


def _eval_pair_task(args: argparse.Namespace) -> int:
    from mmptm.eval.nlvr2 import evaluate_nlvr2
    from mmptm.eval.refexp import evaluate_refexp
    from mmptm.eval.vcr import evaluate_vcr

    fn = {"refexp": evaluate_refexp, "nlvr2": evaluate_nlvr2, "vcr": evaluate_vcr}[args.task]
    if not args.set:
        print(json.dumps(fn(args.run, split=args.split, shards=args.shards,
                            overrides=args.overrides)))  # fmt: skip
        return 0
    if args.shards:
        raise ValueError("give --shards or --set NAME=SHARDS, not both")
    sets = _named_sets(args.set)
    print(json.dumps({name: fn(args.run, shards=spec, overrides=args.overrides)
                      for name, spec in sets.items()}))  # fmt: skip
    return 0


def _named_sets(items: list[str]) -> dict[str, str]:
    """``NAME=SHARDS`` flags as a mapping; a one-line error for one without ``=``."""
    bad = [s for s in items if "=" not in s or not s.split("=", 1)[0]]
    if bad:
        raise ValueError(f"--set {bad[0]!r}: expected NAME=SHARDS")
    return dict(s.split("=", 1) for s in items)


def _xret(ev_sub: argparse._SubParsersAction) -> None:
    from mmptm.eval.xlingual import evaluate_xlingual_vectors as fn

    xr = ev_sub.add_parser("xret", help="cross-lingual sentence retrieval (Tatoeba protocol)")
    _run_arguments(xr)
    xr.add_argument("--shards", required=True, help="parallel-text shards")
    xr.add_argument("--pivot", default=default_of(fn, "pivot"))
    xr.add_argument("--max-items", type=int, default=default_of(fn, "max_per_language"),
                    help="pairs per language (0: all; Tatoeba has 1000)")  # fmt: skip
    xr.add_argument("--pooling", default="auto",
                    help="auto (the aligned vector, if the recipe trains one, and the last "
                    "layer's mean) | mean | first | an aligned objective's name")  # fmt: skip
    xr.add_argument(
        "--layer",
        type=int,
        default=default_of(fn, "layer"),
        help="for mean/first: 0 = embeddings, k = block k, -1 = last (default)",
    )
    xr.add_argument("--direction", default=default_of(fn, "direction"),
                    choices=["both", "to-pivot", "from-pivot"],
                    help="both averaged, or one way: to-pivot is XTREME's Tatoeba (each "
                    "sentence's nearest English)")  # fmt: skip
    xr.add_argument("--center", action="store_true",
                    help="subtract each language's mean vector before the cosine (Libovický et "
                    "al. 2020)")  # fmt: skip
    xr.set_defaults(fn=_eval_xret)


def _eval_xret(args: argparse.Namespace) -> int:
    from mmptm.eval.classification import format_accuracy
    from mmptm.eval.xlingual import evaluate_xlingual_vectors

    # auto: the vector the recipe aligned and, beside it, the mean of the last layer
    poolings = ["auto", "mean"] if args.pooling == "auto" else [args.pooling]
    result = evaluate_xlingual_vectors(
        args.run, args.shards, poolings=poolings, layer=args.layer, pivot=args.pivot,
        max_per_language=args.max_items, overrides=args.overrides, center=args.center,
        direction=args.direction,
    )  # fmt: skip
    way = {"both": "both directions", "to-pivot": f"each language → {args.pivot}",
           "from-pivot": f"{args.pivot} → each language"}[args.direction]  # fmt: skip
    print(f"{Path(args.run).name or args.run}: accuracy, {way}, per language")
    print(format_accuracy(result))
    print(json.dumps(result))
    return 0


def _bucc(ev_sub: argparse._SubParsersAction) -> None:
    from mmptm.eval.bucc import evaluate_bucc as fn

    b = ev_sub.add_parser(
        "bucc", help="BUCC bitext mining F1 (margin scores; threshold chosen on --dev)"
    )
    _run_arguments(b)
    b.add_argument("--dev", required=True, help="BUCC shards where the threshold is chosen "
                   "(BUCC's sample split)")  # fmt: skip
    b.add_argument("--test", default=None, help="BUCC shards scored at that threshold "
                   "(XTREME: BUCC's training split); default: --dev's own best F1")  # fmt: skip
    b.add_argument("--pooling", default=default_of(fn, "pooling"),
                   help="mean | first | auto | an aligned objective's name")  # fmt: skip
    b.add_argument("--layer", type=int, default=default_of(fn, "layer"),
                   help="for mean/first: 0 = embeddings, k = block k, -1 = last (default); "
                   "XTREME reads layer 7 of 12")  # fmt: skip
    b.add_argument("--k", type=int, default=default_of(fn, "k"), help="margin neighbours")
    b.add_argument("--out", default=None, help="also write the result as JSON here")
    b.set_defaults(fn=_eval_bucc)


def _eval_bucc(args: argparse.Namespace) -> int:
    from mmptm.eval.bucc import evaluate_bucc, format_bucc

    result = evaluate_bucc(args.run, args.dev, args.test, pooling=args.pooling, layer=args.layer,
                           k=args.k, overrides=args.overrides)  # fmt: skip
    print(f"{Path(args.run).name or args.run}: BUCC F1 per language ({result['vector']})")
    print(format_bucc(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


def _generation_arguments(p: argparse.ArgumentParser, fn) -> None:
    _run_arguments(p)
    p.add_argument("--split", default=default_of(fn, "split"), choices=_SPLITS)
    p.add_argument("--shards", default=None, help="shard spec instead of the split's")
    p.add_argument("--limit", type=int, default=None, help="samples at most")
    p.add_argument("--batch-size", type=int, default=default_of(fn, "batch_size"))
    p.add_argument("--device", type=device, default="cpu")
    p.add_argument("--out", default=None, help="also write the result as JSON here")
    decoding_arguments(p)


def _captioning(ev_sub: argparse._SubParsersAction) -> None:
    from mmptm.eval.text_generation import evaluate_captioning as fn

    c = ev_sub.add_parser("captioning", help="captions written for a split: BLEU-4, chrF, CIDEr-D")
    _generation_arguments(c, fn)
    c.add_argument("--lang", default=None, help="caption language (default: the run's first)")
    c.add_argument(
        "--no-baselines", action="store_true", help="skip the most-frequent-caption baseline"
    )
    c.set_defaults(fn=_eval_captioning)


def _eval_captioning(args: argparse.Namespace) -> int:
    from mmptm.eval.text_generation import evaluate_captioning

    result = evaluate_captioning(
        args.run, split=args.split, shards=args.shards, lang=args.lang,
        decoding=decoding_config(args), limit=args.limit, batch_size=args.batch_size,
        baselines=not args.no_baselines, overrides=args.overrides, device=args.device,
    )  # fmt: skip
    return _report(result, args.out)


def _translation(ev_sub: argparse._SubParsersAction) -> None:
    from mmptm.eval.text_generation import evaluate_translation as fn

    t = ev_sub.add_parser(
        "translation", help="translations of a split's parallel pairs: BLEU, chrF, baselines"
    )
    _generation_arguments(t, fn)
    t.add_argument("--src", required=True, help="the language translated from")
    t.add_argument("--tgt", required=True, help="the language translated into")
    t.add_argument(
        "--no-baselines", action="store_true", help="skip the copy and dictionary baselines"
    )
    t.set_defaults(fn=_eval_translation)


def _eval_translation(args: argparse.Namespace) -> int:
    from mmptm.eval.text_generation import evaluate_translation

    result = evaluate_translation(
        args.run, src=args.src, tgt=args.tgt, split=args.split, shards=args.shards,
        decoding=decoding_config(args), limit=args.limit, batch_size=args.batch_size,
        baselines=not args.no_baselines, overrides=args.overrides, device=args.device,
    )  # fmt: skip
    return _report(result, args.out)


def _report(result: dict, out: str | None) -> int:
    from mmptm.eval.text_generation import format_scores

    print(format_scores(result))
    if out:
        Path(out).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "examples"}))
    return 0


def _transfer(ev_sub: argparse._SubParsersAction) -> None:
    from mmptm.eval.transfer import evaluate_transfer as fn

    t = ev_sub.add_parser(
        "transfer", help="zero-shot cross-lingual transfer: a task head's scores per language "
        "and their average (XNLI, PAWS-X, WikiANN, UD-POS, XQuAD ...)",
    )  # fmt: skip
    t.add_argument("run", help="run directory or checkpoint (with --finetune: a recipe)")
    t.add_argument("overrides", nargs="*", help="key=value overrides (of the saved config, or "
                   "of the recipe with --finetune)")  # fmt: skip
    t.add_argument("--set", action="append", help="LANG=SHARDS, repeatable (default: the run's "
                   "data.eval)")  # fmt: skip
    t.add_argument(
        "--pattern",
        default=None,
        help="one shard spec with {lang}, e.g. data/wikiann/test-{lang}-*.tar",
    )
    t.add_argument("--languages", default="", help="comma list filling --pattern's {lang}")
    t.add_argument("--finetune", action="store_true",
                   help="RUN is a recipe: fine-tune it (init=...) on its data.train (English), "
                   "then evaluate every language")  # fmt: skip
    t.add_argument("--metric", default=None, choices=["squad", "mlqa"],
                   help="QA: SQuAD's answer normalisation or MLQA's (per language: the "
                   "samples' json language); sets the extractive_qa head's metric")  # fmt: skip
    t.add_argument("--device", type=device, default=default_of(fn, "device"))
    t.add_argument("--out", default=None, help="also write the result as JSON here")
    t.set_defaults(fn=_eval_transfer)


def _eval_transfer(args: argparse.Namespace) -> int:
    from mmptm.eval.transfer import evaluate_transfer, format_transfer, language_sets

    sets = dict(s.split("=", 1) for s in args.set or [])
    if args.pattern:
        languages = comma_list(args.languages)
        sets |= language_sets(args.pattern, languages)
    elif args.languages:
        raise ValueError("--languages fills --pattern's {lang}: give --pattern too")
    over = [*args.overrides, *_metric_overrides(args)]
    loaded = _finetuned(args.run, over) if args.finetune else None
    overrides = [] if args.finetune else over
    result = evaluate_transfer(args.run, sets or None, overrides=overrides, device=args.device,
                               model=loaded)  # fmt: skip
    name = Path(args.run).name or args.run
    print(format_transfer(result, f"{name}: {result['task']}, each set and the average"))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


def _metric_overrides(args: argparse.Namespace) -> list[str]:
    """``--metric`` as overrides of every extractive_qa head's ``metric`` (none without it)."""
    if not args.metric:
        return []
    if args.finetune:
        from mmptm.recipe import load_run_config

        cfg = load_run_config(args.run, args.overrides)
    else:
        from mmptm.models import checkpoint

        cfg = checkpoint.read(args.run, weights=False).run_config(args.overrides)
    names = [n for n, o in cfg.model.objectives.items() if o.type == "extractive_qa"]
    if not names:
        raise ValueError(f"--metric {args.metric}: {args.run} has no extractive_qa head")
    return [f"model.objectives.{n}.metric={args.metric}" for n in names]


def _finetuned(recipe: str, overrides: list[str]):
    """The (model, tokenizer, config) of ``recipe`` fine-tuned from its ``init`` run."""
    from mmptm.recipe import load_run_config
    from mmptm.train.trainer import Trainer

    cfg = load_run_config(recipe, overrides)
    if not cfg.init:
        raise ValueError(f"{recipe}: --finetune needs init=<run> (the pre-trained run)")
    trainer = Trainer(cfg)
    trainer.fit()
    return trainer.model, trainer.tokenizer, cfg
