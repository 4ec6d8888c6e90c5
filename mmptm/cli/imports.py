"""``mmptm import xlmr|wav2vec2|open_clip``: checkpoints of other libraries as mmptm runs."""

from __future__ import annotations

import argparse


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``mmptm import ...``."""
    im = sub.add_parser("import", help="import checkpoints of other libraries (offline)")
    im_sub = im.add_subparsers(dest="format", required=True)
    _xlmr(im_sub)
    _wav2vec2(im_sub)
    _open_clip(im_sub)


def _xlmr(im_sub: argparse._SubParsersAction) -> None:
    ix = im_sub.add_parser("xlmr", help="a local HF-format XLM-R directory")
    ix.add_argument("hf_dir")
    ix.add_argument("--out", required=True, help="writes an mmptm run directory here")
    ix.add_argument("--drop-prefix", action="append", help="leave these task heads behind")
    ix.set_defaults(fn=_import_xlmr)


def _import_xlmr(args: argparse.Namespace) -> int:
    from mmptm.models.hf_import import import_xlmr

    path = import_xlmr(args.hf_dir, args.out, drop_prefixes=args.drop_prefix or ())
    print(f"imported {args.hf_dir} → {path} (use init={args.out})")
    return 0


def _wav2vec2(im_sub: argparse._SubParsersAction) -> None:
    iw = im_sub.add_parser("wav2vec2", help="a local HF Wav2Vec2Model / HubertModel directory")
    iw.add_argument("hf_dir")
    iw.add_argument("--out", required=True, help="writes an mmptm run directory here")
    iw.add_argument("--drop-prefix", action="append", help="leave these task heads behind")
    iw.set_defaults(fn=_import_wav2vec2)


def _import_wav2vec2(args: argparse.Namespace) -> int:
    from mmptm.models.hf_audio_import import import_wav2vec2

    path = import_wav2vec2(args.hf_dir, args.out, drop_prefixes=args.drop_prefix or ())
    print(f"imported {args.hf_dir} → {path} (use init={args.out})")
    return 0


def _open_clip(im_sub: argparse._SubParsersAction) -> None:
    io = im_sub.add_parser("open_clip", help="an OpenCLIP checkpoint (ViT / ResNet CLIP)")
    io.add_argument("checkpoint", help=".pt / .bin / .safetensors state dict")
    io.add_argument("--model", required=True, help="open_clip model config name, e.g. ViT-B-32")
    io.add_argument("--out", required=True, help="writes an mmptm run directory here")
    io.add_argument("--config", default=None, help="the model config json (default: open_clip's)")
    io.add_argument("--vocab", default=None, help="CLIP BPE merges (default: open_clip's)")
    io.set_defaults(fn=_import_open_clip)


def _import_open_clip(args: argparse.Namespace) -> int:
    from mmptm.models.open_clip_import import import_open_clip

    path = import_open_clip(
        args.checkpoint, args.model, args.out, config=args.config, vocab=args.vocab
    )
    print(f"imported {args.checkpoint} ({args.model}) → {path} (use {args.out} as a run)")
    return 0
