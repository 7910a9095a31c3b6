"""VGG (Simonyan and Zisserman, 2014, Table 1): configurations A, B, D, E (VGG-11, 13, 16, 19) of 3x3
convolutions (padding 1) with ReLU, 2x2/2 max pools between the five groups, and three fully connected
layers (4096, 4096, classes) with dropout. `batch_norm` puts a BN after every convolution (the variant
most zoos carry). An adaptive average pool to 7x7 lets a smaller input through (it is the identity at
224x224).

Weights are random (seeded): these networks are for performance measurements only."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlharness.sut.architectures import init_weights

# Convolutions per group of channels 64, 128, 256, 512, 512 (Table 1, columns A, B, D, E).
DEPTHS: dict[int, tuple[int, int, int, int, int]] = {
    11: (1, 1, 2, 2, 2), 13: (2, 2, 2, 2, 2), 16: (2, 2, 3, 3, 3), 19: (2, 2, 4, 4, 4),
}
GROUP_CHANNELS = (64, 128, 256, 512, 512)


class VGG(nn.Module):
    def __init__(self, depth: int = 16, batch_norm: bool = False, num_classes: int = 1000, dropout: float = 0.5):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for out_ch, count in zip(GROUP_CHANNELS, DEPTHS[depth]):
            for _ in range(count):
                layers.append(nn.Conv2d(channels, out_ch, 3, padding=1))
                if batch_norm:
                    layers.append(nn.BatchNorm2d(out_ch))
                layers.append(nn.ReLU(inplace=True))
                channels = out_ch
            layers.append(nn.MaxPool2d(2, 2))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(7)
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(4096, num_classes))
        init_weights(self, zero_conv_bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


def vgg(ctx: Any = None, *, depth: int = 16, batch_norm: bool = False, num_classes: int = 1000, seed: int = 0) -> VGG:
    """A seeded VGG in eval mode. The manifest factory too: ctx.attributes may set any keyword."""
    options = {"depth": depth, "batch_norm": batch_norm, "num_classes": num_classes, "seed": seed}
    options.update({k: v for k, v in (getattr(ctx, "attributes", None) or {}).items() if k in options})
    if int(options["depth"]) not in DEPTHS:
        raise ValueError(f"depth: one of {sorted(DEPTHS)}, got {options['depth']!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(options["seed"]))
        model = VGG(int(options["depth"]), bool(options["batch_norm"]), int(options["num_classes"]))
    return model.eval()
