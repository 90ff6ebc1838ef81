"""Settings for every stoker process: env vars STOKER_*, frozen, unknown keys fail at start.

Leave kafka_bootstrap / redis_url / qdrant_url unset to run on the embedded stack (Tansu,
a redis-server subprocess, Qdrant Edge in-process); set them to point at production services.

A setting that cannot work fails at start with one line naming it (UsageError: the CLI exits
2): a value out of range ("STOKER_SEMANTIC_THRESHOLD=2: ...") and an environment variable
STOKER_* that is no setting, with the closest one ("STOKER_SEMANTIC_THRESHOLDS: did you mean
STOKER_SEMANTIC_THRESHOLD?"). pydantic-settings itself ignores unknown variables: a typo then
silently ran on the default.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from audits.options import MonitorOptions
from audits.whatif.options import WhatIfOptions
from caches.embedders import EmbedderOptions
from caches.l1 import L1Options
from caches.matching.options import MatchingOptions
from caches.policy import CachePolicy, Thresholds
from gateway.options import GatewayOptions
from invalidators.deployjob import CutoverOptions
from invalidators.purge import PurgeOptions
from schemas.baseurl import BaseURL
from schemas.common import Tenant
from schemas.errors import ConfigError, UsageError
from stoker.llama_options import LlamaOptions
from stoker.modelserver import DEFAULT_SERVE
from stoker.options import option, origins
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

PREFIX: Final = "STOKER_"
# STOKER_* variables stoker reads that are not settings (none: every one is a field below).
NOT_SETTINGS: Final[frozenset[str]] = frozenset()
# Fields whose input is never echoed in an error (a key may be the value that failed).
_SECRET_FIELDS: Final = frozenset(
    {"qdrant_api_key", "embedder_api_key", "gateway_upstream_api_key", "gateway_api_keys"}
)
Opts = TypeVar("Opts", bound=BaseModel)


class StokerSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=PREFIX, frozen=True, extra="forbid", env_nested_delimiter="__"
    )

    def __init__(self, **values: Any) -> None:
        """STOKER_* from the environment, `values` winning; UsageError names what is wrong."""
        check_environment(os.environ)
        try:
            super().__init__(**values)
        except ValidationError as e:
            raise UsageError(describe(e)) from None

    # -- services (None = embedded) --
    # The semantic layer (embedding + vector search on exact misses). Off: exact caching only,
    # no embedder loaded; a miss then costs no embedding (~10 ms of CPU per new prompt here).
    semantic_enabled: bool = True
    kafka_bootstrap: str | None = None
    redis_url: str | None = None
    semantic_backend: Literal["edge", "server"] = "edge"
    qdrant_url: str | None = None
    qdrant_api_key: SecretStr | None = None
    qdrant_collection: str = "stoker_semantic"
    qdrant_path: Path | None = Field(
        default=None, description="Qdrant Edge shard folder; a temp folder when unset"
    )
    topic_prefix: str = ""

    # -- embeddings --
    embedder: Literal["sentence-transformers", "openai"] = "sentence-transformers"
    embedder_model: str = option(EmbedderOptions, "model")
    embedder_url: str | None = None
    embedder_api_key: SecretStr | None = None
    # The embedder's vector size. Unset: asked of the model (an OpenAI-compatible server is
    # asked at start); set: checked against it, and lets a worker open the semantic store of
    # an unknown model without loading the model.
    embedder_dim: int | None = Field(default=None, ge=1, le=65_536)
    # The local model's intra-op threads (torch's are process-wide). One: on this loaded 2-core
    # box a second thread made one prompt many times slower (bench_cache_semantic; figures in
    # docs/benchmarks.md, "The semantic lookup under load").
    embedder_threads: int = option(EmbedderOptions, "threads")
    # What runs the local model: "onnx" (ONNX Runtime fp32 on an export made once per machine
    # under model_cache_dir; in the gateway's busy process several times faster a prompt than
    # torch, which hands the GIL to the event loop on every operator: bench_gateway_semantic,
    # docs/benchmarks.md) or "torch". ONNX serves only if its vectors equal torch's at start
    # (within 1e-5; measured 2e-7); otherwise one warning says why and torch serves.
    embedder_engine: Literal["onnx", "torch"] = option(EmbedderOptions, "engine")
    # The micro-batcher in front of the embedder: texts per forward pass at most (lookups go
    # before background embeds, and one past its deadline is dropped, not computed).
    embedder_batch_max_texts: int = option(EmbedderOptions, "batch_max_texts")
    # How long a lookup's embed waits for others to join its forward pass. 0: it takes those
    # that queued while the last pass ran, which under load is most of them.
    embedder_batch_wait_ms: float = option(EmbedderOptions, "batch_wait_ms")

    # -- cache policy --
    # The cosine a semantic hit must clear (the defaults and bounds of this section are
    # caches/policy.py's CachePolicy, which these settings point at).
    semantic_threshold: float = option(CachePolicy, "threshold")
    # tenant -> its own threshold, each in [0, 1]
    tenant_thresholds: Thresholds = option(CachePolicy, "tenant_thresholds")
    # "tenant/route" or "*/route" -> threshold; the most specific wins (CacheRequest.route)
    route_thresholds: Thresholds = option(CachePolicy, "route_thresholds")
    # sensitive routes ("tenant/route" or "*/route"): semantic hits must clear the stricter bar
    conservative_routes: frozenset[str] = option(CachePolicy, "conservative_routes")
    conservative_threshold: float = option(CachePolicy, "conservative_threshold")
    # Which rule accepts a semantic hit: "static" (the cosine threshold above) or "verified"
    # (caches/matching/verified.py: served only where the backend's answers near the query
    # agree, at the loosest level the error budget allows). Verified is the default: on
    # CLINC150 test with simulated answers (its constants chosen on val) it serves 1.01x static
    # 0.92's hits at a sixth of the wrong share after 3,100 earlier queries, more after a busy
    # route's days (docs/benchmarks.md, "Semantic quality"); on the embedded real model it
    # serves its prompt-only rule, the answers being found blind. Static stays one setting
    # away; the simulated demo uses it.
    semantic_matcher: Literal["static", "verified"] = option(HotSetConfig, "matcher")
    # Verified only: before neighbours and verdicts can vouch (a young cache), serve the clearly
    # safe look-alikes on the prompts alone (cosine >= 0.88, no lexical guard firing, no near
    # entry answered otherwise), on trial until the route holds the verdicts a level needs
    # (caches/matching/cold.py). Off: a young cache serves what its strictest level finds.
    semantic_cold_start: bool = option(MatchingOptions, "cold_start")
    # Verified only: check on the backend's own traffic that its answers tell meanings apart
    # (answers to near look-alikes agree, to unrelated prompts do not), and serve the prompt-only
    # rule (cosine >= 0.88, no lexical guard firing) until they are shown to, and while they are
    # shown not to (caches/matching/calibration.py; SmolLM2-135M's never are). Off: the answers
    # are trusted whatever the backend, as the simulator's could be.
    semantic_answer_checks: bool = option(MatchingOptions, "answer_checks")
    # The error budget (verified only): the largest wrong-hit rate served, per tenant and route;
    # the serving level is the loosest whose 95% upper bound is at or under it.
    max_wrong_hit_rate: float = option(MatchingOptions, "max_wrong_hit_rate")
    # Two answers mean the same when their embeddings' cosine clears this bar (and no number
    # differs): a property of the embedder and the backend's wording; 0.49 is calibrated for
    # all-MiniLM-L6-v2 on CLINC150 val (caches/matching/answers.py). Pick another from the
    # curve `stoker eval-semantic --data` prints on your own traffic.
    answer_bar: float = option(MatchingOptions, "answer_bar")
    # How long a verdict counts for the budget (it ages out after 1 to 1.125 windows), and how
    # often a process re-reads the shared counts (a loosening or tightening reaches every
    # replica within this).
    budget_window_s: float = option(MatchingOptions, "budget_window_s")
    budget_refresh_s: float = option(MatchingOptions, "budget_refresh_s")
    # The wrong-hit monitor (`stoker worker monitor`, audits/monitor.py): the share of
    # served semantic hits it re-asks (each re-ask costs the backend a request), at most this
    # many a second (a hit over the cap is dropped, not
    # queued), from this backend (unset: the gateway's upstream, else the warm backend).
    monitor_share: float = option(MonitorOptions, "share")
    monitor_qps: float = option(MonitorOptions, "qps")
    # The stale-serve check of the same monitor: the share of exact hits served within the
    # window after an invalidation in their tenant that it re-asks (within the same QPS cap).
    monitor_stale_share: float = option(MonitorOptions, "stale_share")
    monitor_stale_window_s: float = option(MonitorOptions, "stale_window_s")
    # Off-peak: a sampled hit is dropped (not re-asked) while the backend's load, as its answers
    # show it (latency per token over its baseline; full after a 429 or 5xx), is at or over
    # this. 1.0 drops only while the backend is refusing or failing.
    monitor_busy_load: float | None = option(MonitorOptions, "busy_load")
    monitor_backend_url: str | None = None
    # The share of near misses (a candidate short of the serving level) whose live answer is
    # judged against the candidate's, as budget evidence. Free: the verified matcher embeds
    # every stored answer anyway, so a check is one dot product and one counter write. All of
    # them by default. The budget weighs each verdict by the inverse of its share (this one,
    # or the monitor's for an audit), so near misses checked more often than hits are audited
    # do not stand for more traffic than they are; keep both shares as the processes run them.
    budget_shadow_share: float = option(MatchingOptions, "budget_shadow_share")
    exact_ttl_s: int = option(CachePolicy, "exact_ttl_s")
    semantic_ttl_s: int = option(CachePolicy, "semantic_ttl_s")
    negative_ttl_s: int = option(CachePolicy, "negative_ttl_s")
    # How long a request's (and its look-alikes') misses say why its last answer was not
    # stored ("not_stored: finish_reason=length") instead of "no entry".
    not_stored_ttl_s: int = option(CachePolicy, "not_stored_ttl_s")
    embedding_ttl_s: int = option(CachePolicy, "embedding_ttl_s")
    max_prompt_chars: int = option(CachePolicy, "max_prompt_chars")
    max_response_bytes: int = option(CachePolicy, "max_response_bytes")

    # -- in-process L1 for exact hits (caches/l1.py), Redis-tracked; off by default --
    # Serves repeat hits without a Redis round trip in each serving process; Redis client-side
    # tracking drops an entry as soon as it changes anywhere, the TTL is only a safety net.
    l1_enabled: bool = option(L1Options, "enabled")
    l1_max_entries: int = option(L1Options, "max_entries")
    l1_ttl_s: float = option(L1Options, "ttl_s")

    # -- streams --
    # The broker behind kafka_bootstrap: "tansu" applies the embedded broker's consumer settings
    # (2 s session, 500 ms heartbeat, 10 ms fetch wait), which real Kafka must not get.
    kafka_broker: Literal["kafka", "tansu"] = "kafka"
    # Messages per consume() call; one Redis round trip and one offset commit per batch. Unset:
    # each handler's own default (Handler.batch_size): 50k for the traffic worker, whose Redis
    # writes shrink per event as a batch aggregates more, 20k for the others, whose batches
    # must apply well inside a SIGTERM grace period. At low rates worker_poll_s, not the
    # size, bounds the wait.
    worker_batch_size: int | None = Field(default=None, ge=1, le=100_000)
    # How long consume() waits for a batch to fill; also how fast stop() is noticed.
    worker_poll_s: float = option(WorkerConfig, "poll_s")
    # On the embedded broker (Tansu answers each fetch after its full wait, never sooner), an
    # idle worker pauses its partitions between fetches: half the time its topics have been
    # quiet, up to this. The first record after a quiet spell waits up to this long; 0 never
    # pauses (an idle stack then keeps Tansu at ~24% of a core). Real Kafka: no effect.
    worker_idle_fetch_max_s: float = option(WorkerConfig, "idle_fetch_max_s")
    # Outage back-off: doubles from base to max, re-reading the same offsets every time.
    worker_backoff_base_s: float = option(WorkerConfig, "backoff_base_s")
    worker_backoff_max_s: float = option(WorkerConfig, "backoff_max_s")
    # Create the worker's topics at start; turn off where ACLs forbid CreateTopics.
    worker_create_topics: bool = option(WorkerConfig, "create_topics")
    # The largest dead letter copied whole into stoker.dlq; a bigger one is truncated (64 KiB
    # of its value, with its size and sha256 in headers). The default fits Kafka's default
    # max.message.bytes (1,048,588); set it under your DLQ topic's limit if that is lower.
    dlq_max_record_bytes: int = option(WorkerConfig, "dlq_max_record_bytes")
    # Weeks of traffic the profile keeps (its keys expire after that).
    traffic_retention_weeks: int = option(TrafficOptions, "retention_weeks")
    # The event times the traffic worker learns from, around its clock (warmers/traffic/event_time.py):
    # up to this far ahead (a producer's clock skew; 5 min: NTP keeps hosts within ms) ...
    traffic_max_clock_skew_s: float = option(TrafficOptions, "max_clock_skew_s")
    # ... and this far back (a year and a day: a replayed log of last year is still learned
    # from; None: any age, for a replay on a simulated clock). Others are dead-lettered.
    traffic_max_event_age_s: float | None = option(TrafficOptions, "max_event_age_s")
    # Queries the profile tracks a week (per tenant, model and template), hour by hour: the heavy
    # hitters, in bounded memory whatever the tail of one-offs (warmers/traffic/profile.py). Measured by
    # benchmarks/bench_profile_memory.py (bytes) and bench_hot_set_bounded.py (coverage kept).
    traffic_week_capacity: int = option(TrafficOptions, "week_capacity")
    # ... and of those, the queries each hour of week keeps hourly counts for.
    traffic_hour_capacity: int = option(TrafficOptions, "hour_capacity")

    # -- deploy cutover (invalidators/cutover.py) --
    # How long the previous version's namespace is kept after the new one is READY, so a rollback
    # finds a warm cache; ModelDeployed.grace_s overrides it per deploy (0 = purge at once).
    deploy_grace_s: int = option(CutoverOptions, "grace_s")
    # The old version's purge pace, keys/s (None = as fast as Redis takes it; the field report's
    # hand flush ran at 30k keys/s) and keys per UNLINK batch.
    deploy_purge_rate: float | None = option(PurgeOptions, "rate")
    deploy_purge_batch: int = option(PurgeOptions, "batch")
    # The pre-warm (warmers/prewarm.py) plans the hour under way and the next hours, this many
    # in all: the first hours after cutover, the ones that would start cold.
    deploy_prewarm_hours: int = option(PrewarmOptions, "hours")
    # READY's bar: the projected hit rate of those hours (expected hits of the warmed entries
    # over the expected warmable requests). The pre-warm keeps the budget's plan only until its
    # projection reaches the bar, and READY means the entries in place reach it; below it the
    # pre-warm is retried, then the deploy fails (`--wait` exits 1).
    deploy_prewarm_hit_bar: float = option(PrewarmOptions, "hit_bar")
    # When the whole budget's plan cannot reach the bar: READY needs this share of what it can
    # reach in place (the whole plan is warmed, the bar reported unreachable).
    deploy_prewarm_min_share: float = option(PrewarmOptions, "min_share")

    # -- stoker analyze --
    # Distinct prompts `stoker analyze` embeds at most (embedding is >95% of its time, ~60-150
    # prompts/s on 2 cores); a log with more is estimated on a sample, with 95% intervals.
    analyze_embed_budget: int = option(WhatIfOptions, "embed_budget")

    # -- warmers --
    # The OpenAI-compatible endpoint warm requests go to (vLLM, TGI, llama.cpp), as the openai
    # SDK's base_url: http://host:8000/v1, http://host/llm/v1 (no path means /v1). Unset: the
    # gateway's upstream (STOKER_GATEWAY_UPSTREAM_URL); with neither set, on the embedded stack,
    # the embedded model server (llama-server), and elsewhere a worker that warms fails at start.
    warm_backend_url: str | None = None
    # The served model name to send; None sends each request's model_id.
    warm_backend_model: str | None = None
    # Target warm rate; the shadow warmer ramps up to it and backs off below it on congestion.
    warm_qps: float = option(WarmConfig, "target_qps")
    # Budget of one warm run: requests, or expected GPU-seconds when that is set.
    warm_budget_requests: int = option(BudgetOptions, "requests")
    warm_budget_gpu_seconds: float | None = option(BudgetOptions, "gpu_seconds")
    # An entry with less time to live than this is warmed again (an hour: it outlives the window).
    warm_min_ttl_left_s: float = option(HotSetConfig, "min_ttl_left_s")
    # Paraphrase clustering radius as a cosine; None = the tenant's semantic threshold under
    # the static matcher, and no merging under the verified one (warmers/hotset/select.py: there a
    # warmed entry serves a paraphrase only where other warmed phrasings vouch for it).
    warm_cluster_threshold: float | None = option(HotSetConfig, "cluster_threshold")
    # What a warm is worth (warmers/hotset/value.py): "prevented", the one miss it saves before live
    # traffic would fill the entry, each GPU-ms priced by the forecast load; "hits", every
    # expected hit x its miss cost. The deploy pre-warm always plans by hits (its bar counts them).
    warm_value_model: Literal["prevented", "hits"] = option(HotSetConfig, "value_model")
    # A GPU-ms at idle as a share of one at the history's busiest hour (linear in between).
    warm_idle_price: float = option(HotSetConfig, "idle_price")
    # The scheduler sends what pays and is asked before it expires with at least this chance.
    warm_min_p_send: float = option(HotSetConfig, "min_p_send")
    # A budget named on the command line (`stoker warm --budget-requests`) is spent past
    # break-even on the best items, down to those asked with at least this chance.
    warm_min_p_asked: float = option(HotSetConfig, "min_p_asked")
    # The scheduler plans the hours an entry sent now serves (its TTL), at most this many, and
    # sends each entry in the cheapest of them before it is asked (warmers/hotset/value.py).
    warm_horizon_h: int = option(HotSetConfig, "horizon_h")
    # Read the backend's engine on <warm backend>/metrics (backends/engine.py: vLLM's requests
    # waiting and KV cache in use, llama.cpp's busy and deferred slots): each send is priced at
    # that load too, waits for room the live traffic leaves, and makes way when it comes back
    # (warmers/engineguard.py). Off, or a backend without those gauges: its answers' latency and
    # 429s alone pace and price the warm.
    warm_load_from_metrics: bool = option(WarmConfig, "load_from_metrics")
    # GPU-ms a millisecond of first-request latency saved is worth (0: GPU alone pays for a warm);
    # the latency is what the query's misses took, as the request log says (warmers/hotset/value.py).
    warm_latency_weight: float = option(HotSetConfig, "latency_weight")
    # The re-warm after a KB change (warmers/rewarm.py): warm sends per batch of changes at
    # most, the hours it plans (the hour under way and the next), and how long it waits for the
    # invalidation worker to apply a change before it reads the batch again.
    rewarm_budget_requests: int = option(RewarmOptions, "budget_requests")
    rewarm_hours: int = option(RewarmOptions, "hours")
    rewarm_wait_s: float = option(RewarmOptions, "wait_s")
    # What a re-warm is worth: "hits" (what is expected asked more than once pays its send, as
    # the deploy pre-warm plans), or "prevented" (as the scheduler; see warm_value_model).
    rewarm_value_model: Literal["prevented", "hits"] = option(RewarmOptions, "value_model")
    # Scheduler: warm the next hour this often; sweep expired semantic points this often.
    warm_interval_s: float = option(SchedulerConfig, "warm_interval_s")
    sweep_interval_s: float = option(SchedulerConfig, "sweep_interval_s")
    # Leader lock expiry: a crashed leader is replaced within this (renewed every third of it).
    scheduler_lock_ttl_s: float = option(SchedulerConfig, "lock_ttl_s")
    # The scheduler's warm and the deploy pre-warm send to a model in an hour only what fits
    # under this share of its busiest hour the traffic profile forecasts, less that hour's own
    # forecast load: a warm never makes the peak it exists to flatten (warmers/headroom.py).
    # A pre-warm held to it cuts over at the bar it reached, the scheduler warming the rest.
    # 0: no cap.
    warm_headroom_share: float = option(SchedulerConfig, "headroom_share")

    # -- KV prefix warming (warmers/prefix/hot.py, warmers/prefix/warm.py) --
    # The prefixes worker counts, per tenant and model, the system prompts of requests that
    # reached the backend; this many per tenant and model are tracked (space-saving) ...
    prefix_capacity: int = option(PrefixOptions, "capacity")
    # ... those shorter than this many tokens are not (one KV block of vLLM: nothing to share).
    prefix_min_tokens: int = option(PrefixOptions, "min_tokens")
    # Warm the prefix caches of new replicas before the deploy's hot-set pre-warm (`stoker
    # deploy`), and on `stoker warm-prefixes` after a restart. Off: the deploy does not.
    prefix_warm_on_deploy: bool = True
    # Where prefix warms go; unset: STOKER_WARM_BACKEND_URL. Never the gateway: they must not
    # touch the answer cache (they also say Cache-Control: no-cache, no-store).
    prefix_warm_backend_url: str | None = None
    # The hottest prefixes sent per run, and their summed tokens at most: more than the
    # backend's KV cache holds would evict the hottest (vLLM logs its "GPU KV cache size").
    # The token budget is what binds; the count only stops a run of many tiny prefixes.
    prefix_warm_top_n: int = option(PrefixWarmOptions, "top_n")
    prefix_warm_token_budget: int = option(PrefixWarmOptions, "token_budget")
    # ... unless the backend reports its KV cache on /metrics (vLLM's vllm:cache_config_info):
    # then this share of it. Warmed blocks are free blocks vLLM evicts least recently used when
    # a running request needs room, so they never hold one back; the rest is room for the live
    # traffic's own prefixes. 0: always the fixed token budget.
    prefix_warm_kv_share: float = option(PrefixWarmOptions, "kv_share")
    # llama.cpp reports its slots (-np x -c), a prompt each, not the prompts its --cache-ram
    # keeps in host memory (an idle slot's among them): their tokens (the warm sends a prompt
    # a slot and prompts within prefix_warm_kv_share of these). Default: the embedded
    # server's (256 MiB of SmolLM2-135M's 23,040-byte cells). Yours: --cache-ram (llama.cpp's
    # default is 8,192 MiB) x 1,048,576 / the KV bytes a token: 4 x n_layer x n_head_kv x
    # n_embd_head_k for an f16 cache, which llama-server prints at start with -lv 4. 0: the
    # slots' prompts only.
    prefix_warm_host_cache_tokens: int = Field(default=DEFAULT_SERVE.host_cache_tokens, ge=0)
    # Rate, in flight at once (on llama.cpp at most its slots), and the run's deadline (the
    # deploy's pre-warm waits for it).
    prefix_warm_qps: float = option(PrefixWarmOptions, "qps")
    prefix_warm_concurrency: int = option(PrefixWarmOptions, "concurrency")
    prefix_warm_deadline_s: float = option(PrefixWarmOptions, "deadline_s")
    # Each send's wait for its answer, the prompt's prefill: raise it on a slow (CPU) server.
    prefix_warm_timeout_s: float = option(PrefixWarmOptions, "timeout_s")
    # The scheduler sends the hot prefixes again this long before each day's busiest hour (of
    # the traffic profile, per model: warmers/prefix/before_peak.py), so what the quiet hours evicted is
    # held when the peak arrives. 0: off.
    prefix_warm_before_peak_s: float = option(PrefixOptions, "before_peak_s")
    # Prefixes not seen for this long are not warmed (a retired template).
    prefix_warm_max_age_s: float = option(PrefixWarmOptions, "max_age_s")
    # Replicas whose restarts the scheduler's leader watches, per model id (JSON:
    # {"llama-3-8b": ["http://vllm-0:8000", "http://vllm-1:8000"]}): every check it reads each
    # one's /metrics, and warms the model's prefixes on a replica that restarted or is new
    # (warmers/prefix/after_restart.py). Empty: not watched (`stoker warm-prefixes` from a hook instead).
    prefix_warm_replicas: dict[str, list[str]] = option(PrefixOptions, "replicas")
    prefix_warm_replica_check_s: float = option(SchedulerConfig, "replica_check_s")

    # -- gateway (`stoker gateway`, gateway/) --
    gateway_host: str = "127.0.0.1"  # 0.0.0.0 in a container
    gateway_port: int = Field(default=8080, ge=0, le=65_535)
    # The OpenAI-compatible server misses go to (vLLM, TGI, llama.cpp); unset: the warm backend
    # (STOKER_WARM_BACKEND_URL), the same GPUs; with neither set, on the embedded stack, the
    # embedded model server (llama-server).
    gateway_upstream_url: str | None = None
    gateway_upstream_api_key: SecretStr | None = None
    gateway_upstream_timeout_s: float = option(GatewayOptions, "upstream_timeout_s")
    # How often the gateway asks the upstream's GET /models: its state (/readyz's `upstream`,
    # stoker_upstream_up) and the models it lists. A request that cannot reach it asks at once.
    gateway_upstream_check_s: float = option(GatewayOptions, "upstream_check_s")
    # Answer 404 model_not_found for a model the upstream does not list. Off, such a request is
    # forwarded with an X-Stoker-Warning header and a log line, since clients send aliases the
    # upstream may map (llama-server answers any name; see STOKER_WARM_BACKEND_MODEL).
    gateway_strict_models: bool = option(GatewayOptions, "strict_models")
    # API key -> tenant. Set: the bearer key names the tenant, an unknown one is refused (401)
    # and X-Stoker-Tenant is ignored. Unset: the tenant comes from X-Stoker-Tenant.
    gateway_api_keys: dict[SecretStr, Tenant] = Field(default_factory=dict)
    gateway_default_tenant: Tenant | None = option(GatewayOptions, "default_tenant")
    # Let `stoker.tenant` in the request body name the tenant (a client can forge it).
    gateway_tenant_from_body: bool = option(GatewayOptions, "tenant_from_body")
    # The namespace's version before any deploy went READY for a model.
    gateway_default_model_version: str = option(GatewayOptions, "default_model_version")
    gateway_lookup_budget_ms: float = option(GatewayOptions, "lookup_budget_ms")
    # How long a miss's response holds its last byte for its answer to become searchable
    # (a paraphrase asked at once then finds it); 0: the response never waits.
    gateway_index_wait_ms: float = option(GatewayOptions, "index_wait_ms")
    gateway_lookup_threads: int = option(GatewayOptions, "lookup_threads")
    gateway_herd_wait_s: float = option(GatewayOptions, "herd_wait_s")
    # A request without a temperature samples at the upstream's default: 1 in OpenAI's API, so
    # it is not cached. Set 0 where your upstream decodes greedily by default.
    gateway_default_temperature: float = option(GatewayOptions, "default_temperature")
    gateway_max_body_bytes: int = option(GatewayOptions, "max_body_bytes")
    gateway_log_buffer: int = option(GatewayOptions, "log_buffer")
    gateway_log_answer_max_bytes: int = option(GatewayOptions, "log_answer_max_bytes")
    gateway_drain_s: float = option(GatewayOptions, "drain_s")
    # On SIGTERM, /readyz answers 503 this long before the listener closes, so a load balancer
    # stops sending first (0: close at once; Kubernetes manifests set 5).
    gateway_drain_notice_s: float = option(GatewayOptions, "drain_notice_s")

    def options(self, owner: type[Opts], **override: Any) -> Opts:
        """The owner's options model from the settings that point at it (stoker/options.py);
        `override` wins (a CLI flag, or a field the shell derives)."""
        mine = {f: getattr(self, flat) for flat, (o, f) in _ORIGINS.items() if o is owner}
        return owner(**(mine | override))

    def warm_url(self) -> str:
        """Where warms go: STOKER_WARM_BACKEND_URL, else the gateway's upstream."""
        return _model_server(self.warm_backend_url or self.gateway_upstream_url)

    def upstream_url(self) -> str:
        """Where the gateway's misses go: STOKER_GATEWAY_UPSTREAM_URL, else the warm backend."""
        return _model_server(self.gateway_upstream_url or self.warm_backend_url)

    @field_validator(
        "warm_backend_url", "gateway_upstream_url", "monitor_backend_url",
        "prefix_warm_backend_url", "embedder_url", "prefix_warm_replicas",
    )  # fmt: skip
    @classmethod
    def _base_urls(cls, v: Any) -> Any:
        """Each server's base URL in any form schemas/baseurl.py takes (one, or a model id's
        replicas); a malformed one fails at start, never on the first request."""
        if isinstance(v, dict) and any(not model for model in v):
            raise ValueError("a model id must not be empty")
        urls = [u for us in v.values() for u in us] if isinstance(v, dict) else [v]
        for url in urls:
            if url is not None:
                _base_url(url)
        return v

    # -- observability --
    # Port of the Prometheus /metrics endpoint `stoker worker` serves (0 = none). Off unless set,
    # so two workers on one host never fight over a port; docker-compose and deploy/k8s set 9464.
    metrics_port: int = Field(default=0, ge=0, le=65_535)
    # "json": one object per line with tenant, model_version and job ids when a log call has
    # them (for log shippers); "text" for people at a terminal.
    log_format: Literal["json", "text"] = "text"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # Where a process running the embedded stack writes its addresses (embedded.json: Kafka,
    # Redis, Qdrant path, pid) for scripts, removed at stop; None: ~/.cache/stoker.
    state_dir: Path | None = None

    # -- the embedded model server (llama.cpp's llama-server, stoker/modelserver.py) --
    # Where `make setup` caches the llama-server it builds and the model it fetches, and the
    # embedder keeps its ONNX export (onnx/), shared by every checkout on the machine; None:
    # $XDG_CACHE_HOME/stoker, else ~/.cache/stoker.
    model_cache_dir: Path | None = None
    # A llama-server binary of your own, used instead of building one.
    llama_server_bin: Path | None = None
    # A GGUF model of your own, served instead of SmolLM2-135M-Instruct.
    llama_model_path: Path | None = None
    # llama-server's CPU threads: more than one per generating server on a busy 2-core box
    # decoded many times slower (threads spin-wait on each other; docs/model-server.md).
    llama_threads: int = option(LlamaOptions, "threads")
    # Requests it decodes at once (slots); they share the context below.
    llama_parallel: int = option(LlamaOptions, "parallel")
    # Context size in tokens, split between the slots.
    llama_ctx: int = option(LlamaOptions, "ctx")

    # -- data sets --
    # Where the data sets are read (CLINC150 as clinc150/data_full.json: stoker/data.py, for
    # eval-semantic, sample-log and the smoke demo); None: data/ in the checkout.
    data_dir: Path | None = None


# flat setting -> (owner, field): which settings options() hands to which owner
_ORIGINS: Final = origins(StokerSettings)


def _model_server(url: str | None) -> str:
    if url is None:
        raise ConfigError(
            "no model server configured: set STOKER_GATEWAY_UPSTREAM_URL or "
            "STOKER_WARM_BACKEND_URL to its OpenAI base URL (e.g. http://gpu-0:8000/v1); with "
            "neither, and no STOKER_KAFKA_BOOTSTRAP, stoker starts its embedded model server"
        )
    return url


def _base_url(text: str) -> str:
    try:
        BaseURL.parse(text)
    except ConfigError as e:
        raise ValueError(str(e)) from None
    return text


def check_environment(environ: Mapping[str, str]) -> None:
    """UsageError naming every STOKER_* variable that is no setting, with the closest name."""
    fields = StokerSettings.model_fields
    known = {PREFIX + name.upper() for name in fields} | NOT_SETTINGS
    # env_nested_delimiter: STOKER_TENANT_THRESHOLDS__ACME=0.97 sets one key of a dict field
    nested = tuple(PREFIX + n.upper() + "__" for n, f in fields.items() if _is_dict(f.annotation))
    unknown = [
        name
        for name in sorted(environ)
        if name.upper().startswith(PREFIX)
        and name.upper() not in known
        and not name.upper().startswith(nested)
    ]
    if unknown:
        names = sorted(known)
        raise UsageError("; ".join(_unknown(name, names) for name in unknown))


def describe(e: ValidationError) -> str:
    """One line: each bad setting as its variable, pydantic's words and the value given."""
    parts = []
    for err in e.errors(include_url=False)[:5]:
        loc = [str(x) for x in err["loc"]]
        field = loc[0] if loc else ""
        name = PREFIX + field.upper() + "".join(f"__{x}" for x in loc[1:])
        shown = "" if field in _SECRET_FIELDS else f"={_short(err.get('input'))}"
        parts.append(f"{name}{shown}: {err['msg']}")
    more = len(e.errors()) - len(parts)
    return "bad setting " + "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _unknown(name: str, known: list[str]) -> str:
    # compared without the prefix every name shares, which would make any two look alike
    bare = {k.removeprefix(PREFIX): k for k in known}
    close = difflib.get_close_matches(name.upper().removeprefix(PREFIX), list(bare), 1, 0.6)
    hint = f"did you mean {bare[close[0]]}?" if close else "see stoker/settings.py for the settings"
    return f"unknown setting {name}: {hint}"


def _is_dict(annotation: Any) -> bool:
    return getattr(annotation, "__origin__", None) is dict or "dict[" in str(annotation)


def _short(value: Any) -> str:
    text = repr(value)  # quoted: an empty or blank value shows as '' or ' '
    return text if len(text) <= 60 else text[:57] + "..."
