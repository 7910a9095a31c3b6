"""Network architectures written in plain torch, for model manifests whose weights ship without code
(a manifest names one as `sources.module.factory: mlharness.sut.architectures.<module>:<function>`)."""
