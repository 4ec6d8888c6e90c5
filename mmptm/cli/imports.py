"""``mmptm import xlmr|wav2vec2|open_clip``: checkpoints of other libraries as mmptm runs."""

from __future__ import annotations

import argparse
import importlib

#: the HF-format importers: command → (help, module, function)
HF_IMPORTS = {
    "xlmr": ("a local HF-format XLM-R directory", "mmptm.models.hf_import", "import_xlmr"),
    "wav2vec2": ("a local HF Wav2Vec2Model / HubertModel directory",
                 "mmptm.models.hf_audio_import", "import_wav2vec2"),
}  # fmt: skip


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``mmptm import ...``."""
    im = sub.add_parser("import", help="import checkpoints of other libraries (offline)")
    im_sub = im.add_subparsers(dest="format", required=True)
    for name, (help_, _, _) in HF_IMPORTS.items():
        hf = im_sub.add_parser(name, help=help_)
        hf.add_argument("hf_dir")
        hf.add_argument("--out", required=True, help="writes an mmptm run directory here")
        hf.add_argument(
            "--drop-prefix", action="append", help="also leave these heads behind (known ones are)"
        )
        hf.set_defaults(fn=_import_hf)
    _open_clip(im_sub)


def _import_hf(args: argparse.Namespace) -> int:
    _, module, function = HF_IMPORTS[args.format]
    importer = getattr(importlib.import_module(module), function)
    path = importer(args.hf_dir, args.out, drop_prefixes=args.drop_prefix or ())
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
