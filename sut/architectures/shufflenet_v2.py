"""ShuffleNet V2 (Ma et al., 2018, Table 5 and Figure 3c/d): a 3x3/2 convolution of 24 channels and a
3x3/2 max pool, three stages of 4, 8 and 4 units, a 1x1 convolution (1024 channels, 2048 at 2.0x),
global average pooling and one linear layer. A unit of stride 1 splits its channels in two, passes
one half through (1x1 conv, 3x3 depthwise, 1x1 conv) and concatenates; a unit of stride 2 sends the
whole input through two branches (3x3/2 depthwise then 1x1; and 1x1, 3x3/2 depthwise, 1x1). Both end
with a channel shuffle of two groups. Every convolution has BN; ReLU follows each 1x1 convolution.

Weights are random (seeded): these networks are for performance measurements only."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlharness.sut.architectures import init_weights

# width -> output channels of stages 2, 3, 4 and of conv5 (Table 5).
WIDTHS: dict[str, tuple[int, int, int, int]] = {
    "0.5": (48, 96, 192, 1024), "1.0": (116, 232, 464, 1024), "1.5": (176, 352, 704, 1024), "2.0": (244, 488, 976, 2048),
}
REPEATS = (4, 8, 4)


def _conv_bn(in_ch: int, out_ch: int, kernel: int, stride: int = 1, depthwise: bool = False, relu: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(in_ch, out_ch, kernel, stride, kernel // 2, groups=in_ch if depthwise else 1,
                                         bias=False), nn.BatchNorm2d(out_ch)]
    if relu:
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


def channel_shuffle(x: torch.Tensor, groups: int = 2) -> torch.Tensor:
    _, channels, height, width = x.shape
    x = x.reshape(-1, groups, channels // groups, height, width).transpose(1, 2)
    return x.reshape(-1, channels, height, width)


class Unit(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int):
        super().__init__()
        half = out_ch // 2
        self.stride = stride
        self.shortcut = (nn.Sequential(_conv_bn(in_ch, in_ch, 3, stride, depthwise=True, relu=False),
                                       _conv_bn(in_ch, half, 1)) if stride > 1 else nn.Identity())
        branch_in = in_ch if stride > 1 else half
        self.branch = nn.Sequential(_conv_bn(branch_in, half, 1),
                                    _conv_bn(half, half, 3, stride, depthwise=True, relu=False),
                                    _conv_bn(half, half, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            kept, x = x.chunk(2, dim=1)
            out = torch.cat([kept, self.branch(x)], 1)
        else:
            out = torch.cat([self.shortcut(x), self.branch(x)], 1)
        return channel_shuffle(out)


class ShuffleNetV2(nn.Module):
    def __init__(self, width: str = "1.0", num_classes: int = 1000):
        super().__init__()
        *stages, last = WIDTHS[width]
        layers: list[nn.Module] = [_conv_bn(3, 24, 3, 2), nn.MaxPool2d(3, 2, 1)]
        channels = 24
        for out_ch, repeats in zip(stages, REPEATS):
            for index in range(repeats):
                layers.append(Unit(channels, out_ch, 2 if index == 0 else 1))
                channels = out_ch
        layers.append(_conv_bn(channels, last, 1))
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(last, num_classes)
        # By fan-in: a depthwise convolution's fan-out counts every channel's outputs and would shrink
        # random activations at every unit.
        init_weights(self, conv_mode="fan_in")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.fc(torch.flatten(x, 1))


def shufflenet_v2(ctx: Any = None, *, width: str = "1.0", num_classes: int = 1000, seed: int = 0) -> ShuffleNetV2:
    """A seeded ShuffleNet V2 in eval mode. The manifest factory too: ctx.attributes may set any keyword
    (width: '0.5', '1.0', '1.5' or '2.0')."""
    options = {"width": width, "num_classes": num_classes, "seed": seed}
    options.update({k: v for k, v in (getattr(ctx, "attributes", None) or {}).items() if k in options})
    if str(options["width"]) not in WIDTHS:
        raise ValueError(f"width: one of {sorted(WIDTHS)}, got {options['width']!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(options["seed"]))
        model = ShuffleNetV2(str(options["width"]), int(options["num_classes"]))
    return model.eval()
