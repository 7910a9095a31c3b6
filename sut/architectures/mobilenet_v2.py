"""MobileNetV2 (Sandler et al., 2018) in plain torch. Submodule names and order follow the layout
of the widely published ImageNet state dict (`features.N...`, `classifier.1`), so that
`mobilenet_v2-b0353104.pth` loads with strict key matching; torchvision itself is not needed.

The width multiplier (the paper's section 6.1) scales every layer's channels, rounded to a multiple of
8 and never below 90% of the scaled count; the last 1x1 convolution keeps 1280 channels below 1.0.
At 1.0 the network is the one above."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlharness.sut.architectures import init_weights

# (expansion t, output channels c, repeats n, first stride s), from the paper's Table 2.
_BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def _divisible(channels: float, divisor: int = 8) -> int:
    """`channels` rounded to the nearest multiple of `divisor`, never more than 10% below it."""
    rounded = max(divisor, int(channels + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * channels else rounded


def _conv_bn(in_ch: int, out_ch: int, kernel: int, stride: int = 1, groups: int = 1, relu: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(in_ch, out_ch, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(out_ch)]
    if relu:
        layers.append(nn.ReLU6(inplace=True))
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """1x1 expansion, 3x3 depthwise, 1x1 linear projection; a skip connection when shapes allow."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, expansion: int):
        super().__init__()
        hidden = in_ch * expansion
        self.use_skip = stride == 1 and in_ch == out_ch
        layers: list[nn.Module] = []
        if expansion != 1:
            layers.append(_conv_bn(in_ch, hidden, 1))
        layers.append(_conv_bn(hidden, hidden, 3, stride, groups=hidden))
        # The projection is a bare conv + BN (indices conv.N and conv.N+1 in the state dict).
        layers.append(nn.Conv2d(hidden, out_ch, 1, bias=False))
        layers.append(nn.BatchNorm2d(out_ch))
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_skip else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000, dropout: float = 0.2, width_mult: float = 1.0):
        super().__init__()
        channels, last = _divisible(32 * width_mult), _divisible(1280 * max(1.0, width_mult))
        features: list[nn.Module] = [_conv_bn(3, channels, 3, stride=2)]
        for expansion, base_ch, repeats, stride in _BLOCKS:
            out_ch = _divisible(base_ch * width_mult)
            for i in range(repeats):
                features.append(InvertedResidual(channels, out_ch, stride if i == 0 else 1, expansion))
                channels = out_ch
        features.append(_conv_bn(channels, last, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(last, num_classes))
        self._init_weights()

    def _init_weights(self) -> None:
        # Only matters without a state dict; kept so an untrained network is still well scaled.
        init_weights(self, conv_nonlinearity="leaky_relu")  # kaiming_normal_'s default nonlinearity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
        return self.classifier(x)


def mobilenet_v2(ctx: Any = None) -> MobileNetV2:
    """The manifest factory: ctx.attributes may set num_classes (default 1000), width_mult (default
    1.0) and seed (the random weights are seeded only when it is set: a manifest that loads weights
    does not need it)."""
    attributes = getattr(ctx, "attributes", None) or {}
    options = {"num_classes": int(attributes.get("num_classes", 1000)),
               "width_mult": float(attributes.get("width_mult", 1.0))}
    if "seed" not in attributes:
        return MobileNetV2(**options)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(attributes["seed"]))
        model = MobileNetV2(**options)
        for module in model.modules():
            if isinstance(module, nn.Conv2d) and module.groups > 1:
                # Depthwise: scaled by each output's own 9 inputs. The init above scales by all the
                # layer's outputs, which shrinks random activations a thousandfold per block.
                nn.init.kaiming_normal_(module.weight, mode="fan_in")
    return model.eval()
