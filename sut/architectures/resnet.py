"""ResNet (He et al., 2015, Table 1), with ResNeXt's grouped bottleneck (Xie et al., 2017) and the
wide bottleneck (Zagoruyko and Komodakis, 2016) as options of the same block. Written from the
papers' tables: a 7x7/2 stem and a 3x3/2 max pool, four stages of 64, 128, 256, 512 channels (times 4
after a bottleneck), a projection shortcut (1x1 conv + BN) where the shape changes, global average
pooling and one linear layer. The stride of a bottleneck sits on its 3x3 convolution.

Weights are random (seeded): these networks are for performance measurements only."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlharness.sut.architectures import init_weights

# depth -> (block, blocks per stage), Table 1.
DEPTHS: dict[int, tuple[str, tuple[int, int, int, int]]] = {
    18: ("basic", (2, 2, 2, 2)), 34: ("basic", (3, 4, 6, 3)), 50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)), 152: ("bottleneck", (3, 8, 36, 3)),
}
STAGE_CHANNELS = (64, 128, 256, 512)
RESIDUAL_GAIN = 0.2  # the last BN's scale in each residual branch, so 50 blocks do not grow the scale 2^50-fold


def _conv_bn(in_ch: int, out_ch: int, kernel: int, stride: int = 1, groups: int = 1, relu: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(in_ch, out_ch, kernel, stride, kernel // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(out_ch)]
    if relu:
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


class Block(nn.Module):
    """A residual block: basic (3x3, 3x3) or bottleneck (1x1, 3x3 grouped, 1x1 expanding by 4)."""

    def __init__(self, kind: str, in_ch: int, planes: int, stride: int, groups: int = 1, width_per_group: int = 64):
        super().__init__()
        if kind == "basic":
            out_ch = planes
            self.branch = nn.Sequential(_conv_bn(in_ch, planes, 3, stride), _conv_bn(planes, planes, 3, relu=False))
        else:
            out_ch = planes * 4
            width = int(planes * width_per_group / 64) * groups
            self.branch = nn.Sequential(_conv_bn(in_ch, width, 1), _conv_bn(width, width, 3, stride, groups),
                                        _conv_bn(width, out_ch, 1, relu=False))
        self.shortcut = (_conv_bn(in_ch, out_ch, 1, stride, relu=False) if stride != 1 or in_ch != out_ch
                         else nn.Identity())
        self.out_channels = out_ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.branch(x) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, depth: int = 50, num_classes: int = 1000, groups: int = 1, width_per_group: int = 64):
        super().__init__()
        kind, counts = DEPTHS[depth]
        self.stem = nn.Sequential(_conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
        blocks: list[nn.Module] = []
        channels = 64
        for stage, (planes, count) in enumerate(zip(STAGE_CHANNELS, counts)):
            for index in range(count):
                block = Block(kind, channels, planes, 2 if stage > 0 and index == 0 else 1, groups, width_per_group)
                blocks.append(block)
                channels = block.out_channels
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(channels, num_classes)
        init_weights(self)
        for block in blocks:
            nn.init.constant_(block.branch[-1][1].weight, RESIDUAL_GAIN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def resnet(ctx: Any = None, *, depth: int = 50, num_classes: int = 1000, groups: int = 1, width_per_group: int = 64,
           seed: int = 0) -> ResNet:
    """A seeded ResNet in eval mode. The manifest factory too: ctx.attributes may set any keyword
    (ResNeXt-50 32x4d: groups 32, width_per_group 4; Wide ResNet-50-2: width_per_group 128)."""
    options = {"depth": depth, "num_classes": num_classes, "groups": groups, "width_per_group": width_per_group,
               "seed": seed}
    options.update({k: v for k, v in (getattr(ctx, "attributes", None) or {}).items() if k in options})
    if int(options["depth"]) not in DEPTHS:
        raise ValueError(f"depth: one of {sorted(DEPTHS)}, got {options['depth']!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(options["seed"]))
        model = ResNet(int(options["depth"]), int(options["num_classes"]), int(options["groups"]),
                       int(options["width_per_group"]))
    return model.eval()
