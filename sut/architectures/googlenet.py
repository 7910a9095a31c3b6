"""GoogLeNet / Inception v1 (Szegedy et al., 2014, Table 1): a 7x7/2 convolution, 3x3/2 max pool,
1x1 and 3x3 convolutions, nine Inception modules (1x1; 1x1 then 3x3; 1x1 then 5x5; 3x3 max pool then
1x1, concatenated) in three groups between 3x3/2 max pools, global average pooling, dropout 0.4 and
one linear layer. As in later practice, every convolution is followed by BN and the local response
normalisation is left out; the auxiliary classifiers are training-only and left out too. Max pools
round up, as in Caffe, so the feature maps are the table's 112, 56, 28, 14, 7.

Weights are random (seeded): these networks are for performance measurements only."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlharness.sut.architectures import init_weights

# Table 1: #1x1, #3x3 reduce, #3x3, #5x5 reduce, #5x5, pool proj; 'M' a 3x3/2 max pool.
INCEPTIONS: tuple[Any, ...] = (
    (64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64), "M",
    (192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
    (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128), "M",
    (256, 160, 320, 32, 128, 128), (384, 192, 384, 48, 128, 128),
)


def _conv_bn(in_ch: int, out_ch: int, kernel: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, kernel, stride, kernel // 2, bias=False),
                         nn.BatchNorm2d(out_ch, eps=0.001), nn.ReLU(inplace=True))


class Inception(nn.Module):
    def __init__(self, in_ch: int, ch1: int, reduce3: int, ch3: int, reduce5: int, ch5: int, pool_proj: int):
        super().__init__()
        self.branch1 = _conv_bn(in_ch, ch1, 1)
        self.branch3 = nn.Sequential(_conv_bn(in_ch, reduce3, 1), _conv_bn(reduce3, ch3, 3))
        self.branch5 = nn.Sequential(_conv_bn(in_ch, reduce5, 1), _conv_bn(reduce5, ch5, 5))
        self.branch_pool = nn.Sequential(nn.MaxPool2d(3, 1, 1), _conv_bn(in_ch, pool_proj, 1))
        self.out_channels = ch1 + ch3 + ch5 + pool_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch3(x), self.branch5(x), self.branch_pool(x)], 1)


class GoogLeNet(nn.Module):
    def __init__(self, num_classes: int = 1000, dropout: float = 0.4):
        super().__init__()
        layers: list[nn.Module] = [_conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, ceil_mode=True),
                                   _conv_bn(64, 64, 1), _conv_bn(64, 192, 3), nn.MaxPool2d(3, 2, ceil_mode=True)]
        channels = 192
        for item in INCEPTIONS:
            if item == "M":
                layers.append(nn.MaxPool2d(3, 2, ceil_mode=True))
            else:
                module = Inception(channels, *item)
                layers.append(module)
                channels = module.out_channels
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(channels, num_classes))
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def googlenet(ctx: Any = None, *, num_classes: int = 1000, seed: int = 0) -> GoogLeNet:
    """A seeded GoogLeNet in eval mode. The manifest factory too: ctx.attributes may set any keyword."""
    options = {"num_classes": num_classes, "seed": seed}
    options.update({k: v for k, v in (getattr(ctx, "attributes", None) or {}).items() if k in options})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(options["seed"]))
        model = GoogLeNet(int(options["num_classes"]))
    return model.eval()
