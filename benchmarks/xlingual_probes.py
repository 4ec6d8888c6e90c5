"""Diagnostics for multilingual pre-training on toyworld (not a benchmark of speed).

1. Concept transfer: English class centroids (colour / shape of the first object named)
   classify the other languages' mean-pooled sentence vectors, per layer (centred per
   language). Chance: colour 1/6, shape 1/5. Aligned languages score well above chance.
   With the same vectors, Tatoeba-style retrieval R@1 per layer (chance 1/items).
2. Translation use: 15% of the non-English half of a TLM input ``[CLS] en [SEP] x [SEP]``
   is masked; MLM accuracy with the true English sentence first vs a shuffled one vs an
   identical copy of x. A model that reads the first half scores higher with true/copy.

    python benchmarks/xlingual_probes.py RUN --data runs/demo-multilingual/toyworld
"""

from __future__ import annotations

import argparse
import re

import torch
import torch.nn.functional as F

from mmptm.data.decode import Collate, ConcatPair
from mmptm.data.toyworld.scene import COLORS as COLOR_RGB
from mmptm.data.toyworld.scene import SHAPES
from mmptm.eval.xlingual import read_pairs
from mmptm.fusion.base import pool
from mmptm.train.trainer import load_pretrained

COLORS = tuple(COLOR_RGB)


def first_of(text: str, vocab: tuple[str, ...]) -> int:
    return next(vocab.index(w) for w in re.findall(r"\w+", text.lower()) if w in vocab)


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="run directory or checkpoint of a text model (single_stream)")
    ap.add_argument("--data", required=True, help="toyworld directory (parallel/test-*.tar)")
    ap.add_argument("--items", type=int, default=500)
    args = ap.parse_args()
    model, tok, cfg = load_pretrained(args.run)
    blocks = model.fusion.stack.blocks
    layers: dict[int, torch.Tensor] = {}
    model.fusion.stack.register_forward_pre_hook(lambda m, a: layers.__setitem__(0, a[0]))
    for i, block in enumerate(blocks):
        block.register_forward_hook(lambda m, a, o, i=i: layers.__setitem__(i + 1, o))
    collate = Collate(tok.pad_id, lambda c: tok.lang_index(c) if c in tok.languages else 0)
    pairs = read_pairs(f"{args.data}/parallel/test-*.tar", "en", args.items)
    L = cfg.data.max_text_len

    def ids(text: str) -> list[int]:
        return tok.build_inputs(tok.encode(text), None, L)[0]

    def embed(texts: list[str], lang: str) -> list[torch.Tensor]:
        out: list[list[torch.Tensor]] = [[] for _ in range(len(blocks) + 1)]
        for s in range(0, len(texts), 128):
            batch = collate([{"__key__": "", "input_ids": ids(t), "lang": lang}
                             for t in texts[s : s + 128]])  # fmt: skip
            batch.pop("__key__")
            mask = model.fuse(batch).mask["text"]
            for i in range(len(blocks) + 1):
                out[i].append(pool(layers[i], mask, "mean"))
        return [torch.cat(v) - torch.cat(v).mean(0) for v in out]

    vocabs = {"colour": COLORS, "shape": SHAPES}
    scores = {k: [0.0] * (len(blocks) + 1) for k in (*vocabs, "retrieval R@1")}
    for lang, pp in sorted(pairs.items()):
        en_vecs, x_vecs = embed([p[0] for p in pp], "en"), embed([p[1] for p in pp], lang)
        gold = torch.arange(len(pp))
        ys = {k: torch.tensor([first_of(p[0], v) for p in pp]) for k, v in vocabs.items()}
        for i, (a, b) in enumerate(zip(en_vecs, x_vecs)):
            b = F.normalize(b, dim=-1)
            sim = b @ F.normalize(a, dim=-1).T
            hits = (sim.argmax(1) == gold).float().mean() + (sim.argmax(0) == gold).float().mean()
            scores["retrieval R@1"][i] += hits.item() / 2 / len(pairs)
            for k, y in ys.items():
                cents = torch.stack([a[y == c].mean(0) for c in range(len(vocabs[k]))])
                pred = (b @ F.normalize(cents, dim=-1).T).argmax(1)
                scores[k][i] += (pred == y).float().mean().item() / len(pairs)
    for k, accs in scores.items():
        print(f"{k} by layer: " + " ".join(f"L{i} {100 * a:.0f}%" for i, a in enumerate(accs)))

    mlm = model.objectives["mlm"]
    concat, g = ConcatPair(tok.pad_id, cfg.data.restart_positions), torch.Generator()
    use: dict[str, float] = {}
    for cond in ("true", "shuffled", "copy"):
        g.manual_seed(0)  # the same masked positions in every condition
        total = 0.0
        for lang, pp in sorted(pairs.items()):
            firsts = [p[0] for p in pp]
            if cond == "shuffled":
                firsts = firsts[1:] + firsts[:1]
            elif cond == "copy":
                firsts = [p[1] for p in pp]
            first_lang = lang if cond == "copy" else "en"
            batch = collate([{"__key__": "", "input_ids": ids(a), "lang": first_lang,
                              "text2_input_ids": ids(p[1]), "text2_lang": lang}
                             for a, p in zip(firsts, pp)])  # fmt: skip
            batch.pop("__key__")
            batch = concat(batch, g)
            x = batch["input_ids"]
            special = torch.isin(x, torch.tensor([tok.pad_id, tok.cls_id, tok.sep_id]))
            cand = (batch["segment_ids"] == 1) & ~special & batch["attention_mask"]
            pick = cand & (torch.rand(x.shape, generator=g) < 0.15)
            batch["mlm_labels"] = torch.where(pick, x, torch.full_like(x, -100))
            batch["input_ids"] = torch.where(pick, torch.full_like(x, tok.mask_id), x)
            total += mlm(model.fuse(batch), batch)["acc"].item() / len(pairs)
        use[cond] = total
    print("masked-word accuracy in the second half, first half = " +
          ", ".join(f"{c}: {100 * a:.1f}%" for c, a in use.items()))  # fmt: skip


if __name__ == "__main__":
    main()
