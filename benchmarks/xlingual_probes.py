"""Diagnostics for multilingual pre-training on toyworld (not a benchmark of speed).

1. Concept transfer: English class centroids (colour / shape of the first object named)
   classify the other languages' mean-pooled sentence vectors, per layer (centred per
   language). Chance: colour 1/6, shape 1/5. Aligned languages score well above chance.
   With the same vectors, Tatoeba-style retrieval R@1 per layer (chance 1/items).
2. Translation use: 15% of the non-English half of a TLM input ``[CLS] en [SEP] x [SEP]``
   is masked; MLM accuracy with the true English sentence first vs a shuffled one vs an
   identical copy of x. A model that reads the first half scores higher with true/copy.
   Accuracy is also split into content words (colours, shapes, sizes: toyworld's lexicon,
   or ``--content`` for other data), which only the translation can reveal, and the rest;
   and the attention mass that masked positions put on the first half is given per layer.

    python benchmarks/xlingual_probes.py RUN --data runs/demo-multilingual/toyworld
    python benchmarks/xlingual_probes.py RUN --pairs 'DIR/test-*.tar' --content DIR/content.json
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

import torch
import torch.nn.functional as F

from mmptm.eval.xlingual import read_pairs, text_plugin
from mmptm.fusion.base import pool
from mmptm.models.load import load_pretrained
from mmptm.toyworld.language import LEXICON
from mmptm.toyworld.scene import COLORS as COLOR_RGB
from mmptm.toyworld.scene import SHAPES

COLORS = tuple(COLOR_RGB)


def first_of(text: str, vocab: tuple[str, ...]) -> int:
    return next(vocab.index(w) for w in re.findall(r"\w+", text.lower()) if w in vocab)


def word_forms(entry: Any) -> set[str]:
    """Every lower-cased word of a lexicon entry (strings, nested dicts, (gender, forms))."""
    if isinstance(entry, str):
        return set(entry.lower().split())
    items = entry.values() if isinstance(entry, dict) else entry
    return set().union(*(word_forms(e) for e in items))


def toyworld_content() -> dict[str, set[str]]:
    """Content words per language: the forms of colours, shapes and sizes."""
    return {
        lang: word_forms(
            [lex["colors"], [forms for _, forms in lex["nouns"].values()], lex["sizes"]]
        )
        for lang, lex in LEXICON.items()
    }


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="run directory or checkpoint of a text model (single_stream)")
    ap.add_argument("--data", help="toyworld directory (its parallel/test-*.tar)")
    ap.add_argument("--pairs", help="parallel test shards (default: DATA/parallel/test-*.tar)")
    ap.add_argument("--content", help="JSON {language: [content words]} (default: toyworld's)")
    ap.add_argument("--items", type=int, default=500)
    args = ap.parse_args()
    if not (args.data or args.pairs):
        ap.error("give --data or --pairs")
    content = toyworld_content()
    if args.content:
        with open(args.content, encoding="utf-8") as f:
            content = {lang: {w.lower() for w in ws} for lang, ws in json.load(f).items()}
    model, tok, cfg = load_pretrained(args.run)
    blocks = model.fusion.stack.blocks
    layers: dict[int, torch.Tensor] = {}
    model.fusion.stack.register_forward_pre_hook(lambda m, a: layers.__setitem__(0, a[0]))
    for i, block in enumerate(blocks):
        block.register_forward_hook(lambda m, a, o, i=i: layers.__setitem__(i + 1, o))
    text = text_plugin(cfg, tok)  # the run's tokenisation and padding, one text view
    pairs = read_pairs(args.pairs or f"{args.data}/parallel/test-*.tar", "en", args.items)

    def embed(texts: list[str], lang: str) -> list[torch.Tensor]:
        out: list[list[torch.Tensor]] = [[] for _ in range(len(blocks) + 1)]
        for s in range(0, len(texts), 128):
            batch = text.collate([text.encode(t, lang) for t in texts[s : s + 128]])
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
    (concat,), g = text.transforms(), torch.Generator()  # joins a pair into one sequence
    attn_in: list[tuple[torch.Tensor, torch.Tensor]] = []
    for block in blocks:
        block.attn.register_forward_pre_hook(
            lambda m, a, kw: attn_in.append((a[0], kw["mask_BK"])), with_kwargs=True
        )
    pieces = [tok.id_to_piece(i).lstrip("\u2581").lower() for i in range(tok.vocab_size)]
    print("masked-word accuracy in the second half (all / content words / other words)")
    for cond in ("true", "shuffled", "copy"):
        g.manual_seed(0)  # the same masked positions in every condition
        acc_by: dict[str, list[float]] = {"all": [], "content": [], "other": []}
        mass = torch.zeros(len(blocks))
        for lang, pp in sorted(pairs.items()):
            firsts = [p[0] for p in pp]
            if cond == "shuffled":
                firsts = firsts[1:] + firsts[:1]
            elif cond == "copy":
                firsts = [p[1] for p in pp]
            first_lang = lang if cond == "copy" else "en"
            samples = [
                {**text.encode(a, first_lang), **{f"{concat.second}{k}": v
                                                  for k, v in text.encode(p[1], lang).items()}}
                for a, p in zip(firsts, pp)
            ]  # fmt: skip
            batch = concat(text.collate(samples), g)
            x = batch["input_ids"]
            special = torch.isin(x, torch.tensor([tok.pad_id, tok.cls_id, tok.sep_id]))
            cand = (batch["segment_ids"] == 1) & ~special & batch["attention_mask"]
            pick = cand & (torch.rand(x.shape, generator=g) < 0.15)
            batch["input_ids"] = torch.where(pick, torch.full_like(x, tok.mask_id), x)
            attn_in.clear()
            hidden = model.fuse(batch).hidden["text"]
            right = mlm.logits(hidden[pick]).argmax(-1) == x[pick]
            words = content.get(lang, set())
            is_content = torch.tensor(
                [pieces[i] in words for i in x[pick].tolist()], dtype=torch.bool
            )
            for k, sel in (("all", slice(None)), ("content", is_content), ("other", ~is_content)):
                if right[sel].numel():
                    acc_by[k].append(right[sel].float().mean().item())
            first = (batch["segment_ids"] == 0) & batch["attention_mask"]
            for i, (blk, (h, m)) in enumerate(zip(blocks, attn_in)):
                w = blk.attn.weights(h, mask_BK=m).mean(1)  # [B,N,N], heads averaged
                mass[i] += (w * first[:, None, :]).sum(-1)[pick].mean().item() / len(pairs)
        acc = " / ".join(f"{100 * sum(v) / len(v):.1f}%" if v else "-" for v in acc_by.values())
        print(f"  first half {cond}: {acc}; attention on the first half by layer: "
              + " ".join(f"L{i + 1} {v:.2f}" for i, v in enumerate(mass.tolist())))  # fmt: skip


if __name__ == "__main__":
    main()
