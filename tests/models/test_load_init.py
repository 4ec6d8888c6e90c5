"""``init_mode: encoders``: the encoders a checkpoint has are loaded whole, the rest stay new."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mmptm.models.load import encoder_prefixes, load_init


class _Model(nn.Module):
    def __init__(self, names):
        super().__init__()
        self.encoders = nn.ModuleDict({n: nn.Linear(2, 2) for n in names})


def test_only_the_checkpoints_encoders_are_required_and_loaded():
    src, dst = _Model(["audio", "text"]), _Model(["audio", "image"])
    before = dst.encoders["image"].weight.detach().clone()
    sd = src.state_dict()
    only = encoder_prefixes(dst, sd, "run")
    assert only == ("encoders.audio.",)
    load_init(dst, sd, "run", only=only)
    assert torch.equal(dst.encoders["audio"].weight, src.encoders["audio"].weight)
    assert torch.equal(dst.encoders["image"].weight, before)  # new: not in the checkpoint
    # a checkpoint missing part of an encoder it has is an error, naming the tensors
    partial = {k: v for k, v in sd.items() if k != "encoders.audio.bias"}
    with pytest.raises(ValueError, match=r"lacks 1 tensors.*encoders.audio.bias"):
        load_init(dst, partial, "run", only=only)


def test_a_checkpoint_with_none_of_the_encoders_is_an_error():
    with pytest.raises(ValueError, match="none of the model's encoders"):
        encoder_prefixes(_Model(["image"]), _Model(["audio"]).state_dict(), "run")
