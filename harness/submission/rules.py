"""The rules a v6.x submission is checked against, as facts read from the official submission
checker (mlcommons/inference tools/submission), the compliance scripts (compliance/TEST01, TEST04),
the accuracy-log truncation tool and LoadGen's built-in mlperf.conf. Data only: the checks that use
it live in checker.py and compliance.py."""
from __future__ import annotations

from dataclasses import dataclass, field

CHECKER_VERSION = "v6.1"
DIVISIONS = ("open", "closed")
SCENARIOS = ("SingleStream", "MultiStream", "Server", "Offline")


@dataclass(frozen=True)
class Benchmark:
    name: str
    performance_sample_count: int
    accuracy_metric: str          # the name the checker's accuracy pattern goes by
    accuracy_target: float        # 99% (or 99.9%) of the reference, in accuracy.txt's unit
    edge_scenarios: tuple[str, ...] = ()
    datacenter_scenarios: tuple[str, ...] = ()
    compliance_tests: tuple[str, ...] = ()
    server_latency_ns: int | None = None
    # Closed division: an Offline query must hold at least this many samples (OFFLINE_MIN_SPQ_SINCE_V4).
    offline_min_samples_per_query: int = 0
    # The accuracy run must cover the whole dataset: LoadGen's qsl_reported_total_count (dataset-size).
    dataset_size: int = 0


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("resnet", 1024, "acc", 76.46 * 0.99, ("SingleStream", "MultiStream", "Offline"), (),
              ("TEST01", "TEST04"), 15_000_000, offline_min_samples_per_query=24576, dataset_size=50000),
    Benchmark("retinanet", 64, "mAP", 37.55 * 0.99, (), (), ("TEST01",), 100_000_000,
              offline_min_samples_per_query=24576, dataset_size=24781),
    Benchmark("bert-99", 10833, "F1", 90.874 * 0.99, ("SingleStream", "Offline"), (), ("TEST01",),
              offline_min_samples_per_query=10833, dataset_size=10833),
    Benchmark("bert-99.9", 10833, "F1", 90.874 * 0.999, ("SingleStream", "Offline"), (), ("TEST01",),
              offline_min_samples_per_query=10833, dataset_size=10833),
    Benchmark("3d-unet-99", 43, "DICE", 0.86170 * 0.99, ("SingleStream", "Offline"), ("Offline",), ("TEST01",),
              offline_min_samples_per_query=43, dataset_size=43),
    Benchmark("3d-unet-99.9", 43, "DICE", 0.86170 * 0.999, ("SingleStream", "Offline"), ("Offline",), ("TEST01",),
              offline_min_samples_per_query=43, dataset_size=43),
    Benchmark("yolo-95", 64, "mAP", 53.4 * 0.95, ("SingleStream", "MultiStream", "Offline"), (), ("TEST01",),
              offline_min_samples_per_query=1525, dataset_size=1525),
    Benchmark("yolo-99", 64, "mAP", 53.4 * 0.99, ("SingleStream", "MultiStream", "Offline"), (), ("TEST01",),
              offline_min_samples_per_query=1525, dataset_size=1525),
)}
# Folder names the checker maps to a benchmark without a model_mapping.json.
ALIASES = {"resnet50": "resnet", "mobilenet": "resnet", "ssd-resnet34": "retinanet"}

# The first number after "accuracy" on an accuracy.txt line, per metric (the checker's patterns).
ACCURACY_PATTERNS = {
    "acc": r"^(?:\{\"accuracy|accuracy)[\": ]*=?\s*([\d\.]+).*",
    "mAP": r".*(?:mAP=|'Total':)\s*([\d.]+)",
    "F1": r"^{[\"\']exact_match[\"\']\:\s*[\d\.]+,\s*[\"\']f1[\"\']\:\s*([\d\.]+)}",
    "DICE": r"Accuracy\:\s*mean\s*=\s*([\d\.]+).*",
}
HASH_LINE = r"^hash=([0-9a-fA-F]+)$"

# LoadGen's built-in mlperf.conf (mlcommons-loadgen 6.0.17): runs must keep these seeds.
SEEDS = {"qsl_rng_seed": 2085463073848966840,
         "sample_index_rng_seed": 2747215439041700203,
         "schedule_rng_seed": 16159082839903944936}
MIN_DURATION_MS = 600_000
EARLY_STOPPING_SCENARIOS = ("SingleStream", "MultiStream", "Server")
MIN_QUERIES = {"Offline": 1}   # scenarios judged by query count rather than early stopping
# LoadGen errors a compliance log may carry: its audit.config is a second conf file by design.
COMPLIANCE_TOLERATED_ERRORS = ("Multiple conf files are used",)

# Files: required in each folder of results/<system>/<benchmark>/<Scenario>/.
SCENARIO_FILES = ("measurements.json", "README.md", "user.conf")
PERFORMANCE_FILES = ("mlperf_log_summary.txt", "mlperf_log_detail.txt")
ACCURACY_FILES = ("mlperf_log_summary.txt", "mlperf_log_detail.txt", "mlperf_log_accuracy.json", "accuracy.txt")
COMPLIANCE_FILES = {
    "TEST01": ("verify_accuracy.txt", "verify_performance.txt", "performance/run_1/mlperf_log_summary.txt",
               "performance/run_1/mlperf_log_detail.txt", "accuracy/mlperf_log_accuracy.json"),
    "TEST04": ("verify_performance.txt", "performance/run_1/mlperf_log_summary.txt",
               "performance/run_1/mlperf_log_detail.txt"),
}

# The truncation tool: logs above 10 KiB keep their first and last 4 KiB.
MAX_ACCURACY_LOG_SIZE = 10 * 1024
VIEWABLE_SIZE = 4096

MEASUREMENTS_FIELDS = ("input_data_types", "retraining", "starting_weights_filename", "weight_data_types",
                       "weight_transformations")

SYSTEM_FIELDS = (
    "division", "submitter", "status", "system_name", "system_type", "system_type_detail", "number_of_nodes",
    "host_processor_model_name", "host_processors_per_node", "host_processor_core_count",
    "host_processor_frequency", "host_processor_caches", "host_processor_interconnect", "host_memory_capacity",
    "host_memory_configuration", "host_storage_capacity", "host_storage_type", "host_networking",
    "host_networking_topology", "host_network_card_count", "accelerators_per_node", "accelerator_model_name",
    "accelerator_memory_capacity", "accelerator_memory_configuration", "accelerator_host_interconnect",
    "accelerator_interconnect", "accelerator_interconnect_topology", "accelerator_frequency",
    "accelerator_on-chip_memories", "cooling", "framework", "operating_system", "other_software_stack",
    "hw_notes", "sw_notes",
)
SYSTEM_MEANINGFUL_FIELDS = (
    "division", "submitter", "system_type", "status", "system_name", "number_of_nodes",
    "host_processor_model_name", "host_processors_per_node", "host_processor_core_count", "host_memory_capacity",
    "host_memory_configuration", "host_storage_capacity", "host_storage_type", "host_networking",
    "host_network_card_count", "host_networking_topology", "accelerators_per_node", "accelerator_model_name",
    "accelerator_memory_capacity", "accelerator_host_interconnect", "accelerator_memory_configuration",
    "accelerator_interconnect", "cooling", "framework", "operating_system", "other_software_stack",
)
SYSTEM_INTEGER_FIELDS = ("number_of_nodes", "host_processors_per_node", "host_processor_core_count",
                         "accelerators_per_node", "host_network_card_count")
SYSTEM_STATUS = ("available", "preview", "rdi")
SYSTEM_TYPES = ("edge", "datacenter", "datacenter,edge")


@dataclass(frozen=True)
class ComplianceRule:
    """How a compliance test compares its audit run with the submission run."""
    name: str
    audit_config: dict[str, str] = field(default_factory=dict)  # `*.*.key = value` lines
    threshold: float = 0.10
    relaxed_threshold: float = 0.20
    # Below these reference scores (SingleStream / MultiStream), run-to-run noise relaxes the threshold.
    relaxed_below: dict[str, float] = field(default_factory=dict)


COMPLIANCE = {
    # Accuracy in performance mode: sample responses into the accuracy log while timing.
    "TEST01": ComplianceRule("TEST01", {"mode": "2", "accuracy_log_rng_seed": "720381539243781796",
                                        "accuracy_log_sampling_target": "64"},
                             relaxed_below={"SingleStream": 200_000, "MultiStream": 1_600_000}),
    # No caching: issue the same sample every time; must not be more than 10% faster.
    "TEST04": ComplianceRule("TEST04", {"mode": "2", "performance_issue_unique": "0",
                                        "performance_issue_same": "1", "performance_issue_same_index": "3"},
                             relaxed_below={"SingleStream": 200_000, "MultiStream": 1_600_000}),
}


def benchmark_for(folder: str, model_mapping: dict[str, str] | None = None) -> Benchmark | None:
    """The benchmark a results folder name stands for: official name, built-in alias, or mapping."""
    name = model_mapping.get(folder, folder) if model_mapping else folder
    name = ALIASES.get(name, name)
    return BENCHMARKS.get(name)


def required_scenarios(benchmark: Benchmark, system_type: str) -> tuple[str, ...]:
    if system_type == "edge":
        return benchmark.edge_scenarios
    if system_type == "datacenter":
        return benchmark.datacenter_scenarios
    return tuple(dict.fromkeys(benchmark.edge_scenarios + benchmark.datacenter_scenarios))
