"""The ViT in train/ has the standard sizes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from train.model import build_vit, count_parameters


@pytest.mark.parametrize("name,millions", [("vit_tiny", 5.7), ("vit_s16", 22.1),
                                           ("vit_b16", 86.6)])
def test_standard_sizes_at_224_px_1000_classes(name, millions):
    model = build_vit(name, 224, 16, 3, 1000)
    assert count_parameters(model) / 1e6 == pytest.approx(millions, abs=0.05)


def test_vit_b16_shape_and_blocks():
    model = build_vit("vit_b16", 224, 16, 3, 1000)
    assert len(model.blocks) == 12 and model.blocks[0].attn.heads == 12
    assert model.pos_embed.shape == (1, 14 * 14 + 1, 768)  # 196 patches + the class token


def test_first_loss_is_log_of_classes():
    model = build_vit("vit_tiny", 8, 4, 1, 10, depth=2)
    logits = model(torch.randn(4, 1, 8, 8))
    assert logits.shape == (4, 10)
    loss = F.cross_entropy(logits, torch.tensor([0, 1, 2, 3]))
    assert loss.item() == pytest.approx(math.log(10), abs=1e-5)  # the zero-initialised head
