"""Control data for TLM: English toyworld text paired with a word-for-word cipher of itself.

Each English word type is replaced by a distinct word of another toyworld language that the
tokenizer keeps as one piece, so a cipher sentence has the English sentence's length and word
order, no inflection and no shared pieces: the easiest translation a TLM model can meet. How
fast a model learns to read it (``xlingual_probes.py``: content-word accuracy with the true vs
a shuffled first half) bounds what to expect on toyworld's real languages.

    python benchmarks/tlm_cipher.py --data runs/demo-multilingual/toyworld --out runs/cipher
    mmptm pretrain xlm_tlm_tiny output_dir=runs/cipher_tlm \\
        data.tokenizer=runs/demo-multilingual/toyworld/tokenizer.model \\
        data.sources.mono=__delete__ data.sources.tlm.weight=1.0 \\
        data.sources.tlm.shards='runs/cipher/train-*.tar' train.max_steps=1000
    python benchmarks/xlingual_probes.py runs/cipher_tlm --pairs 'runs/cipher/test-*.tar' \\
        --content runs/cipher/content.json
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from xlingual_probes import toyworld_content  # this folder's sibling script

from mmptm.converters.text import convert_parallel_files
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples
from mmptm.tokenizers.sentencepiece import Tokenizer

WORD = re.compile(r"[\w'-]+")


def sentences(pattern: str) -> list[str]:
    out = [s["txt"].decode("utf-8") for s in tar_samples(expand_shards(pattern), SkipCounter())]
    if not out:
        raise ValueError(f"{pattern}: no txt members")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="toyworld directory (mono/, tokenizer.model)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--lang", default="ru", help="whose one-piece words make the cipher")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    data, out = Path(args.data), Path(args.out)
    tok = Tokenizer.load(data / "tokenizer.model")
    english = {split: sentences(f"{data}/mono/{split}-en-*.tar") for split in ("train", "test")}
    types = sorted({w.lower() for ss in english.values() for s in ss for w in WORD.findall(s)})
    pool = sorted(
        {
            w.lower()
            for s in sentences(f"{data}/mono/train-{args.lang}-*.tar")
            for w in WORD.findall(s)
            if len(tok.encode(w.lower())) == 1
        }
    )
    if len(pool) < len(types):
        raise ValueError(f"{args.lang} has {len(pool)} one-piece words, need {len(types)}")
    random.Random(args.seed).shuffle(pool)
    cipher = dict(zip(types, pool))
    out.mkdir(parents=True, exist_ok=True)
    for split, ss in english.items():
        (out / f"{split}.en").write_text("\n".join(ss) + "\n", encoding="utf-8")
        coded = [WORD.sub(lambda m: cipher[m.group(0).lower()], s) for s in ss]
        (out / f"{split}.{args.lang}").write_text("\n".join(coded) + "\n", encoding="utf-8")
        convert_parallel_files(
            out / f"{split}.en", out / f"{split}.{args.lang}", ("en", args.lang), out, split=split
        )
    content = sorted(cipher[w] for w in toyworld_content()["en"] if w in cipher)
    (out / "content.json").write_text(json.dumps({args.lang: content}, ensure_ascii=False))
    print(f"{out}: {sum(map(len, english.values()))} pairs, {len(types)} word types enciphered")


if __name__ == "__main__":
    main()
