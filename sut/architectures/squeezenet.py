"""SqueezeNet (Iandola et al., 2016): Fire modules (a 1x1 squeeze, then 1x1 and 3x3 expands
concatenated), the layout of the paper's Table 1 (v1.0: a 7x7/2 stem of 96 channels, pools after
fire4 and fire8) and of its v1.1 revision (a 3x3/2 stem of 64 channels, pools after fire3 and fire5:
the same accuracy at 2.4x less computation). Max pools are 3x3/2 rounding up, as in Caffe. The
classifier is dropout, a 1x1 convolution to the classes, ReLU and global average pooling.

Weights are random (seeded): these networks are for performance measurements only."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

# Fire modules by (squeeze, expand 1x1 = expand 3x3), 'M' a max pool, after the stem and its pool.
LAYOUTS: dict[str, tuple[int, int, tuple[Any, ...]]] = {  # version -> (stem channels, stem kernel, layout)
    "1.0": (96, 7, ((16, 64), (16, 64), (32, 128), "M", (32, 128), (48, 192), (48, 192), (64, 256), "M", (64, 256))),
    "1.1": (64, 3, ((16, 64), (16, 64), "M", (32, 128), (32, 128), "M", (48, 192), (48, 192), (64, 256), (64, 256))),
}


class Fire(nn.Module):
    def __init__(self, in_ch: int, squeeze: int, expand: int):
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(in_ch, squeeze, 1), nn.ReLU(inplace=True))
        self.expand1 = nn.Sequential(nn.Conv2d(squeeze, expand, 1), nn.ReLU(inplace=True))
        self.expand3 = nn.Sequential(nn.Conv2d(squeeze, expand, 3, padding=1), nn.ReLU(inplace=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.squeeze(x)
        return torch.cat([self.expand1(x), self.expand3(x)], 1)


class SqueezeNet(nn.Module):
    def __init__(self, version: str = "1.1", num_classes: int = 1000, dropout: float = 0.5):
        super().__init__()
        stem, kernel, layout = LAYOUTS[version]
        layers: list[nn.Module] = [nn.Conv2d(3, stem, kernel, 2), nn.ReLU(inplace=True),
                                   nn.MaxPool2d(3, 2, ceil_mode=True)]
        channels = stem
        for item in layout:
            if item == "M":
                layers.append(nn.MaxPool2d(3, 2, ceil_mode=True))
            else:
                layers.append(Fire(channels, *item))
                channels = 2 * item[1]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Conv2d(channels, num_classes, 1), nn.ReLU(inplace=True))
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.classifier[1].weight, 0, 0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.classifier(self.features(x)), 1)
        return torch.flatten(x, 1)


def squeezenet(ctx: Any = None, *, version: str = "1.1", num_classes: int = 1000, seed: int = 0) -> SqueezeNet:
    """A seeded SqueezeNet in eval mode. The manifest factory too: ctx.attributes may set any keyword."""
    options = {"version": version, "num_classes": num_classes, "seed": seed}
    options.update({k: v for k, v in (getattr(ctx, "attributes", None) or {}).items() if k in options})
    if str(options["version"]) not in LAYOUTS:
        raise ValueError(f"version: one of {sorted(LAYOUTS)}, got {options['version']!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(options["seed"]))
        model = SqueezeNet(str(options["version"]), int(options["num_classes"]))
    return model.eval()
