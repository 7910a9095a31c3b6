"""Generative models (issue 19): prompts tokenized before LoadGen starts, an engine that streams tokens
(mlharness.sut.backends.llm_transformers), and a SUT that reports them to LoadGen per token."""
