"""The names of the settings: scenarios, modes, the keys LoadGen reads from user.conf and the keys
the harness reads. A module of its own so that the settings' schemas (settings_schema) and their
layering (settings) both read them without importing each other."""
from __future__ import annotations

import difflib

SCENARIOS = ("SingleStream", "MultiStream", "Server", "Offline")
MODES = ("performance", "accuracy", "submission", "find-peak")

# Keys LoadGen's FromConfig understands in user.conf (`model.Scenario.key = value`).
LOADGEN_KEYS = frozenset({
    "target_qps", "target_latency", "target_latency_percentile", "min_duration", "max_duration",
    "min_query_count", "max_query_count", "qsl_rng_seed", "sample_index_rng_seed", "schedule_rng_seed",
    "accuracy_log_rng_seed", "accuracy_log_probability", "accuracy_log_sampling_target",
    "performance_issue_unique", "performance_issue_same", "performance_issue_same_index",
    "performance_sample_count_override", "samples_per_query", "max_async_queries", "coalesce_queries",
    "print_timestamps", "sample_concatenate_permutation", "test05", "test05_qsl_rng_seed",
    "test05_sample_index_rng_seed", "test05_schedule_rng_seed", "server_num_issue_query_threads",
    "use_token_latencies", "ttft_latency", "tpot_latency", "infer_token_latencies",
    "token_latency_scaling_factor",
})
# Keys the SUT reads; the rest of the harness passes them through untouched.
HARNESS_KEYS = frozenset({"max_batch_size", "workers", "intra_op_threads", "inter_op_threads",
                          "enable_trace", "dataset_limit", "warmup_queries", "warmup_seconds",
                          "load_timeout", "graph_optimization", "execution_mode", "batch_wait_ms",
                          "postprocess_group_rows",
                          "cuda_graphs",  # cuda_graphs: the torch backend on a GPU (docs/gpu.md)
                          "llm_batching",  # llm_batching: a generative model's scheduling (docs/llm.md)
                          # a run against a server (--endpoint, docs/network.md)
                          "endpoint_model", "endpoint_concurrency", "endpoint_timeout", "endpoint_connect_timeout",
                          "endpoint_binary", "issue_lag_limit_ms", "endpoint_api", "endpoint_token_count",
                          "endpoint_retries"})

SETTING_KEYS = sorted(LOADGEN_KEYS | HARNESS_KEYS)
SCOPES = ("*", *SCENARIOS)  # what settings are scoped by in the YAML that carries them: every scenario, or one


def setting_hint(key: object) -> str:
    """What to say of an unknown setting name: the closest known one, not all of them (60 names)."""
    close = difflib.get_close_matches(str(key), SETTING_KEYS, n=1)
    return f"did you mean {close[0]!r}?" if close else "not a LoadGen user.conf key or a harness key; README lists them"
