"""Decoding tokens/s: mmptm's TransformerDecoder with and without its KV cache, and HF
``generate`` (``MBartForConditionalGeneration``, ``use_cache=True``) at equal shapes.

The mmptm model is an mBART decoder built from mmptm parts (token + learned position
embeddings, an embedding LayerNorm, ``TransformerDecoder`` with cross-attention, tied output)
and takes the HF model's random weights, so both compute the same function: the script
checks that they write the same tokens before it times anything. The context (an encoder's
output, random) is given to both, so only decoding is timed. eos is banned until ``--new``
tokens (``min_len = max_len``, HF's ``min_new_tokens``), so every run writes exactly
``--new`` tokens per row; tokens/s counts the rows' output tokens (batch × new), beams not
multiplied. Rounds alternate between the three so background load falls on all alike.

    .venv/bin/python benchmarks/bench_generate.py                  # CPU, ~3 min
    .venv/bin/python benchmarks/bench_generate.py --device cuda --batch 64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mmptm.generate.decoding import DecodeConfig, decode
from mmptm.layers import TransformerConfig, TransformerDecoder

START = 2  # mBART's decoder start (its eos)


class MmptmMBartDecoder(nn.Module):
    """An mBART decoder out of mmptm parts (pre-LN blocks, closing LayerNorm, tied output)."""

    def __init__(self, a: argparse.Namespace) -> None:
        super().__init__()
        cfg = TransformerConfig(
            layers=a.layers,
            heads=a.heads,
            mlp_ratio=a.ffn / a.width,
            dropout=0.0,
            attn_dropout=0.0,
            layer_norm_eps=1e-5,
        )
        self.embed = nn.Embedding(a.vocab, a.width)
        self.pos = nn.Embedding(a.new + 8, a.width)
        self.emb_norm = nn.LayerNorm(a.width)
        self.decoder = TransformerDecoder(a.width, cfg, cross_width=a.width)

    def next_logits(self, ids_BT, ctx_BMD, ctx_mask_BM, cache, start: int) -> torch.Tensor:
        pos_T = torch.arange(start, start + ids_BT.shape[1], device=ids_BT.device)
        x_BTD = self.emb_norm(self.embed(ids_BT) + self.pos(pos_T))
        h_BTD = self.decoder(x_BTD, None, ctx_BMD, ctx_mask_BM, cache=cache)
        return h_BTD[:, -1] @ self.embed.weight.T


class Stepper:
    """``decode``'s step function over ``MmptmMBartDecoder``; state (ctx, mask, cache)."""

    def __init__(self, model: MmptmMBartDecoder, use_cache: bool) -> None:
        self.model, self.use_cache = model, use_cache

    def initial(self, ctx_BMD, ctx_mask_BM):
        cache = self.model.decoder.new_cache() if self.use_cache else None
        return ctx_BMD, ctx_mask_BM, cache

    def step(self, ids_BT, state):
        ctx, mask, cache = state
        start = 0 if cache is None else cache.length
        return self.model.next_logits(ids_BT[:, start:], ctx, mask, cache, start), state

    def reorder(self, state, index_B):
        ctx, mask, cache = state
        if cache is not None:
            cache.reorder(index_B)
        return ctx.index_select(0, index_B), mask.index_select(0, index_B), cache


def hf_model(a: argparse.Namespace):
    from transformers import MBartConfig, MBartForConditionalGeneration

    cfg = MBartConfig(
        vocab_size=a.vocab,
        d_model=a.width,
        encoder_layers=1,
        decoder_layers=a.layers,
        encoder_attention_heads=a.heads,
        decoder_attention_heads=a.heads,
        encoder_ffn_dim=a.ffn,
        decoder_ffn_dim=a.ffn,
        max_position_embeddings=a.new + 8,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation_function="gelu",
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=START,
        forced_eos_token_id=None,
        scale_embedding=False,
    )
    torch.manual_seed(0)
    return MBartForConditionalGeneration(cfg).eval()


def copy_weights(hf, ours: MmptmMBartDecoder) -> None:
    """HF mBART decoder weights → the mmptm decoder (same function)."""
    d = hf.model.decoder
    pairs = [
        (ours.embed, d.embed_tokens),
        (ours.emb_norm, d.layernorm_embedding),
        (ours.decoder.norm, d.layer_norm),
    ]
    for block, layer in zip(ours.decoder.blocks, d.layers):
        pairs += [
            (block.norm1, layer.self_attn_layer_norm),
            (block.norm_cross, layer.encoder_attn_layer_norm),
            (block.norm2, layer.final_layer_norm),
            (block.mlp[0], layer.fc1),
            (block.mlp[2], layer.fc2),
        ]
        for ours_attn, hf_attn in (
            (block.attn, layer.self_attn),
            (block.cross, layer.encoder_attn),
        ):
            for name, hf_name in (
                ("q", "q_proj"),
                ("k", "k_proj"),
                ("v", "v_proj"),
                ("out", "out_proj"),
            ):
                pairs.append((getattr(ours_attn, name), getattr(hf_attn, hf_name)))
    with torch.no_grad():
        for dst, src in pairs:
            dst.load_state_dict(src.state_dict())
        # mBART's learned positions start at row 2 (its offset).
        ours.pos.weight.copy_(d.embed_positions.weight[2 : 2 + ours.pos.num_embeddings])
    assert not hf.final_logits_bias.any()


def runners(a, hf, ours, beam: int):
    """name → a function that decodes the batch and returns its new tokens [B,new]."""
    from transformers.modeling_outputs import BaseModelOutput

    g = torch.Generator().manual_seed(1)
    ctx_BMD = torch.randn(a.batch, a.ctx, a.width, generator=g).to(a.device)
    ctx_mask_BM = torch.ones(a.batch, a.ctx, dtype=torch.bool, device=a.device)
    ctx_mask_BM[::2, a.ctx // 2 :] = False  # every other row: half its context is padding
    start_BP = torch.full((a.batch, 1), START, device=a.device)
    cfg = DecodeConfig(max_len=a.new, min_len=a.new, beam=beam, length_penalty=1.0)

    def ours_run(use_cache: bool):
        stepper = Stepper(ours, use_cache)

        def run():
            state = stepper.initial(ctx_BMD, ctx_mask_BM)
            out = decode(stepper, start_BP, cfg, eos_id=2, state=state)
            return torch.tensor(out.ids)

        return run

    def hf_run():
        out = hf.generate(
            encoder_outputs=BaseModelOutput(last_hidden_state=ctx_BMD),
            attention_mask=ctx_mask_BM.long(),
            decoder_input_ids=start_BP,
            max_new_tokens=a.new,
            min_new_tokens=a.new,
            num_beams=beam,
            do_sample=False,
            length_penalty=1.0,
            use_cache=True,
        )
        return out[:, 1:].cpu()

    return {"mmptm_cache": ours_run(True), "mmptm_nocache": ours_run(False), "hf_generate": hf_run}


def time_rounds(fns, a, sync) -> dict[str, list[float]]:
    """Tokens/s per round for each function, rounds alternating between them."""
    rates: dict[str, list[float]] = {n: [] for n in fns}
    for r in range(a.rounds):
        line = []
        for name, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            rates[name].append(a.batch * a.new / (time.perf_counter() - t0))
            line.append(f"{name}={rates[name][-1]:8.1f}")
        print(f"  round {r + 1}/{a.rounds}: tokens/s " + "  ".join(line), flush=True)
    return rates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in (
        ("batch", 16),
        ("ctx", 64),
        ("new", 32),
        ("width", 256),
        ("layers", 4),
        ("heads", 4),
        ("ffn", 1024),
        ("vocab", 8000),
        ("rounds", 5),
    ):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--beams", default="1,4")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    hf = hf_model(a).to(a.device)
    ours = MmptmMBartDecoder(a)
    copy_weights(hf, ours)
    ours = ours.eval().to(a.device)
    n_dec = sum(t.numel() for t in ours.parameters())
    print(f"device={a.device} threads={torch.get_num_threads()} torch={torch.__version__}")
    print(
        f"shape: batch {a.batch}, context {a.ctx}, new tokens {a.new}, width {a.width}, "
        f"layers {a.layers}, heads {a.heads}, ffn {a.ffn}, vocab {a.vocab}; "
        f"decoder parameters {n_dec / 1e6:.2f}M (mmptm) / "
        f"{sum(t.numel() for t in hf.model.decoder.parameters()) / 1e6:.2f}M (HF)"
    )
    summary = []
    with torch.inference_mode():
        for beam in (int(b) for b in a.beams.split(",")):
            fns = runners(a, hf, ours, beam)
            toks = {n: fn() for n, fn in fns.items()}  # also the warm-up
            same_cache = torch.equal(toks["mmptm_cache"], toks["mmptm_nocache"])
            same_hf = torch.equal(toks["mmptm_cache"], toks["hf_generate"])
            agree = (toks["mmptm_cache"] == toks["hf_generate"]).float().mean().item()
            print(
                f"beam {beam}: tokens cached == uncached: {same_cache}; mmptm == HF generate: "
                f"{same_hf} ({agree:.1%} of tokens)"
            )
            med = {n: statistics.median(v) for n, v in time_rounds(fns, a, sync).items()}
            summary.append((beam, med, same_cache, same_hf))
    print("\n| beam | mmptm cached | mmptm uncached | HF generate | cache speed-up | mmptm/HF |")
    print("|---|---|---|---|---|---|")
    for beam, med, _, _ in summary:
        c, u, h = med["mmptm_cache"], med["mmptm_nocache"], med["hf_generate"]
        print(f"| {beam} | {c:.0f} | {u:.0f} | {h:.0f} | {c / u:.2f}× | {c / h:.2f}× |")
    print("(median tokens/s over rounds; tokens = batch × new tokens)")


if __name__ == "__main__":
    main()
