"""``mmptm kg train-embeddings``: knowledge-graph embeddings (TransE, DistMult, RotatE, ComplEx)."""

from __future__ import annotations

import argparse

from mmptm.cli.flags import device

# how the help names the defaults of KGETrainConfig
_SHOWN = {"transe": "TransE", "distmult": "DistMult", "rotate": "RotatE", "complex": "ComplEx",
          "adam": "Adam", "adagrad": "Adagrad", "sgd": "SGD"}  # fmt: skip


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``mmptm kg ...``."""
    sub.add_parser("kg", help="knowledge graphs: entity and relation embeddings", fill=_fill)


def _fill(kg: argparse.ArgumentParser) -> None:
    _train_embeddings(kg.add_subparsers(dest="action", required=True))


def _train_embeddings(kg_sub: argparse._SubParsersAction) -> None:
    from mmptm.layers.kge import LOSSES, MODELS
    from mmptm.train.kge import LR_SCHEDULES, OPTIMIZERS, KGETrainConfig

    c = KGETrainConfig()
    kt = kg_sub.add_parser(
        "train-embeddings", argument_default=argparse.SUPPRESS,
        help="TransE / DistMult / RotatE / ComplEx with negative sampling; filtered link "
        "prediction on test",
        description=f"Defaults: {_SHOWN[c.model]}, dim {c.dim}, L{c.p_norm}, {c.loss} loss "
        f"(margin 6 for TransE and RotatE, 0 for DistMult and ComplEx, temperature "
        f"{c.adversarial_temperature:g}), {c.negatives} negatives, {_SHOWN[c.optimizer]} lr "
        f"{c.lr:g} ({c.lr_schedule} decay to 0), batch {c.batch_size}, {c.epochs} epochs, seed "
        f"{c.seed}, {c.device}; unit-norm entities except for RotatE.",
    )  # fmt: skip
    kt.add_argument("triples", help="head<TAB>relation<TAB>tail file, a train/valid/test.txt "
                    "folder (FB15k-237, WN18RR, Wikidata5M) or an OpenKE folder")  # fmt: skip
    kt.add_argument("--out", required=True, help="folder: entities.npy/.txt, relations.*, kge.json")
    kt.add_argument("--model", choices=MODELS)
    kt.add_argument("--dim", type=int)
    kt.add_argument("--p-norm", type=int, choices=[1, 2],
                    help="TransE's, RotatE's distance (RotatE's 1: a sum of moduli)")  # fmt: skip
    kt.add_argument("--normalize-entities", dest="normalize_entities", action="store_true",
                    help="unit-norm entities (default for TransE and DistMult)")  # fmt: skip
    kt.add_argument("--no-normalize-entities", dest="normalize_entities", action="store_false",
                    help="no unit-norm entities (default for RotatE, ComplEx)")  # fmt: skip
    kt.add_argument("--loss", choices=LOSSES,
                    help="self-adversarial negative sampling, or margin ranking")  # fmt: skip
    kt.add_argument("--margin", type=float,
                    help="γ of the loss (default: 6 for distances, 0 for products)")  # fmt: skip
    kt.add_argument("--adversarial-temperature", type=float, help="α of nssa (0: uniform)")
    kt.add_argument("--negatives", type=int, help="negatives per positive")
    kt.add_argument("--optimizer", choices=OPTIMIZERS)
    kt.add_argument("--lr", type=float)
    kt.add_argument("--lr-schedule", choices=LR_SCHEDULES,
                    help="learning rate over the run: constant, or decayed to 0")  # fmt: skip
    kt.add_argument("--batch-size", type=int)
    kt.add_argument("--epochs", type=int)
    kt.add_argument("--seed", type=int)
    kt.add_argument("--device", type=device, help="cpu, cuda, cuda:1")
    kt.add_argument("--mmap", action="store_true",
                    help="entity table memory-mapped in OUT (sparse row updates)")  # fmt: skip
    kt.add_argument("--eval-every", type=int, help="epochs between validation evaluations")
    kt.add_argument("--eval-max-triples", type=int, help="validation triples (0: all)")
    kt.add_argument("--no-progress", action="store_true", default=False)
    kt.set_defaults(fn=_kg_train_embeddings)


def _kg_train_embeddings(args: argparse.Namespace) -> int:
    from mmptm.eval.link_prediction import format_link_prediction
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
        print(format_link_prediction(result["test"], "test"))
    print(f"embeddings → {args.out} (entities.npy/.txt, relations.npy/.txt, kge.json)")
    return 0
