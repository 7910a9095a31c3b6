"""DenseNet-BC (Huang et al., 2017, Table 1): a 7x7/2 convolution of 2k channels and a 3x3/2 max
pool, four dense blocks joined by transitions (BN, ReLU, 1x1 convolution halving the channels, 2x2/2
average pool), a final BN and ReLU, global average pooling and one linear layer. A dense layer is BN,
ReLU, 1x1 convolution to 4k channels, BN, ReLU, 3x3 convolution to k channels, concatenated to its
input. DenseNet-161 is the paper's wider ImageNet model (k = 48).

Weights are random (seeded): these networks are for performance measurements only."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlharness.sut.architectures import init_weights

# depth -> (growth rate k, layers per dense block).
DEPTHS: dict[int, tuple[int, tuple[int, int, int, int]]] = {
    121: (32, (6, 12, 24, 16)), 161: (48, (6, 12, 36, 24)), 169: (32, (6, 12, 32, 32)), 201: (32, (6, 12, 48, 32)),
}
BOTTLENECK = 4  # the 1x1 convolution's width, in multiples of k


def _bn_relu_conv(in_ch: int, out_ch: int, kernel: int) -> nn.Sequential:
    return nn.Sequential(nn.BatchNorm2d(in_ch), nn.ReLU(inplace=True),
                         nn.Conv2d(in_ch, out_ch, kernel, padding=kernel // 2, bias=False))


class DenseLayer(nn.Module):
    def __init__(self, in_ch: int, growth: int):
        super().__init__()
        self.body = nn.Sequential(_bn_relu_conv(in_ch, BOTTLENECK * growth, 1),
                                  _bn_relu_conv(BOTTLENECK * growth, growth, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.body(x)], 1)


class DenseNet(nn.Module):
    def __init__(self, depth: int = 121, num_classes: int = 1000):
        super().__init__()
        growth, counts = DEPTHS[depth]
        channels = 2 * growth
        layers: list[nn.Module] = [nn.Conv2d(3, channels, 7, 2, 3, bias=False), nn.BatchNorm2d(channels),
                                   nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
        for block, count in enumerate(counts):
            for _ in range(count):
                layers.append(DenseLayer(channels, growth))
                channels += growth
            if block < len(counts) - 1:
                layers += [_bn_relu_conv(channels, channels // 2, 1), nn.AvgPool2d(2, 2)]
                channels //= 2
        layers += [nn.BatchNorm2d(channels), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, num_classes)
        init_weights(self, conv_mode="fan_in", conv_nonlinearity="leaky_relu")  # kaiming_normal_'s defaults

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def densenet(ctx: Any = None, *, depth: int = 121, num_classes: int = 1000, seed: int = 0) -> DenseNet:
    """A seeded DenseNet in eval mode. The manifest factory too: ctx.attributes may set any keyword."""
    options = {"depth": depth, "num_classes": num_classes, "seed": seed}
    options.update({k: v for k, v in (getattr(ctx, "attributes", None) or {}).items() if k in options})
    if int(options["depth"]) not in DEPTHS:
        raise ValueError(f"depth: one of {sorted(DEPTHS)}, got {options['depth']!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(options["seed"]))
        model = DenseNet(int(options["depth"]), int(options["num_classes"]))
    return model.eval()
