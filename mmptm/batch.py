"""The batch: a dict of named tensors plus meta keys, the transform protocol, the device.

Ground floor: the data pipeline writes batches, encoders, fusion modules and objectives read
them, and nothing here imports another part of mmptm. Tensor keys follow the modality
plug-ins (``input_ids``, ``pixels``, ``region_feats`` ...; pad masks are booleans, True =
real). Meta keys are wrapped in double underscores and are never moved to a device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # torch is imported where tensors are made, not by importing this module
    import torch

Batch = dict[str, Any]

#: sample keys of the rows, in order (a list of str)
KEY = "__key__"
#: the ``data.sources`` entry a training batch came from ("mono/en"; absent outside mixtures)
SOURCE = "__source__"
#: the objective sampled for this batch by ``model.task_mix`` (UNITER's task sampling)
TASK = "__task__"
#: "stacked" when a pair's two sentences are rows i and B+i of one text view (XLCO)
PAIRS = "__pairs__"
#: the batch keys that ITM negatives took from another row (a list; see objectives/itm.py)
SWAPPED = "__swapped__"
#: the loader worker that produced the batch, and its running count of skipped samples
WORKER = "__worker__"
SKIPPED = "__skipped__"
#: an end-of-epoch marker a loader worker sends after its last batch
END = "__end__"
#: per row, what ``Decoder.record`` kept of the raw sample (a list; e.g. a search index's
#: captions and thumbnail)
RECORD = "__record__"
#: per row, the self-attention pattern of a single-stream fusion (long [B], an index into
#: ``ATTENTION_MODES``), and the modality that is the target of ``seq2seq`` (a str)
ATTENTION_MODE = "attention_mode"
ATTENTION_TARGET = "__attention_target__"
#: bidirectional: every token sees every token; seq2seq (UniLM, VLP): the source sees itself,
#: the target sees the source and its own past; causal: each token sees itself and earlier ones
ATTENTION_MODES = ("bidirectional", "seq2seq", "causal")


def is_meta(key: str) -> bool:
    """Whether ``key`` is bookkeeping (``__key__`` ...) rather than model input."""
    return key.startswith("__") and key.endswith("__")


def batch_source(batch: Batch) -> str:
    """The ``data.sources`` key a batch came from ("mono/en" → "mono"; "" outside mixtures)."""
    return str(batch.get(SOURCE, "")).split("/")[0]


class BatchTransform(Protocol):
    """A data-side stage over a collated batch: picklable, seeded by the generator it is given.

    Objectives' data sides (masking, negatives) and modality plug-ins' batch stages (joining
    text pairs) are transforms. They run in ascending ``data_priority``: task sampling (0),
    answer targets (5), negatives (10, they decide what is a positive pair), joining text
    pairs into one sequence (15), masking (20). A transform whose class sets ``shared = True``
    runs once for all the objectives that ask for it.
    """

    data_priority: int

    def __call__(self, batch: Batch, g: torch.Generator) -> Batch: ...


def move_to(batch: Batch, device: torch.device | str) -> Batch:
    """Tensors to ``device``; meta keys and other values (answer strings ...) stay as they are."""
    import torch

    return {
        k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
        for k, v in batch.items()
    }


__all__ = [
    "END",
    "KEY",
    "PAIRS",
    "RECORD",
    "SKIPPED",
    "SOURCE",
    "SWAPPED",
    "TASK",
    "WORKER",
    "Batch",
    "BatchTransform",
    "batch_source",
    "is_meta",
    "move_to",
]


def pick_device(name: str, local_rank: int = 0, *, setting: str = "--device") -> torch.device:
    """The device ``name`` names for this process: ``auto`` is a GPU where torch sees one,
    else the CPU; ``cuda`` without an index is GPU ``local_rank``. A device this machine
    lacks, or a name torch does not know, is a ValueError naming ``setting`` (the flag or
    config key it came from), so that the command line prints one line, not a traceback."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"{setting} {name!r} is not a device (cpu, cuda, cuda:N, auto)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"{setting} {name}: torch sees no CUDA GPU on this machine (torch "
                f"{torch.__version__}, built for CUDA {torch.version.cuda}); use cpu or auto"
            )
        index = local_rank if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"{setting} {name}: there is no GPU {index} (this machine has "
                f"{torch.cuda.device_count()})"
            )
        return torch.device("cuda", index)
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{setting} {name}: torch sees no Apple GPU (MPS) here; use cpu or auto")
    return device
