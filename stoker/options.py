"""One source for each default: a flat setting points at the field of the options model that
owns it, and takes that field's default, bounds and type from there, never writing them again.

Each package below the shell owns a frozen pydantic model of its options (CachePolicy, ...),
whose fields hold the default, the bounds and the why. StokerSettings keeps its flat fields (the
environment variables STOKER_<FIELD> stay), each made by `option(Owner, "field")`, and
`StokerSettings.options(Owner)` builds the owner's model from the settings that point at it.
Two copies of a default drifted before (the hot set planned for the static matcher while the
gateways served the verified one); tests/stoker/test_options.py fails if one can again.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from audits.options import MonitorOptions
from audits.whatif.options import WhatIfOptions
from caches.embedders import EmbedderOptions
from caches.l1 import L1Options
from caches.matching.options import MatchingOptions
from caches.policy import CachePolicy
from gateway.options import GatewayOptions
from invalidators.deployjob import CutoverOptions
from invalidators.purge import PurgeOptions
from stoker.llama_options import LlamaOptions
from streams.worker import WorkerConfig
from warmers.hotset.options import HotSetConfig
from warmers.hotset.warm_budget import BudgetOptions
from warmers.prefix.options import PrefixOptions
from warmers.prefix.warm import PrefixWarmOptions
from warmers.prewarm import PrewarmOptions
from warmers.rewarm import RewarmOptions
from warmers.scheduler import SchedulerConfig
from warmers.shadow import WarmConfig
from warmers.traffic.options import TrafficOptions

# Where a setting made by option() records its owner's field: a string ("Owner.field"), so
# that the settings' JSON schema stays serialisable; origins() resolves it through OWNERS.
OPTION_KEY: Final = "stoker_option"

# The option models settings point at, listed once.
OWNERS: Final[tuple[type[BaseModel], ...]] = (
    CachePolicy,
    HotSetConfig,
    GatewayOptions,
    MonitorOptions,
    RewarmOptions,
    PrefixWarmOptions,
    SchedulerConfig,
    PurgeOptions,
    CutoverOptions,
    WorkerConfig,
    L1Options,
    MatchingOptions,
    EmbedderOptions,
    TrafficOptions,
    PrefixOptions,
    WarmConfig,
    BudgetOptions,
    PrewarmOptions,
    LlamaOptions,
    WhatIfOptions,
)

# The hot set's forecast and pool shape: tuned on the benchmarks, not per deployment.
_HOTSET_TUNING: Final = frozenset(
    {
        "bandwidth_h", "background", "background_grid", "candidates_per_item", "min_candidates",
        "fairness_floor", "min_value_ms", "recent_hours", "recent_min_count", "recent_surge",
        "cost_prior_misses", "history_half_life_days", "prior_asks", "prior_grid", "recent_paraphrase_radius",
    }
)  # fmt: skip

# The gateway's upstream and key map are derived by the shell (its URL falls back to the warm
# backend's, the keys are hashed); its connection pool and version cache are not tuned per site.
_GATEWAY_DERIVED: Final = frozenset(
    {"upstream_url", "upstream_api_key", "api_key_tenants", "upstream_connections",
     "live_version_ttl_s"}
)  # fmt: skip

# The shadow warmer's pace: its ramp and jitter are tuned on the benchmarks, not per site; the
# TTL bar and the idle price are the planner's settings (HotSetConfig), passed by the shell
# with the backend whose /metrics it reads; the seed is a test's.
_WARM_DERIVED: Final = frozenset(
    {"capacity_qps", "ramp_start_frac", "ramp_end_frac", "ramp_s", "concurrency", "jitter_frac",
     "min_ttl_left_s", "aimd", "seed", "idle_price", "engine_url", "engine_guard"}
)  # fmt: skip

# Fields of an owner that no setting exposes (a test's knob, or one the shell derives and
# passes explicitly): every other field of an owner is a setting.
OWNER_ONLY: Final[dict[type[BaseModel], frozenset[str]]] = {
    CachePolicy: frozenset(),
    HotSetConfig: _HOTSET_TUNING,
    GatewayOptions: _GATEWAY_DERIVED,
    # how long a probe point lives, and the re-ask rate's back-off: not tuned per site
    MonitorOptions: frozenset({"probe_ttl_s", "aimd"}),
    RewarmOptions: frozenset({"poll_s"}),  # how often it looks for the invalidation's floor
    # where and as whom it sends (derived by the shell: the warm backend's URL and model); the
    # host cache's tokens (the shell's default is its own model server's)
    PrefixWarmOptions: frozenset({"backend_url", "model", "api_key", "host_cache_tokens"}),
    # how often it looks for a near peak, and the lock's renewal (a third of its TTL)
    SchedulerConfig: frozenset({"prefix_check_s", "renew_s"}),
    PurgeOptions: frozenset({"delay_s", "dry_run"}),  # `stoker purge`'s flags
    # the purge is its own owner's; the retries and the progress pace are not tuned per site
    CutoverOptions: frozenset({"purge", "max_attempts", "retry_s", "status_every_s"}),
    # derived by the shell: the broker, the group, the prefix, and the batch size (the setting
    # worker_batch_size, else the handler's own)
    WorkerConfig: frozenset({"bootstrap", "group_id", "embedded", "topic_prefix", "batch_size"}),
    L1Options: frozenset(),
    MatchingOptions: frozenset(),
    EmbedderOptions: frozenset(),
    TrafficOptions: frozenset(),
    PrefixOptions: frozenset(),
    WarmConfig: _WARM_DERIVED,
    BudgetOptions: frozenset(),
    PrewarmOptions: frozenset(),
    LlamaOptions: frozenset(),
    WhatIfOptions: frozenset(),
}

# Settings that belong to the shell alone: where the services are, what to build, how this
# process logs and where it keeps files. No package below the shell has an option for them.
SHELL_ONLY: Final = frozenset(
    {
        "semantic_enabled", "semantic_backend", "kafka_bootstrap", "kafka_broker", "redis_url",
        "qdrant_url", "qdrant_api_key", "qdrant_collection", "qdrant_path", "topic_prefix",
        "embedder", "embedder_url", "embedder_api_key", "embedder_dim", "model_cache_dir",
        "warm_backend_url", "monitor_backend_url", "prefix_warm_backend_url",
        "prefix_warm_on_deploy", "gateway_host", "gateway_port", "gateway_upstream_url",
        "gateway_upstream_api_key", "gateway_api_keys", "metrics_port", "log_format",
        "log_level", "state_dir", "llama_server_bin", "llama_model_path",
        # the served model name the shell's backend clients send (the warm runner's, the
        # monitor's, and the prefix warm's, derived into PrefixWarmOptions.model): the shell
        # builds each client; None sends each request's own model id
        "warm_backend_model",
        # an override of each handler's own batch size (Handler.batch_size holds each default,
        # the traffic worker's differing from the others'), derived into WorkerConfig.batch_size
        "worker_batch_size",
        "data_dir",
        # llama.cpp's host-memory prompt cache in tokens, derived into
        # PrefixWarmOptions.host_cache_tokens: its default is the embedded server's (modelserver.py)
        "prefix_warm_host_cache_tokens",
    }
)  # fmt: skip


def option(owner: type[BaseModel], name: str) -> Any:
    """A flat setting that IS `owner.name`: its default (or default factory), bounds and
    description are a copy of the owner's field, made at import and never written here."""
    info = FieldInfo.merge_field_infos(owner.model_fields[name])  # a copy, not the owner's
    info.json_schema_extra = {OPTION_KEY: f"{owner.__qualname__}.{name}"}
    return info


def origins(settings_cls: type[BaseModel]) -> dict[str, tuple[type[BaseModel], str]]:
    """Flat setting -> (owner, field), for every setting made by option()."""
    by_name = {o.__qualname__: o for o in OWNERS}
    out = {}
    for flat, f in settings_cls.model_fields.items():
        extra = f.json_schema_extra
        if isinstance(extra, dict) and OPTION_KEY in extra:
            cls, _, field = str(extra[OPTION_KEY]).rpartition(".")
            out[flat] = (by_name[cls], field)
    return out
