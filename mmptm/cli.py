"""``mmptm``: the command line. Thin: each sub-command parses arguments and calls the library.

mmptm data toyworld --out DIR [--n-train N ...] [--views video,audio,speech,...] [--voice V]
mmptm data msrvtt|videos|video-features ... --out DIR
mmptm data clotho|audiocaps|esc50|librispeech ... --out DIR [--sample-rate HZ]
mmptm data typing|relations --input FILE --out DIR [--split train] [--lang en]
mmptm data link --input SHARDS --aliases [LANG=]FILE --out DIR [--case auto] [--field auto]
mmptm kg train-embeddings TRIPLES --out DIR [--model transe|distmult] [--mmap] [--device cuda]
mmptm tokenizer train --input PATH [PATH ...] --out PREFIX [--vocab-size N]
mmptm units fit --shards SPEC (--k K | --levels L --branch B) --out CODEBOOK.npy
                [--audio-features mfcc | --audio-features RUN --layer L]
mmptm pretrain CONFIG [key=value ...]
mmptm eval retrieval RUN_OR_CHECKPOINT [--split test] [key=value ...]
mmptm eval probe RUN --cloze FILE.jsonl [...] [--candidates FILE] [--group-by facts]
mmptm eval spans RUN [--shards SPEC | --set NAME=SPEC ...] [--group-by facts] [--out FILE]
mmptm plot RUN [RUN ...] --metric NAME_OR_GLOB [...] --out FILE.png [--smooth 0.6] [--x step]
mmptm index RUN --shards SPEC --out DIR [--add] [--index-type flat|ivf|hnsw]
mmptm retrieve INDEX "a red circle" | --image FILE | --key KEY [-k 10] [--lang de] [--json]
mmptm serve INDEX [--host 127.0.0.1] [--port 8000] [--device cpu] [--run RUN]
mmptm demo [--out runs/demo] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path


def _data_toyworld(args: argparse.Namespace) -> int:
    from mmptm import toyworld

    t0 = time.perf_counter()
    manifest = toyworld.generate(
        args.out,
        n_train=args.n_train,
        n_val=args.n_val,
        n_test=args.n_test,
        seed=args.seed,
        languages=tuple(args.languages.split(",")),
        image_size=args.image_size,
        shard_size=args.shard_size,
        views=_views(args.views, toyworld.VIEWS, toyworld.ALL_VIEWS),
        voice=args.voice,
        progress=not args.no_progress,
    )
    counts = manifest.get("counts", {})
    print(f"toyworld → {args.out}: {counts} in {time.perf_counter() - t0:.1f}s")
    return 0


def _views(spec: str | None, default: dict, every: dict) -> tuple[str, ...] | None:
    """--views: a comma list; "default" stands for the default views, "all" for every view."""
    if not spec:
        return None
    out: list[str] = []
    for name in spec.split(","):
        names = {"default": list(default), "all": list(every)}.get(name.strip(), [name.strip()])
        out += [n for n in names if n not in out]
    return tuple(out)


def _data_convert(args: argparse.Namespace) -> int:
    from mmptm.converters import text as converters

    if args.dataset == "parallel":
        langs = tuple(args.langs.split(","))
        if len(langs) != 2:
            raise ValueError(f"--langs needs two codes, got {args.langs!r}")
        if len(args.input) == 2:
            stats = converters.convert_parallel_files(
                *args.input, langs, args.out, split=args.split, shard_size=args.shard_size
            )
        elif len(args.input) == 1:
            stats = converters.convert_parallel_tsv(
                args.input[0], langs, args.out, split=args.split, shard_size=args.shard_size
            )
        else:
            raise ValueError("--input takes two line-aligned files or one TSV file")
    elif args.dataset == "text":
        stats = converters.convert_monolingual(
            args.input[0], args.lang, args.out, split=args.split, shard_size=args.shard_size
        )
    elif args.dataset == "coco":
        from mmptm.converters import vl as converters_vl

        stats = converters_vl.convert_coco_captions(
            args.input[0], args.images, args.out, split=args.split, shard_size=args.shard_size,
            regions_tsv=args.regions, progress=not args.no_progress,
        )  # fmt: skip
    elif args.dataset == "vqa":
        from mmptm.converters import vl as converters_vl

        questions, annotations = [*args.input, None][:2]
        stats = converters_vl.convert_vqa(
            questions, annotations, args.images, args.out, split=args.split,
            shard_size=args.shard_size, regions_tsv=args.regions, progress=not args.no_progress,
        )  # fmt: skip
    else:
        stats = converters.convert_xnli(
            args.input[0], args.out, split=args.split, language=args.lang,
            shard_size=args.shard_size,
        )  # fmt: skip
    print(json.dumps({k: v for k, v in stats.items() if not k.startswith("skipped_")}, indent=1))
    return 0


def _data_video(args: argparse.Namespace) -> int:
    from mmptm.converters import video as cv

    if args.dataset == "msrvtt":
        stats = cv.convert_msrvtt(
            args.videos, args.annotations, args.out, split=args.split, keys=args.keys,
            shard_size=args.shard_size, progress=not args.no_progress,
        )  # fmt: skip
    elif args.dataset == "videos":
        stats = cv.convert_video_csv(
            args.csv, args.video_dir, args.out, split=args.split, shard_size=args.shard_size,
            probe=not args.no_probe, progress=not args.no_progress,
        )  # fmt: skip
    else:
        stats = cv.convert_video_features(
            args.csv, args.features_dir, args.out, split=args.split, shard_size=args.shard_size,
            progress=not args.no_progress,
        )  # fmt: skip
    print(json.dumps({k: v for k, v in stats.items() if not k.startswith("skipped_")}, indent=1))
    return 0


def _data_answers(args: argparse.Namespace) -> int:
    from mmptm.objectives.vqa import build_answer_vocab, shard_answers, write_answer_vocab

    lists = shard_answers(args.input)
    vocab = build_answer_vocab(lists, min_count=args.min_count, top_k=args.top_k)
    write_answer_vocab(vocab, args.out)
    print(f"{len(vocab)} answers (of {len(lists)} questions) → {args.out}")
    return 0


def _data_spans(args: argparse.Namespace) -> int:
    from mmptm.converters.spans import convert_spans

    stats = convert_spans(args.task, args.input, args.out, split=args.split,
                          language=args.lang, shard_size=args.shard_size)  # fmt: skip
    print(json.dumps(stats, indent=1))
    return 0


def _eval_spans(args: argparse.Namespace) -> int:
    from mmptm.eval.spans import evaluate_spans, format_spans

    sets = dict(s.split("=", 1) for s in args.set or [])
    if args.shards:
        sets["test"] = args.shards
    groups = [g.strip() for g in args.group_by.split(",") if g.strip()]
    result = evaluate_spans(args.run, sets or None, group_by=groups, overrides=args.overrides,
                            device=args.device)  # fmt: skip
    print(format_spans(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _data_link(args: argparse.Namespace) -> int:
    from mmptm.converters.linking import link_shards, read_dictionaries

    dictionaries = read_dictionaries(args.aliases, args.case, args.triples, args.entities)
    languages = [x.strip() for x in args.languages.split(",") if x.strip()] or None
    stats = link_shards(args.input, args.out, dictionaries, languages=languages,
                        text_field=args.field, progress=not args.no_progress)  # fmt: skip
    summary = stats.summary()
    Path(args.out, "link.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


def _data_triples(args: argparse.Namespace) -> int:
    from mmptm.converters.triples import write_triple_shards

    descriptions = args.descriptions or str(Path(args.graph) / "descriptions.txt")
    counts = write_triple_shards(args.graph, descriptions, args.out, split=args.split,
                                 language=args.language, shard_size=args.shard_size)  # fmt: skip
    print(json.dumps(counts))
    return 0


def _eval_link_prediction(args: argparse.Namespace) -> int:
    from mmptm.eval.kepler import kepler_link_prediction_run

    result = kepler_link_prediction_run(args.run, args.graph, descriptions=args.descriptions,
                                        split=args.split, max_triples=args.max_triples)  # fmt: skip
    for side in ("tail", "head", "both"):
        m = result[side]
        print(
            f"{args.split} {side:>4}: MRR {m['mrr']:.4f}  Hits@1 {m['hits@1']:.4f}  "
            f"Hits@3 {m['hits@3']:.4f}  Hits@10 {m['hits@10']:.4f}  ({m['count']} queries)"
        )
    print(json.dumps(result))
    return 0


def _kg_train_embeddings(args: argparse.Namespace) -> int:
    from mmptm.train.kge import KGETrainConfig, train_embeddings

    # only the options given: the defaults live in one place, KGETrainConfig
    given = {k: v for k, v in vars(args).items() if k in KGETrainConfig.__dataclass_fields__}
    result = train_embeddings(args.triples, args.out, KGETrainConfig(**given),
                              progress=not args.no_progress)  # fmt: skip
    graph, train = result["graph"], result["train"]
    print(
        f"{graph['entities']} entities, {graph['relations']} relations, "
        f"{graph['train_triples']} training triples; {train['triples_per_s']:.0f} triples/s"
    )
    unknown = {k: v for k, v in graph.items() if k.endswith("_unknown")}
    if unknown:
        print(f"dropped (an entity or relation unknown to training): {unknown}")
    if "test" in result:
        for side in ("tail", "head", "both"):
            m = result["test"][side]
            print(
                f"test {side:>4}: MRR {m['mrr']:.4f}  Hits@1 {m['hits@1']:.4f}  "
                f"Hits@3 {m['hits@3']:.4f}  Hits@10 {m['hits@10']:.4f}  ({m['count']} queries)"
            )
    print(f"embeddings → {args.out} (entities.npy/.txt, relations.npy/.txt, kge.json)")
    return 0


def _eval_vqa(args: argparse.Namespace) -> int:
    from mmptm.eval.vqa import evaluate_vqa

    result = evaluate_vqa(
        args.run, split=args.split, shards=args.shards, results_file=args.results,
        overrides=args.overrides,
    )  # fmt: skip
    print(json.dumps(result))
    return 0


def _import_xlmr(args: argparse.Namespace) -> int:
    from mmptm.models.hf_import import import_xlmr

    path = import_xlmr(args.hf_dir, args.out, drop_prefixes=args.drop_prefix or ())
    print(f"imported {args.hf_dir} → {path} (use init={args.out})")
    return 0


def _import_wav2vec2(args: argparse.Namespace) -> int:
    from mmptm.models.hf_audio_import import import_wav2vec2

    path = import_wav2vec2(args.hf_dir, args.out, drop_prefixes=args.drop_prefix or ())
    print(f"imported {args.hf_dir} → {path} (use init={args.out})")
    return 0


def _import_open_clip(args: argparse.Namespace) -> int:
    from mmptm.models.open_clip_import import import_open_clip

    path = import_open_clip(
        args.checkpoint, args.model, args.out, config=args.config, vocab=args.vocab
    )
    print(f"imported {args.checkpoint} ({args.model}) → {path} (use {args.out} as a run)")
    return 0


def _tokenizer_train(args: argparse.Namespace) -> int:
    from mmptm.tokenizers.sentencepiece import train_tokenizer

    tok = train_tokenizer(
        args.input,
        args.out,
        vocab_size=args.vocab_size,
        languages=args.languages.split(",") if args.languages else None,
        model_type=args.model_type,
        seed=args.seed,
        fit_to_data=args.fit_to_data,
    )
    print(f"tokenizer → {args.out}.model: {tok}")
    return 0


def _units_fit(args: argparse.Namespace) -> int:
    from mmptm.train.units import fit_codebook

    kmeans = dict(
        k=args.k or 0, levels=args.levels, branch=args.branch or 0,
        max_vectors=args.max_vectors, iters=args.iters, seed=args.seed,
        progress=not args.no_progress,
    )  # fmt: skip
    if args.audio_features:  # HuBERT: the objective's own featurizer over decoded audio
        from mmptm.train.units import fit_audio_codebook

        record = fit_audio_codebook(
            args.shards, args.out, features=args.audio_features, layer=args.layer,
            member=args.member or "", device=args.device, **kmeans,
        )  # fmt: skip
    elif args.layer:
        raise ValueError("--layer goes with --audio-features RUN (a teacher run)")
    else:
        record = fit_codebook(
            args.shards, args.out, member=args.member or "npy", device=args.device, **kmeans
        )
    shown = {k: v for k, v in record.items() if k != "shards"}
    print(f"codebook → {args.out} ({Path(args.out).with_suffix('.json')}): {json.dumps(shown)}")
    return 0


def _pretrain(args: argparse.Namespace) -> int:
    from mmptm.recipe import load_run_config
    from mmptm.train.trainer import pretrain

    cfg = load_run_config(args.config, args.overrides)
    last = pretrain(cfg)
    print(json.dumps(last))
    return 0


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


def _eval_cloze(args: argparse.Namespace) -> int:
    from mmptm.eval.cloze import evaluate_cloze, format_cloze
    from mmptm.models.load import load_pretrained

    loaded = load_pretrained(args.run, args.overrides)
    groups = [g.strip() for g in args.group_by.split(",") if g.strip()]
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


def _index(args: argparse.Namespace) -> int:
    from mmptm.search.index import build_index
    from mmptm.search.store import IndexOptions

    fields = ("type", "nlist", "m", "ef_construction", "nprobe", "ef", "train_size")
    given = {f: getattr(args, f) for f in fields if getattr(args, f) is not None}
    summary = build_index(
        args.run, args.shards, args.out, add=args.add,
        options=IndexOptions(**given) if given else None, batch_size=args.batch_size,
        workers=args.workers, device=args.device, thumbnail_size=args.thumbnail_size,
        overrides=args.overrides,
    )  # fmt: skip
    print(f"{summary['added']} items → {args.out} ({summary['items']} in all; skipped: "
          f"{summary['skipped']}) in {summary['seconds']} s")  # fmt: skip
    print(json.dumps(summary, ensure_ascii=False))
    return 0


def _retrieve(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from mmptm.search.index import SearchIndex, format_hits

    asked = [n for n, v in (("QUERY", args.query), ("--image", args.image), ("--key", args.key))
             if v is not None]  # fmt: skip
    if len(asked) != 1:
        raise ValueError(f"give one of QUERY, --image FILE, --key KEY (got {asked or 'none'})")
    if asked[0] != "QUERY" and (args.rerank_k or args.query_lang):
        raise ValueError(f"--rerank-k and --query-lang go with a text QUERY, not {asked[0]}")
    image = Path(args.image).read_bytes() if args.image else None
    index = SearchIndex.open(args.index, device=args.device, run=args.run)
    if args.nprobe is not None or args.ef is not None:
        index.set_search(nprobe=args.nprobe, ef=args.ef)
    common = dict(k=args.k, side=args.side, lang=args.lang)
    t0 = time.perf_counter()
    try:
        if image is not None:
            hits = index.search_image(image, **common)
        elif args.key is not None:
            hits = index.search_key(args.key, **common)
        else:
            hits = index.search_text(
                args.query, rerank_k=args.rerank_k, query_lang=args.query_lang, **common
            )
    except KeyError as e:  # an unknown item key
        raise ValueError(e.args[0]) from None
    ms = 1000 * (time.perf_counter() - t0)
    if args.json:
        query = {"text": args.query, "image": args.image, "key": args.key}
        out = {"query": query, "ms": round(ms, 2), "hits": [asdict(h) for h in hits]}
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(format_hits(hits))
        print(f"{len(hits)} hits in {ms:.1f} ms")
    return 0


def _finetune(args: argparse.Namespace) -> int:
    from mmptm.eval.classification import evaluate_sets, format_accuracy
    from mmptm.eval.spans import evaluate_spans, format_spans, span_head
    from mmptm.recipe import load_run_config
    from mmptm.train.trainer import Trainer

    cfg = load_run_config(args.config, args.overrides)
    if not cfg.init:
        raise ValueError("finetune needs init=<checkpoint or run dir> (init_mode=architecture "
                         "trains the same shape from scratch)")  # fmt: skip
    trainer = Trainer(cfg)
    trainer.fit()
    if trainer.dist.main and cfg.data.eval and span_head(trainer.model):
        spans = evaluate_spans("", model=(trainer.model, trainer.tokenizer, cfg))
        (Path(cfg.output_dir) / "eval.json").write_text(json.dumps(spans, indent=2) + "\n")
        print(format_spans(spans))
    elif trainer.dist.main and cfg.data.eval:
        result = evaluate_sets(trainer.model, cfg, trainer.tokenizer, cfg.data.eval)
        (Path(cfg.output_dir) / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
        print(format_accuracy({Path(cfg.output_dir).name: result}))
    return 0


def _eval_xnli(args: argparse.Namespace) -> int:
    from mmptm.eval.classification import evaluate_classification, format_accuracy

    sets = dict(s.split("=", 1) for s in args.set) if args.set else None
    result = evaluate_classification(args.run, sets, args.overrides)
    print(format_accuracy({Path(args.run).name or args.run: result}))
    print(json.dumps(result))
    return 0


def _eval_xret(args: argparse.Namespace) -> int:
    from mmptm.eval.classification import format_accuracy
    from mmptm.eval.xlingual import evaluate_xlingual_vectors

    # auto: the vector the recipe aligned and, beside it, the mean of the last layer
    poolings = ["auto", "mean"] if args.pooling == "auto" else [args.pooling]
    result = evaluate_xlingual_vectors(
        args.run, args.shards, poolings=poolings, layer=args.layer, pivot=args.pivot,
        max_per_language=args.max_items, overrides=args.overrides, center=args.center,
    )  # fmt: skip
    print(f"{Path(args.run).name or args.run}: accuracy, both directions, per language")
    print(format_accuracy(result))
    print(json.dumps(result))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from mmptm.eval.curves import plot_curves

    out = plot_curves(
        args.runs, args.metric or ["*loss"], args.out, smoothing=args.smooth, x=args.x,
        log_y=args.log_y, title=args.title,
    )  # fmt: skip
    print(f"curves of {len(args.runs)} run(s) → {out}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from mmptm import studies

    out = Path(args.out or f"runs/demo-{args.study}")
    if args.study == "clip":
        studies.clip_study(
            out, n_train=args.n_train, n_test=args.n_test, steps=args.steps, seed=args.seed,
            overrides=args.overrides,
        )  # fmt: skip
    elif args.study == "video":
        studies.video_study(
            out, recipes=tuple(args.recipes.split(",")) if args.recipes else ("videoclip_tiny",),
            n_train=args.n_train, n_test=args.n_test, steps=args.steps,
            qa_steps=args.qa_steps, seed=args.seed, overrides=args.overrides,
        )  # fmt: skip
    elif args.study == "audio":
        studies.audio_study(
            out, recipes=tuple(args.recipes.split(",")) if args.recipes else studies.AUDIO_DEMO,
            n_train=args.n_train, n_test=args.n_test, steps=args.steps,
            ft_steps=args.ft_steps or 600, seed=args.seed,
            overrides=args.overrides,
        )  # fmt: skip
    elif args.study == "knowledge":
        from mmptm.studies.knowledge import KNOWLEDGE_DEMO, knowledge_study

        knowledge_study(
            out, recipes=tuple(args.recipes.split(",")) if args.recipes else KNOWLEDGE_DEMO,
            n_train=args.n_train, n_test=args.n_test, steps=args.steps or 1200,
            ft_steps=args.ft_steps or None, seed=args.seed, overrides=args.overrides,
        )  # fmt: skip
    elif args.study == "vqa":
        studies.vqa_study(
            out, recipes=tuple(args.recipes.split(",")) if args.recipes else studies.VL_RECIPES,
            n_train=args.n_train,
            n_test=args.n_test, steps=args.steps or 1000, ft_steps=args.ft_steps or 1500,
            seeds=tuple(range(args.seeds)), seed=args.seed, overrides=args.overrides,
            retrieval_items=args.n_test if args.retrieval_items is None else args.retrieval_items,
        )  # fmt: skip
    else:
        studies.multilingual_study(
            out, n_train=args.n_train, n_test=args.n_test, steps=args.steps or 2000,
            ft_steps=args.ft_steps or 1500, seeds=tuple(range(args.seeds)), seed=args.seed,
            overrides=args.overrides,
        )  # fmt: skip
    return 0


def _serve(args: argparse.Namespace) -> int:
    from mmptm.search.serve import serve

    def ready(url: str) -> None:
        print(f"serving {args.index} at {url} (the search page; the API is under {url}api/, "
              f"its schema at {url}openapi.json); Ctrl+C stops", flush=True)  # fmt: skip

    serve(args.index, host=args.host, port=args.port, device=args.device, run=args.run,
          log_level="debug" if args.verbose else "info", on_ready=ready)  # fmt: skip
    return 0


# --------------------------------------------------------------------------------------------
# mmptm data clotho|audiocaps|esc50|librispeech (audio corpora → flac + json shards)


def _data_audio(args: argparse.Namespace) -> int:
    from mmptm.converters import audio as ca

    common = dict(
        sample_rate=args.sample_rate, probe=not args.no_probe, progress=not args.no_progress,
        shard_size=ca.DEFAULT_SHARD_SIZE if args.shard_size is None else args.shard_size,
    )  # fmt: skip
    if args.dataset == "clotho":
        stats = ca.convert_clotho(args.csv, args.audio_dir, args.out, split=args.split, **common)
    elif args.dataset == "audiocaps":
        stats = ca.convert_audiocaps(args.csv, args.audio_dir, args.out, split=args.split, **common)
    elif args.dataset == "esc50":
        stats = ca.convert_esc50(args.root, args.out, **common)
    else:
        stats = ca.convert_librispeech(args.root, args.out, split=args.split, **common)
    print(ca.format_summary(args.dataset, args.out, stats))
    print(json.dumps({k: v for k, v in stats.items() if not k.startswith("skipped_")}, indent=1))
    return 0


def _audio_parsers(data_sub: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", required=True, help="shard folder")
    common.add_argument("--shard-size", type=int, default=None, help="clips (default 256)")
    common.add_argument("--sample-rate", type=int, default=None,
                        help="resample to this rate (default: keep each file's)")  # fmt: skip
    common.add_argument("--no-probe", action="store_true",
                        help="copy flac files after reading their header only "
                             "(default: decode each whole to find broken ones)")  # fmt: skip
    common.add_argument("--no-progress", action="store_true")
    split = "shard name prefix (default: from the {} name)"
    for name, help_, source in [
        ("clotho", "Clotho: clotho_captions_<split>.csv + its audio folder", "csv"),
        ("audiocaps", "AudioCaps: <split>.csv + a folder of clips named by youtube_id", "csv"),
        ("esc50", "ESC-50: meta/esc50.csv + audio/ → fold1/ ... fold5/ + labels.txt", "root"),
        ("librispeech", "LibriSpeech subset: <spk>/<chap>/*.flac + *.trans.txt", "root"),
    ]:
        c = data_sub.add_parser(name, help=help_, parents=[common])
        if source == "csv":
            c.add_argument("--csv", required=True)
            c.add_argument("--audio-dir", required=True)
            c.add_argument("--split", default=None, help=split.format("CSV file"))
        else:
            c.add_argument("--root", required=True, help="e.g. ESC-50-master, "
                           "LibriSpeech/train-clean-100")  # fmt: skip
            if name == "librispeech":
                c.add_argument("--split", default=None, help=split.format("root folder"))
        c.set_defaults(fn=_data_audio)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmptm", description=__doc__.split("\n\n")[0])
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = p.add_subparsers(dest="command", required=True)

    data = sub.add_parser("data", help="write data sets as webdataset shards")
    data_sub = data.add_subparsers(dest="dataset", required=True)
    tw = data_sub.add_parser("toyworld", help="the embedded, seeded toy data set")
    tw.add_argument("--out", required=True)
    tw.add_argument("--n-train", type=int, default=4000)
    tw.add_argument("--n-val", type=int, default=500)
    tw.add_argument("--n-test", type=int, default=500)
    tw.add_argument("--seed", type=int, default=0)
    tw.add_argument("--languages", default="en,de,fr,ru,es", help="comma list")
    tw.add_argument("--image-size", type=int, default=64)
    tw.add_argument("--shard-size", type=int, default=1000)
    tw.add_argument("--views", default=None,
                    help="comma list of views to write, e.g. video,video_features,video_qa or "
                         "audio,speech ('default': the image and text views, the default; "
                         "'all')")  # fmt: skip
    tw.add_argument("--voice", default="builtin", choices=("builtin", "espeak"),
                    help="the speech view's synthesiser: the built-in one, or espeak-ng if "
                         "installed")  # fmt: skip
    tw.add_argument("--no-progress", action="store_true")
    tw.set_defaults(fn=_data_toyworld)

    for name, help_ in [
        ("parallel", "parallel text: two line-aligned files (corpus.en corpus.de) or one TSV"),
        ("text", "monolingual text, one sentence per line"),
        ("xnli", "XNLI 1.0 / MultiNLI / XNLI-MT TSV (format read from the header)"),
        ("coco", "COCO captions JSON (--input) + image folder (--images)"),
        ("vqa", "VQA v2 questions JSON [+ annotations JSON] (--input) + --images/--regions"),
    ]:
        c = data_sub.add_parser(name, help=help_)
        c.add_argument("--input", nargs="+", required=True)
        c.add_argument("--out", required=True)
        c.add_argument("--split", default="train")
        c.add_argument("--shard-size", type=int, default=10000)
        if name == "parallel":
            c.add_argument("--langs", required=True, help="two codes, e.g. en,de")
        elif name in ("coco", "vqa"):
            c.add_argument("--images", default=None, help="COCO image folder")
            c.add_argument("--regions", default=None, help="bottom-up-attention TSV features")
            c.add_argument("--no-progress", action="store_true")
        else:
            note = " (xnli: keep only this language)" if name == "xnli" else ""
            c.add_argument("--lang", required=name == "text", default=None, help="code" + note)
        c.set_defaults(fn=_data_convert)

    ms = data_sub.add_parser("msrvtt", help="MSR-VTT annotation JSON + video folder")
    ms.add_argument("--videos", required=True, help="folder of <video_id>.mp4")
    ms.add_argument("--annotations", required=True, help="e.g. train_val_videodatainfo.json")
    ms.add_argument("--out", required=True)
    ms.add_argument("--split", default="all", choices=["train", "val", "test", "all"])
    ms.add_argument("--keys", "--test-keys", dest="keys", default=None,
                    help="only these video ids, one a line (e.g. the 1k-A test list)")  # fmt: skip
    ms.add_argument("--shard-size", type=int, default=1000)
    ms.add_argument("--no-progress", action="store_true")
    ms.set_defaults(fn=_data_video)
    vc = data_sub.add_parser("videos", help="caption CSV (file,caption[,language,split])")
    vc.add_argument("--csv", required=True)
    vc.add_argument("--video-dir", required=True)
    vc.add_argument("--out", required=True)
    vc.add_argument("--split", default="train")
    vc.add_argument("--shard-size", type=int, default=1000)
    vc.add_argument("--no-probe", action="store_true",
                    help="do not check that PyAV decodes each file's first frame")  # fmt: skip
    vc.add_argument("--no-progress", action="store_true")
    vc.set_defaults(fn=_data_video)
    vf = data_sub.add_parser("video-features", help="caption CSV + per-video .npy [T,F]")
    vf.add_argument("--csv", required=True)
    vf.add_argument("--features-dir", required=True)
    vf.add_argument("--out", required=True)
    vf.add_argument("--split", default="train")
    vf.add_argument("--shard-size", type=int, default=1000)
    vf.add_argument("--no-progress", action="store_true")
    vf.set_defaults(fn=_data_video)
    _audio_parsers(data_sub)

    an = data_sub.add_parser("answers", help="VQA answer vocabulary from training shards")
    an.add_argument("--input", nargs="+", required=True, help="VQA shards")
    an.add_argument("--out", required=True, help="answers file, one per line")
    an.add_argument("--min-count", type=int, default=9, help="questions an answer must occur in")
    an.add_argument("--top-k", type=int, default=None)
    an.set_defaults(fn=_data_answers)

    for name, help_ in [
        ("typing", "entity typing: Open Entity lines (contexts, mention, y_str types)"),
        ("relations", "relation classification: a TACRED list or a FewRel {relation: [items]}"),
    ]:
        c = data_sub.add_parser(name, help=help_)
        c.add_argument("--input", required=True, help="train.json, dev.json or test.json")
        c.add_argument("--out", required=True, help="shards + labels.txt (from the train split)")
        c.add_argument("--split", default="", help="default: the file's stem (train.json: train)")
        c.add_argument("--lang", default="en")
        c.add_argument("--shard-size", type=int, default=10000)
        c.set_defaults(fn=_data_spans, task=name)

    li = data_sub.add_parser("link", help="entity mentions by alias dictionary → json.mentions")
    li.add_argument("--input", required=True, help="text shards (glob, brace pattern, folder)")
    li.add_argument("--aliases", action="append", required=True, metavar="[LANG=]FILE",
                    help="id<TAB>alias... lines (wikidata5m_entity.txt); LANG=FILE for one "
                         "language, FILE for every other; repeatable")  # fmt: skip
    li.add_argument("--out", required=True, help="folder: the linked shards and link.json")
    li.add_argument("--languages", default="", help="link only these (comma list)")
    li.add_argument("--field", default="auto", choices=["auto", "txt", "captions"],
                    help="the text to link (auto: json.captions if present, else txt)")  # fmt: skip
    li.add_argument("--case", default="auto", choices=["auto", "sensitive", "insensitive"],
                    help="auto: exact case for aliases of <= 3 characters and "
                         "acronyms")  # fmt: skip
    li.add_argument("--triples", default=None,
                    help="head<TAB>relation<TAB>tail file: an ambiguous alias links to the "
                         "entity with the most triples")  # fmt: skip
    li.add_argument("--entities", default=None,
                    help="entity id list (entities.txt of kg train-embeddings): link "
                         "only these")  # fmt: skip
    li.add_argument("--no-progress", action="store_true")
    li.set_defaults(fn=_data_link)

    tr = data_sub.add_parser("triples", help="graph triples + descriptions → KEPLER shards")
    tr.add_argument("graph", help="a graph folder (train/valid/test.txt) or triples file")
    tr.add_argument("--descriptions", default=None,
                    help="id<TAB>text file (default: GRAPH/descriptions.txt)")  # fmt: skip
    tr.add_argument("--out", required=True, help="folder: SPLIT-%%06d.tar and relations.txt")
    tr.add_argument("--split", default="train")
    tr.add_argument("--language", default="en", help="the descriptions' language")
    tr.add_argument("--shard-size", type=int, default=10_000)
    tr.set_defaults(fn=_data_triples)

    kg = sub.add_parser("kg", help="knowledge graphs: entity and relation embeddings")
    kg_sub = kg.add_subparsers(dest="action", required=True)
    kt = kg_sub.add_parser(
        "train-embeddings", argument_default=argparse.SUPPRESS,
        help="TransE / DistMult with negative sampling; filtered link prediction on test",
        description="Defaults: TransE, dim 100, L1, nssa loss (margin 6, temperature 1), "
        "32 negatives, Adam lr 0.01, batch 512, 50 epochs, seed 0, cpu.",
    )  # fmt: skip
    kt.add_argument("triples", help="head<TAB>relation<TAB>tail file, a train/valid/test.txt "
                    "folder (FB15k-237, WN18RR, Wikidata5M) or an OpenKE folder")  # fmt: skip
    kt.add_argument("--out", required=True, help="folder: entities.npy/.txt, relations.*, kge.json")
    kt.add_argument("--model", choices=["transe", "distmult"])
    kt.add_argument("--dim", type=int)
    kt.add_argument("--p-norm", type=int, choices=[1, 2], help="TransE's distance")
    kt.add_argument("--no-normalize-entities", dest="normalize_entities", action="store_false",
                    help="no unit-norm constraint on entities")  # fmt: skip
    kt.add_argument("--loss", choices=["nssa", "margin"],
                    help="self-adversarial negative sampling, or margin ranking")  # fmt: skip
    kt.add_argument("--margin", type=float, help="γ of the loss")
    kt.add_argument("--adversarial-temperature", type=float, help="α of nssa (0: uniform)")
    kt.add_argument("--negatives", type=int, help="negatives per positive")
    kt.add_argument("--optimizer", choices=["adam", "adagrad", "sgd"])
    kt.add_argument("--lr", type=float)
    kt.add_argument("--batch-size", type=int)
    kt.add_argument("--epochs", type=int)
    kt.add_argument("--seed", type=int)
    kt.add_argument("--device", help="cpu, cuda, cuda:1")
    kt.add_argument("--mmap", action="store_true",
                    help="entity table memory-mapped in OUT (sparse row updates)")  # fmt: skip
    kt.add_argument("--eval-every", type=int, help="epochs between validation evaluations")
    kt.add_argument("--eval-max-triples", type=int, help="validation triples (0: all)")
    kt.add_argument("--no-progress", action="store_true", default=False)
    kt.set_defaults(fn=_kg_train_embeddings)

    im = sub.add_parser("import", help="import checkpoints of other libraries (offline)")
    im_sub = im.add_subparsers(dest="format", required=True)
    ix = im_sub.add_parser("xlmr", help="a local HF-format XLM-R directory")
    ix.add_argument("hf_dir")
    ix.add_argument("--out", required=True, help="writes an mmptm run directory here")
    ix.add_argument("--drop-prefix", action="append", help="leave these task heads behind")
    ix.set_defaults(fn=_import_xlmr)
    iw = im_sub.add_parser("wav2vec2", help="a local HF Wav2Vec2Model / HubertModel directory")
    iw.add_argument("hf_dir")
    iw.add_argument("--out", required=True, help="writes an mmptm run directory here")
    iw.add_argument("--drop-prefix", action="append", help="leave these task heads behind")
    iw.set_defaults(fn=_import_wav2vec2)
    io = im_sub.add_parser("open_clip", help="an OpenCLIP checkpoint (ViT / ResNet CLIP)")
    io.add_argument("checkpoint", help=".pt / .bin / .safetensors state dict")
    io.add_argument("--model", required=True, help="open_clip model config name, e.g. ViT-B-32")
    io.add_argument("--out", required=True, help="writes an mmptm run directory here")
    io.add_argument("--config", default=None, help="the model config json (default: open_clip's)")
    io.add_argument("--vocab", default=None, help="CLIP BPE merges (default: open_clip's)")
    io.set_defaults(fn=_import_open_clip)

    tok = sub.add_parser("tokenizer", help="multilingual sentencepiece tokenizers")
    tok_sub = tok.add_subparsers(dest="action", required=True)
    tt = tok_sub.add_parser("train", help="train from text files or shards")
    tt.add_argument("--input", nargs="+", required=True, help="text files, shards, dirs, globs")
    tt.add_argument("--out", required=True, help="output prefix (writes PREFIX.model/.json)")
    tt.add_argument("--vocab-size", type=int, default=8000)
    tt.add_argument("--languages", default=None, help="comma list (default: found in shards)")
    tt.add_argument("--model-type", default="unigram", choices=["unigram", "bpe"])
    tt.add_argument("--seed", type=int, default=0)
    tt.add_argument(
        "--fit-to-data",
        action="store_true",
        help="bpe: --vocab-size is a cap; stop when every word is one piece",
    )
    tt.set_defaults(fn=_tokenizer_train)

    un = sub.add_parser("units", help="codebooks of discrete units (visual words, HuBERT)")
    un_sub = un.add_subparsers(dest="action", required=True)
    uf = un_sub.add_parser("fit", help="k-means (flat or hierarchical) over [T,F] members")
    uf.add_argument("--shards", required=True, help="shard spec (glob, brace, dir, commas)")
    uf.add_argument("--member", default=None,
                    help="the [T,F] array member (npy); with --audio-features the audio member "
                    "(default: the first of flac, wav, ...)")  # fmt: skip
    uf.add_argument("--audio-features", default=None, metavar="mfcc|RUN",
                    help="HuBERT: k-means over MFCC features of audio shards, or over "
                    "a run's audio encoder at --layer (the hubert objective's featurizer)",
                    )  # fmt: skip
    uf.add_argument("--layer", type=int, default=0, help="with --audio-features RUN: layer L")
    uf.add_argument("--k", type=int, default=None, help="centroids (flat k-means)")
    uf.add_argument("--levels", type=int, default=1, help="hierarchical: depth (K = B^L)")
    uf.add_argument("--branch", type=int, default=None, help="hierarchical: splits per node")
    uf.add_argument("--max-vectors", type=int, default=0, help="uniform sample (0 = all)")
    uf.add_argument("--iters", type=int, default=100, help="most Lloyd steps per k-means")
    uf.add_argument("--seed", type=int, default=0)
    uf.add_argument("--device", default="cpu")
    uf.add_argument("--no-progress", action="store_true")
    uf.add_argument("--out", required=True, help="codebook .npy; a .json sidecar beside it")
    uf.set_defaults(fn=_units_fit)

    pt = sub.add_parser("pretrain", help="pre-train from a YAML recipe")
    pt.add_argument("config")
    pt.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    pt.set_defaults(fn=_pretrain)

    ft = sub.add_parser("finetune", help="fine-tune a checkpoint (init=...) on a task")
    ft.add_argument("config")
    ft.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    ft.set_defaults(fn=_finetune)

    ev = sub.add_parser("eval", help="evaluate a checkpoint")
    ev_sub = ev.add_subparsers(dest="task", required=True)
    er = ev_sub.add_parser(
        "retrieval", help="item (image, video, ...) ↔ text R@1/5/10 and median rank"
    )
    er.add_argument("run", help="run directory or checkpoint file")
    er.add_argument("overrides", nargs="*", help="key=value overrides of the saved config")
    er.add_argument("--split", default="test", choices=["train", "val", "test"])
    er.add_argument("--shards", default=None, help="shard spec instead of the split's")
    er.add_argument("--language", default=None, help="caption language (default: first)")
    er.add_argument("--max-items", type=int, default=1000)
    er.add_argument("--batch-size", type=int, default=128)
    er.add_argument("--rerank-k", type=int, default=0, help="re-rank the top-k with ITM")
    er.add_argument(
        "--itm-all",
        action="store_true",
        help="score every item-text pair with ITM (UNITER's protocol: N² fused pairs)",
    )
    er.add_argument(
        "--captions",
        type=int,
        default=1,
        help="captions per item (Clotho, AudioCaps: 5): every one is a query; adds mAP@10",
    )
    er.add_argument("--out", default=None, help="also write the result as JSON here")
    er.set_defaults(fn=_eval_retrieval)
    rv = ev_sub.add_parser(
        "reversal", help="video: own caption vs. the caption of the clip played backwards"
    )
    rv.add_argument("run", help="run directory or checkpoint file")
    rv.add_argument("overrides", nargs="*", help="key=value overrides of the saved config")
    rv.add_argument("--split", default="test", choices=["train", "val", "test"])
    rv.add_argument("--shards", default=None, help="shard spec instead of the split's")
    rv.add_argument("--language", default=None, help="caption language (default: first)")
    rv.add_argument("--field", default="reversed_captions", help="json field of the negatives")
    rv.add_argument("--max-items", type=int, default=1000)
    rv.add_argument("--batch-size", type=int, default=128)
    rv.set_defaults(fn=_eval_reversal)
    pr = ev_sub.add_parser(
        "probe", help="linear-probe accuracy of a frozen encoder's vectors on json labels"
    )
    pr.add_argument("run", help="run directory or checkpoint file")
    pr.add_argument("overrides", nargs="*", help="key=value overrides of the saved config")
    pr.add_argument("--train", default=None, help="shards the probe is fitted on")
    pr.add_argument("--test", default=None, help="shards it is scored on")
    pr.add_argument(
        "--folds", nargs="+", default=None, help="k-fold protocol (ESC-50): one spec per fold"
    )
    pr.add_argument("--view", default="", help="encoder to probe (default: first non-text)")
    pr.add_argument(
        "--label-names",
        default="",
        help="comma list of the json label values in index order (default: the recipe's "
        "data.modalities.label.names)",
    )
    pr.add_argument(
        "--random-init", action="store_true", help="probe the untrained architecture instead"
    )
    pr.add_argument("--out", default=None, help="also write the result as JSON here")
    pr.add_argument(
        "--cloze", nargs="+", default=None,
        help="LAMA T-REx jsonl files: cloze P@1/P@10/MRR instead of a linear probe",
    )  # fmt: skip
    pr.add_argument(
        "--candidates", default=None,
        help="cloze: candidate objects (.txt one per line, or .json [labels] or {predicate_id: "
        "[labels]}); default: each relation's answers in the file",
    )  # fmt: skip
    pr.add_argument(
        "--language", default="", help="cloze: the queries' language (default: NAME.<lang>.jsonl)"
    )
    pr.add_argument(
        "--group-by",
        default="facts",
        help="cloze: comma list of line fields to break the metrics down by",
    )
    pr.add_argument(
        "--sentence", type=int, default=None,
        help="cloze: score each line's masked sentence of this index alone (default: the mean "
        "over all of them)",
    )  # fmt: skip
    pr.add_argument("--batch-size", type=int, default=64, help="cloze: sequences per batch")
    pr.add_argument("--device", default="cpu", help="cloze: cpu, cuda, ...")
    pr.set_defaults(fn=_eval_probe)
    lp = ev_sub.add_parser(
        "link-prediction", help="KEPLER: entities encoded from their descriptions, TransE ranks"
    )
    lp.add_argument("run", help="run directory or checkpoint file")
    lp.add_argument("--graph", required=True, help="graph folder (its SPLIT.txt is ranked)")
    lp.add_argument("--descriptions", default=None, help="default: GRAPH/descriptions.txt")
    lp.add_argument("--split", default="test")
    lp.add_argument("--max-triples", type=int, default=0, help="the first N only (0: all)")
    lp.set_defaults(fn=_eval_link_prediction)
    ex = ev_sub.add_parser("xnli", help="accuracy per language of a fine-tuned classifier")
    ex.add_argument("run", help="run directory or checkpoint file")
    ex.add_argument("overrides", nargs="*", help="key=value overrides of the saved config")
    ex.add_argument("--set", action="append", help="NAME=SHARDS (default: the run's data.eval)")
    ex.set_defaults(fn=_eval_xnli)
    sp = ev_sub.add_parser(
        "spans", help="entity typing / relation classification metrics of a fine-tuned head"
    )
    sp.add_argument("run", help="run directory or checkpoint file")
    sp.add_argument("overrides", nargs="*", help="key=value overrides of the saved config")
    sp.add_argument("--shards", default=None, help="shards to score (default: the run's data.eval)")
    sp.add_argument("--set", action="append", help="NAME=SHARDS, repeatable")
    sp.add_argument("--group-by", default="facts", help="comma list of json fields")
    sp.add_argument("--device", default="cpu")
    sp.add_argument("--out", default=None, help="also write the result as JSON here")
    sp.set_defaults(fn=_eval_spans)
    vq = ev_sub.add_parser("vqa", help="VQA accuracy; --results writes the official format")
    vq.add_argument("run", help="run directory or checkpoint file")
    vq.add_argument("overrides", nargs="*", help="key=value overrides of the saved config")
    vq.add_argument("--split", default="test", choices=["train", "val", "test"])
    vq.add_argument("--shards", default=None)
    vq.add_argument("--results", default=None, help='write [{"question_id", "answer"}] here')
    vq.set_defaults(fn=_eval_vqa)
    xr = ev_sub.add_parser("xret", help="cross-lingual sentence retrieval (Tatoeba protocol)")
    xr.add_argument("run", help="run directory or checkpoint file")
    xr.add_argument("overrides", nargs="*", help="key=value overrides of the saved config")
    xr.add_argument("--shards", required=True, help="parallel-text shards")
    xr.add_argument("--pivot", default="en")
    xr.add_argument("--max-items", type=int, default=500, help="pairs per language")
    xr.add_argument(
        "--pooling",
        default="auto",
        help="auto (the aligned vector, if the recipe trains one, and the last "
        "layer's mean) | mean | first | an aligned objective's name",
    )
    xr.add_argument(
        "--layer",
        type=int,
        default=None,
        help="for mean/first: 0 = embeddings, k = block k, -1 = last (default)",
    )
    xr.add_argument(
        "--center",
        action="store_true",
        help="subtract each language's mean vector before the cosine (Libovický et al. 2020)",
    )
    xr.set_defaults(fn=_eval_xret)

    pl = sub.add_parser("plot", help="draw training curves of runs (their metrics.jsonl)")
    pl.add_argument("runs", nargs="+", help="run directories (or metrics.jsonl files)")
    pl.add_argument("--metric", action="append", default=[],
                    help="a metric or glob, e.g. contrastive_loss or '*_loss'; repeatable; one "
                    "subplot each (default: '*loss')")  # fmt: skip
    pl.add_argument("--out", required=True, help="image file (.png, .pdf, .svg)")
    pl.add_argument("--smooth", type=float, default=0.6,
                    help="TensorBoard's smoothing weight in [0, 1); 0 = raw curves")  # fmt: skip
    pl.add_argument("--x", default="step", choices=["step", "samples", "time"],
                    help="x axis: optimiser steps, samples trained on, training time")  # fmt: skip
    pl.add_argument("--log-y", action="store_true", help="logarithmic y axes")
    pl.add_argument("--title", default="", help="figure title")
    pl.set_defaults(fn=_plot)
    ix = sub.add_parser("index", help="embed a collection with a dual encoder into a FAISS index")
    ix.add_argument("run", help="run directory or checkpoint file (CLIP, ALBEF, text↔text ...)")
    ix.add_argument("overrides", nargs="*", help="key=value overrides of the saved config")
    ix.add_argument("--shards", required=True, help="shard spec (glob, brace, dir, commas)")
    ix.add_argument("--out", required=True, help="index directory (new, or with --add)")
    ix.add_argument(
        "--add",
        action="store_true",
        help="append to the index at --out (same run; known keys are skipped)",
    )
    ix.add_argument(
        "--index-type",
        dest="type",
        choices=["flat", "ivf", "hnsw"],
        default=None,
        help="flat: exact (default); ivf / hnsw: approximate, for large collections",
    )
    ix.add_argument("--nlist", type=int, default=None, help="ivf cells (default 4·√N)")
    ix.add_argument("--m", type=int, default=None, help="hnsw links per node (default 32)")
    ix.add_argument("--ef-construction", type=int, default=None, help="hnsw (default 40)")
    ix.add_argument(
        "--nprobe",
        type=int,
        default=None,
        help="ivf cells visited per query, stored as the default (32)",
    )
    ix.add_argument(
        "--ef", type=int, default=None, help="hnsw candidates per query, stored as the default (64)"
    )
    ix.add_argument(
        "--train-size",
        type=int,
        default=None,
        help="ivf: k-means on at most this many vectors (default 64·nlist)",
    )
    ix.add_argument("--batch-size", type=int, default=128)
    ix.add_argument("--workers", type=int, default=0, help="loader worker processes (decoding)")
    ix.add_argument("--device", default="cpu")
    ix.add_argument("--thumbnail-size", type=int, default=128, help="longest side, pixels")
    ix.set_defaults(fn=_index)

    rt = sub.add_parser("retrieve", help="query an index: text, an image file, or an item key")
    rt.add_argument("index", help="index directory (`mmptm index`)")
    rt.add_argument("query", nargs="?", default=None, help="text query (any language)")
    rt.add_argument("--image", default=None, help="image file as the query")
    rt.add_argument("--key", default=None, help="more like this item")
    rt.add_argument("-k", type=int, default=10, help="hits (default 10)")
    rt.add_argument(
        "--lang",
        default=None,
        help="captions shown in this language; on a text side, the language "
        "searched (default: all)",
    )
    rt.add_argument("--query-lang", default=None, help="the query's language (default --lang)")
    rt.add_argument(
        "--side", default=None, help="the side searched (default: items for text, text for images)"
    )
    rt.add_argument(
        "--rerank-k",
        type=int,
        default=0,
        help="re-rank the top K with the model's ITM head (ALBEF)",
    )
    rt.add_argument("--nprobe", type=int, default=None, help="ivf: cells visited per query")
    rt.add_argument("--ef", type=int, default=None, help="hnsw: candidates per query")
    rt.add_argument(
        "--run",
        default=None,
        help="the run to load (default: the checkpoint the index was built with)",
    )
    rt.add_argument("--device", default="cpu")
    rt.add_argument("--json", action="store_true", help="print the hits as JSON")
    rt.set_defaults(fn=_retrieve)

    sv = sub.add_parser("serve", help="the search page and JSON API over an `mmptm index` dir")
    sv.add_argument("index", help="directory written by `mmptm index`")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all)")
    sv.add_argument("--port", type=int, default=8000, help="0: any free port")
    sv.add_argument("--device", default="cpu", help="where the model encodes queries")
    sv.add_argument("--run", default=None, help="model run instead of the one in index.json")
    sv.set_defaults(fn=_serve)

    de = sub.add_parser("demo", help="reproducible toyworld studies (default: clip)")
    de.add_argument(
        "study",
        nargs="?",
        default="clip",
        choices=["clip", "multilingual", "vqa", "video", "audio", "knowledge"],
    )
    de.add_argument("--recipes", default=None,
                    help="vqa: comma list of VL recipes or study runs (default: the six tiny "
                    "recipes and single_stream_9l, UNITER at ViLBERT's budget); "
                    "video: of videoclip_tiny (default), video_clip_tiny, videobert_tiny, "
                    "cbt_tiny; audio: of clap_tiny, audio_image_tiny, wav2vec2_tiny, "
                    "hubert_tiny, speechbert_tiny (default: clap_tiny,wav2vec2_tiny); "
                    "knowledge: of ernie_tiny (default), kbert_tiny, kepler_tiny, "
                    "ernie_vl_tiny")  # fmt: skip
    de.add_argument("--qa-steps", type=int, default=0,
                    help="video: video QA fine-tuning steps (0: no QA)")  # fmt: skip
    de.add_argument("--out", default=None, help="default: runs/demo-<study>")
    de.add_argument("--n-train", type=int, default=4000)
    de.add_argument("--n-test", type=int, default=500)
    de.add_argument(
        "--steps",
        type=int,
        default=0,
        help="pre-training steps (0: clip 2500, multilingual 2000, knowledge 1200, else the "
        "recipe's)",
    )
    de.add_argument("--seeds", type=int, default=3, help="fine-tuning seeds (multilingual)")
    de.add_argument("--ft-steps", type=int, default=0,
                    help="fine-tuning steps (0: the study's own, 1500; audio: 600; "
                    "knowledge: 300, its knowledge VQA kvqa.yaml's 3000)")  # fmt: skip
    de.add_argument("--retrieval-items", type=int, default=None,
                    help="vqa: test pairs ranked after pre-training (default: the whole test "
                    "split; 0: no retrieval, VQA only)")  # fmt: skip
    de.add_argument("--seed", type=int, default=0)
    de.add_argument("--set", dest="overrides", action="append", default=[],
                    help="key=value override of the pre-training recipe")  # fmt: skip
    de.set_defaults(fn=_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        status = args.fn(args)
    except (ValueError, OSError, FloatingPointError) as e:
        if args.debug:
            raise
        # What the user can act on (a bad config or input, a full disk or unwritable folder, a
        # non-finite loss, a stalled rank): one clear line, not a traceback (--debug shows it).
        # ConfigError is a ValueError; a stalled rank raises TimeoutError, an OSError.
        message = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        print(f"mmptm {args.command}: error: {message or type(e).__name__}", file=sys.stderr)
        status = 2
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a rank under torchrun
        from mmptm.train.trainer import exit_rank

        exit_rank(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
