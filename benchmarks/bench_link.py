"""`mmptm data link` speed: toyworld captions against a generated dictionary of 100k aliases.

The dictionary: every word and every two-word phrase of the toyworld captions (so each
caption holds many mentions and the longest-match walk goes two words deep), then seeded
pseudo-words of one to three syllable-words up to ``--aliases`` aliases, a third of them
starting with a real caption word so the trie's inner nodes are hit too; 1–3 aliases per
entity, so some aliases are shared (ambiguous). Timed: building the dictionary, linking the
captions in memory (sentences/s, median of ``--repeats``), and ``link_shards`` end to end
(read shards, link, rewrite json, write shards).

    python benchmarks/bench_link.py --out /tmp/link-bench [--n-train 2000] [--aliases 100000]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from mmptm import toyworld
from mmptm.converters.linking import AliasDictionary, link_shards
from mmptm.data.shards import SkipCounter, expand_shards, tar_samples


def captions(shards: str) -> list[tuple[str, str]]:
    out = []
    for sample in tar_samples(expand_shards(shards), SkipCounter()):
        meta = json.loads(sample["json"])
        out += [(lang, text) for lang, text in meta["captions"].items()]
    return out


def make_aliases(texts: list[str], n: int, seed: int) -> dict[str, list[str]]:
    rng = random.Random(seed)
    words = sorted({w.strip(".,") for t in texts for w in t.split()} - {""})
    phrases = sorted({" ".join(p) for t in texts for p in zip(t.split(), t.split()[1:])})
    pool = [*words, *[p.strip(".,") for p in phrases]]
    syllables = [a + b for a in "bcdfgklmnprstvz" for b in "aeiou"]

    def pseudo() -> str:
        word = lambda: "".join(rng.choices(syllables, k=rng.randint(2, 4)))  # noqa: E731
        parts = [word() for _ in range(rng.randint(1, 3))]
        if rng.random() < 1 / 3:
            parts[0] = rng.choice(words)
        return " ".join(parts)

    aliases = pool + [pseudo() for _ in range(max(0, n - len(pool)))]
    out: dict[str, list[str]] = {}
    i = 0
    while i < len(aliases):
        k = rng.randint(1, 3)
        out[f"Q{len(out)}"] = aliases[i : i + k]
        i += k
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-train", type=int, default=2000)
    ap.add_argument("--aliases", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    out = Path(args.out)
    world = out / "toyworld"
    if not (world / "image_text").exists():
        toyworld.generate(world, n_train=args.n_train, n_val=10, n_test=10, seed=0,
                          views=("image_text",), progress=False)  # fmt: skip
    shards = str(world / "image_text" / "train-*.tar")
    caps = captions(shards)
    aliases = make_aliases([t for _, t in caps], args.aliases, seed=0)
    n_aliases = sum(len(v) for v in aliases.values())

    t0 = time.perf_counter()
    d = AliasDictionary.build(aliases)
    build_s = time.perf_counter() - t0

    rates, mentions = [], 0
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        mentions = sum(len(d.link(text)[0]) for _, text in caps)
        rates.append(len(caps) / (time.perf_counter() - t0))

    t0 = time.perf_counter()
    stats = link_shards(shards, out / "linked", {"*": d}, progress=False)
    shards_s = time.perf_counter() - t0
    result = {
        "captions": len(caps),
        "entities": len(aliases),
        "aliases": n_aliases,
        "dictionary_keys": len(d),
        "ambiguous_keys": len(d.ambiguous),
        "build_s": round(build_s, 2),
        "mentions": mentions,
        "mentions_per_caption": round(mentions / len(caps), 2),
        "sentences_per_s_median": round(statistics.median(rates)),
        "sentences_per_s_all": [round(r) for r in rates],
        "link_shards_samples_per_s": round(stats.samples / shards_s),
        "link_shards_captions_per_s": round(stats.texts / shards_s),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
