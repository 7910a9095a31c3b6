"""Network architectures written in plain torch, for model manifests whose weights ship without code
(a manifest names one as `sources.module.factory: mlharness.sut.architectures.<module>:<function>`)."""

from typing import Any


def init_weights(model: Any, conv_mode: str = "fan_out", conv_nonlinearity: str = "relu",
                 zero_conv_bias: bool = False) -> None:
    """The random initialisation these architectures share, in module order: every convolution's weight
    Kaiming-normal (`conv_mode`, `conv_nonlinearity`; its bias zeroed when asked), every linear
    layer's weight normal(0, 0.01) and its bias zero. Batch norms keep torch's own (ones, zeros)."""
    from torch import nn

    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode=conv_mode, nonlinearity=conv_nonlinearity)
            if zero_conv_bias:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0, 0.01)
            nn.init.zeros_(module.bias)
