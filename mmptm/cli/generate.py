"""``mmptm generate RUN``: write a caption, a translation or a continuation with a run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mmptm.cli.flags import decoding_arguments, decoding_config, device

#: --flag → what a file given with it is (for the error when the run cannot read it)
_FILES = {"image": "an image", "video": "a clip", "audio": "a sound"}


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``mmptm generate``."""
    sub.add_parser("generate", help="write text with a run (caption, translate, continue)",
                   fill=_fill)  # fmt: skip


def _fill(g: argparse.ArgumentParser) -> None:
    g.add_argument("run", help="run directory or checkpoint file")
    g.add_argument("overrides", nargs="*", help="key=value overrides of the saved config")
    src = g.add_mutually_exclusive_group()
    for flag, what in _FILES.items():
        src.add_argument(f"--{flag}", metavar="FILE", help=f"describe {what}")
    src.add_argument("--shards", metavar="SPEC", help="describe the samples of these shards")
    g.add_argument(
        "--text", default="", help="the sentence to translate (a decoder run), or a prompt"
    )
    g.add_argument("--text-lang", default="en", help="the language of --text (default: en)")
    g.add_argument("--lang", default=None, help="the language to write (default: the run's first)")
    g.add_argument("--limit", type=int, default=8, help="samples of --shards at most")
    g.add_argument("--no-cache", action="store_true", help="decode without the KV cache")
    g.add_argument("--device", type=device, default="cpu")
    g.add_argument("--json", action="store_true", help="one JSON object per line")
    decoding_arguments(g)
    g.set_defaults(fn=_generate)


def _file_sample(path: str, gen) -> dict:
    """A file as a raw sample of the member its suffix names (``photo.jpg`` → ``jpg``)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    member = p.suffix.lower().lstrip(".")
    if member not in gen.members:
        raise ValueError(
            f"{path}: this run reads {gen.members or 'text only'}, not a .{member} file"
        )
    return {"__key__": p.stem, member: p.read_bytes()}


def _samples(args: argparse.Namespace, gen) -> tuple[list[dict], str]:
    """The raw samples to write for, and the prompt (``--text`` for a run that continues)."""
    from mmptm.eval.text_generation import raw_samples, text_sample
    from mmptm.objectives.lm import DecoderLM

    writes_from_text = isinstance(gen.objective, DecoderLM) and "txt" in gen.members
    path = next((getattr(args, f) for f in _FILES if getattr(args, f)), None)
    if path:
        return [_file_sample(path, gen)], "" if writes_from_text else args.text
    if args.shards:
        return [s for s, _ in raw_samples(args.shards, args.limit)], ""
    if writes_from_text:
        if not args.text:
            raise ValueError("this run translates text: give --text")
        return [text_sample(args.text, args.text_lang, "text")], ""
    if gen.plugins:
        wanted = ", ".join(f"--{f}" for f in _FILES) + " or --shards"
        raise ValueError(f"this run writes from {gen.members}: give {wanted}")
    return [{"__key__": "prompt"}], args.text


def _generate(args: argparse.Namespace) -> int:
    from mmptm.generate.generator import Generator

    dcfg = decoding_config(args)
    gen = Generator.load(args.run, args.overrides, args.device)
    samples, prompt = _samples(args, gen)
    out = gen.generate(samples, dcfg, lang=args.lang, prompt=prompt, use_cache=not args.no_cache)
    for s, g in zip(samples, out):
        if args.json:
            print(json.dumps({"key": s["__key__"], "text": g.text, "score": round(g.score, 4)},
                             ensure_ascii=False))  # fmt: skip
        else:
            print(f"{s['__key__']}\t{prompt + ' ' if prompt else ''}{g.text}")
    return 0
