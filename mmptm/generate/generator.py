"""A trained run as a writer of text: raw samples (an image, a clip, a sound, a sentence) in,
captions or translations out.

The run's generative objective decides how: an ``lm`` decoder writes from the other views'
states (BLIP-style captioning, translation), a ``clm`` continues the fused text, an ``mlm``
trained with seq2seq rows (VLP) fills a trailing [MASK] step by step. The conditioning views
are decoded by the run's own modality plug-ins, as training read them, so whatever a shard
sample holds (``jpg``, ``mp4``, ``flac``, ``txt`` + ``json``) can be described.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mmptm.batch import move_to, pick_device
from mmptm.data.decode import Collate, Decoder
from mmptm.generate.decoding import DecodeConfig, decode
from mmptm.generate.steppers import DecoderStepper, FusionStepper
from mmptm.modalities.base import DataContext, Modality, Sample, build_modalities
from mmptm.models.load import load_pretrained
from mmptm.models.pretrain import PretrainModel
from mmptm.objectives.lm import CausalLM, DecoderLM
from mmptm.objectives.mlm import MaskedLM
from mmptm.recipe import RunConfig


@dataclass
class Generated:
    """One row's text, its pieces and its (length-penalised) log-probability."""

    text: str
    ids: list[int]
    score: float


def generative_objective(model: PretrainModel) -> tuple[str, torch.nn.Module]:
    """The objective that writes text: an ``lm``, else a ``clm``, else an ``mlm`` trained
    with seq2seq rows; a one-line error when the model has none."""
    objectives = dict(model.objectives.items())
    for kind in (DecoderLM, CausalLM):
        for name, obj in objectives.items():
            if isinstance(obj, kind):
                return name, obj
    for name, obj in objectives.items():
        if isinstance(obj, MaskedLM) and obj.cfg.attention_modes.get("seq2seq", 0) > 0:
            return name, obj
    kinds = sorted({o.cfg.type for o in objectives.values()})
    raise ValueError(
        f"this run cannot write text: its objectives are {kinds}; generation needs an lm "
        "decoder, a clm, or an mlm trained with seq2seq attention_modes (VLP)"
    )


class Generator:
    """A run loaded to generate: its model, tokenizer, generative objective and the
    plug-ins of the views it conditions on."""

    def __init__(
        self, model: PretrainModel, tokenizer, cfg: RunConfig, device: str = "cpu"
    ) -> None:
        if tokenizer is None:
            raise ValueError("this run has no tokenizer: it reads no text, so it writes none")
        self.model = model.eval().to(device)
        self.tokenizer, self.cfg = tokenizer, cfg
        self.device = torch.device(device)
        self.name, self.objective = generative_objective(model)
        self.target = self._target_view()
        needs = model.data_needs()
        views = [
            v
            for enc in self.conditioning_encoders()
            for v in model.encoders[enc].data_needs()
            if v != self.target
        ]
        context = DataContext(tokenizer=tokenizer)
        self.plugins: list[Modality] = (
            build_modalities({v: needs[v] for v in views}, cfg.data.modalities, context)
            if views
            else []
        )

    @classmethod
    def load(cls, run: str, overrides: Sequence[str] = (), device: str = "cpu") -> Generator:
        """The run (a run directory or checkpoint file) on ``device`` (checked first)."""
        device = str(pick_device(device))
        model, tokenizer, cfg = load_pretrained(run, overrides)
        return cls(model, tokenizer, cfg, device)

    def _target_view(self) -> str:
        obj = self.objective
        return obj.cfg.target if isinstance(obj, DecoderLM) else obj.cfg.modality

    def conditioning_encoders(self) -> list[str]:
        """The encoders whose views a sample must hold (what the text is written from)."""
        obj = self.objective
        if isinstance(obj, DecoderLM) and obj.cfg.context:
            return list(obj.cfg.context)
        return [e for e in self.model.encoders if e != self.target]

    @property
    def members(self) -> list[str]:
        """Shard members a sample may bring for each conditioning plug-in."""
        return sorted({m for p in self.plugins for m in p.members})

    @property
    def default_language(self) -> str | None:
        """The language written when none is asked for: the run's first caption language,
        else its tokenizer's first (None for a tokenizer without languages)."""
        text = self.cfg.data.modalities.get("text")
        first = list(getattr(text, "caption_languages", ()) or ())
        first += list(getattr(self.tokenizer, "languages", ()))
        return first[0] if first else None

    def language_index(self, lang: str | None) -> int:
        """The index of the language to write (``None``: :attr:`default_language`)."""
        languages = list(getattr(self.tokenizer, "languages", ()))
        lang = lang or self.default_language
        if lang is None:
            return 0
        if lang not in languages:
            raise ValueError(f"unknown language {lang!r}; this run's languages: {languages}")
        return languages.index(lang)

    def batch(self, samples: Sequence[Sample]) -> dict:
        """Raw samples → the collated conditioning views (ValueError naming a bad sample)."""
        decoder = Decoder(self.plugins, train=False)
        decoded = []
        for s in samples:
            try:
                decoded.append(decoder(s))
            except (ValueError, KeyError) as e:
                raise ValueError(f"sample {s.get('__key__', '?')!r}: {e}") from None
        return move_to(Collate(self.plugins)(decoded), self.device)

    @torch.no_grad()
    def generate(
        self,
        samples: Sequence[Sample],
        dcfg: DecodeConfig | None = None,
        *,
        lang: str | None = None,
        prompt: str = "",
        use_cache: bool = True,
    ) -> list[Generated]:
        """The text each sample's conditioning views call for, in ``lang``."""
        dcfg = dcfg or DecodeConfig()
        rows = self.batch(samples) if self.plugins else {}
        B = len(samples)
        lang_B = torch.full((B,), self.language_index(lang), dtype=torch.long, device=self.device)
        obj, tok = self.objective, self.tokenizer
        if isinstance(obj, DecoderLM):
            if prompt:
                raise ValueError("this run's decoder writes from its context: it takes no prompt")
            ctx_BMD, ctx_mask_BM = obj.context(self.model.fuse(rows))
            stepper = DecoderStepper(obj, use_cache)
            state = stepper.initial(ctx_BMD, ctx_mask_BM, lang_B)
            start_BP = obj.start_ids(lang_B)
        else:
            mode = obj.cfg.attention if isinstance(obj, CausalLM) else "seq2seq"
            mask_id = tok.mask_id if isinstance(obj, MaskedLM) else None
            stepper = FusionStepper(self.model, obj, view=self.target, mode=mode, mask_id=mask_id)
            state = {"rows": rows, "lang_B": lang_B}
            start = [tok.cls_id, *tok.encode(prompt)] if prompt else [tok.cls_id]
            start_BP = torch.tensor([start] * B, dtype=torch.long, device=self.device)
        ban = sorted(set(tok.special_ids) - {tok.sep_id})
        out = decode(stepper, start_BP, dcfg, eos_id=tok.sep_id, ban_ids=ban, state=state)
        return [
            Generated(tok.decode(ids), list(ids), float(score))
            for ids, score in zip(out.ids, out.scores.tolist())
        ]
