"""A Vision Transformer in plain torch (Dosovitskiy et al., "An Image is Worth 16x16 Words").

Patch embedding, a class token, learned position embeddings and pre-norm encoder blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ViTConfig:
    width: int
    depth: int
    heads: int
    mlp_ratio: float = 4.0


# The standard sizes (timm/DeiT names). ViT-B/16 at 224 px with 1000 classes has 86.6 M params.
VIT_SIZES = {
    "vit_tiny": ViTConfig(width=192, depth=12, heads=3),
    "vit_s16": ViTConfig(width=384, depth=12, heads=6),
    "vit_b16": ViTConfig(width=768, depth=12, heads=12),
}


class Attention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, mlp_ratio: float):
        super().__init__()
        hidden = int(width * mlp_ratio)
        self.norm1 = nn.LayerNorm(width, eps=1e-6)
        self.attn = Attention(width, heads)
        self.norm2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    def __init__(self, cfg: ViTConfig, image_size: int, patch_size: int, in_channels: int,
                 num_classes: int):
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
        if cfg.width % cfg.heads:
            raise ValueError(f"width {cfg.width} is not divisible by heads {cfg.heads}")
        num_patches = (image_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(in_channels, cfg.width, kernel_size=patch_size,
                                     stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.width))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, cfg.width))
        self.blocks = nn.Sequential(*[Block(cfg.width, cfg.heads, cfg.mlp_ratio)
                                      for _ in range(cfg.depth)])
        self.norm = nn.LayerNorm(cfg.width, eps=1e-6)
        self.head = nn.Linear(cfg.width, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        # A zero head makes the first loss exactly log(num_classes): a quick sanity check.
        nn.init.zeros_(self.head.weight)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


def build_vit(name: str, image_size: int, patch_size: int, in_channels: int, num_classes: int,
              depth: int | None = None, width: int | None = None,
              heads: int | None = None) -> VisionTransformer:
    base = VIT_SIZES[name]
    cfg = ViTConfig(width=width or base.width, depth=depth or base.depth,
                    heads=heads or base.heads, mlp_ratio=base.mlp_ratio)
    return VisionTransformer(cfg, image_size, patch_size, in_channels, num_classes)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
