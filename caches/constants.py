"""Every Redis key prefix and default TTL stoker uses, in one place, with the reason for each.

Key layout (all keys of one tenant share the hash tag ``{t:<tenant>}``, so they live in one
Redis Cluster slot: the write script can check entry, generations and indexes atomically, and
nothing keyed for one tenant can ever be read through another tenant's key):

    stk:{t:<tenant>}:e:<model>@<version>:<template>:<digest>   exact entry (CacheEntry bytes)
    stk:{t:<tenant>}:n:<model>@<version>:<template>:<digest>   negative entry (short TTL)
    stk:{t:<tenant>}:u:<model>@<version>:<template>:<digest>   why the last answer was not stored
    stk:{t:<tenant>}:v:<embedder>:<sha256(text)>               embedding (float32 bytes)
    stk:{t:<tenant>}:g:m:<model>@<version>                     model-version generation / "retired"
    stk:{t:<tenant>}:g:t:<model>:<template>                    template generation / "retired"
    stk:{t:<tenant>}:g:c:<context_hash>                        context generation (INCR on invalidate)
    stk:{t:<tenant>}:g:d:<doc_id>                              doc version floor (older versions are stale)
    stk:{t:<tenant>}:g:dg:<doc_id>                             doc generation (INCR on every change of the doc)
    stk:{t:<tenant>}:i:d:<doc_id>                              set of entry keys whose context holds the doc
    stk:{t:<tenant>}:i:c:<context_hash>                        set of entry keys with that context
    stk:{t:<tenant>}:b:<route>:<bucket>                        error-budget verdicts of one time bucket (hash)
    stk:{t:<tenant>}:a:<event_id>                              a request the monitor's verdict was counted for
    stk:{t:<tenant>}:ch                                        when the tenant's cached answers last went stale
    stk:tenants                                                set of tenants that ever wrote (for retirement)
    stk:retired:<model>@<version>                              global marker of a retired version
    stk:live:{deploy}:<model>                                  hash "*" | tenant -> live version (JSON), set at READY
    stk:{t:<tenant>}:pc:<model>                                zset prefix digest -> requests that reached the GPU
    stk:{t:<tenant>}:pm:<model>                                hash prefix digest -> the prefix (messages JSON)
    stk:pi:{prefixes}:<model>                                  set of tenants with hot prefixes of the model
    stk:{t:<tenant>}:p:<part>:...                              the traffic profile (warmers/traffic/profile.py)
    stk:p:tenants                                              set of tenants with a traffic profile

Kinds never overlap: a kind is one or two fixed segments, and no kind's segments begin another
kind's (the profile's parts are the only keys under "p"), so two keys of different kinds differ
in a fixed segment, whatever the encoded components after it hold (tests/caches/test_key_kinds.py).

Every component is percent-encoded (only [A-Za-z0-9._~-] stay), so ``:``, ``@``, ``{``, ``}`` and
the glob characters ``*?[]`` never appear inside a component: SCAN MATCH patterns built from a
version are exact, and no tenant id can forge another tenant's hash tag.
"""

from __future__ import annotations

from typing import Final

KEY_ROOT: Final = "stk"
TENANT_REGISTRY: Final = f"{KEY_ROOT}:tenants"

KIND_EXACT: Final = "e"
KIND_NEGATIVE: Final = "n"
# An answer refused for itself (cut at max_tokens, empty, too long): why, so that the next
# miss of the same request says so rather than "no entry" (caches/client.py, not_stored).
KIND_UNSTORED: Final = "u"
KIND_EMBEDDING: Final = "v"
KIND_GEN_MODEL: Final = "g:m"
KIND_GEN_TEMPLATE: Final = "g:t"
KIND_GEN_CONTEXT: Final = "g:c"
KIND_DOC_FLOOR: Final = "g:d"
# Writes of answers built on a doc named by id alone (no version to compare with the floor)
# check this instead: every KB change of the doc moves it, so a write begun before is refused.
KIND_DOC_GEN: Final = "g:dg"
KIND_INDEX_DOC: Final = "i:d"
KIND_INDEX_CONTEXT: Final = "i:c"
# The error budget's verdicts (caches/matching/counts.py): per tenant, route and time bucket, a
# hash of checked / wrong counts per strength, shared by every gateway replica and the monitor.
KIND_BUDGET: Final = "b"
# The monitor's "already counted" mark per audited request (a re-delivered log record is
# re-asked, but its verdict counts once); it lives as long as the verdict can count.
KIND_AUDITED: Final = "a"
# When an invalidation last touched the tenant (unix seconds, the change event's time): the
# monitor re-asks a share of the exact hits served soon after it (audits/monitor.py).
KIND_CHANGED: Final = "ch"
# A document's text after its latest KB change, and the texts it replaced (warmers/hotset/renew.py):
# what the re-warmer substitutes into the logged requests that inlined an older text.
KIND_DOC_TEXT: Final = "dt"
# The forecast's calibration (warmers/hotset/calibration.py): a note per landed warm until its window
# ends, and per day the chances the plans gave the landed warms and how many were asked.
KIND_CAL_NOTE: Final = "cl"
KIND_CAL_DAY: Final = "cd"

# The live version of each model, written by the deploy cutover when the new version is READY
# and read by every gateway replica: outside every tenant's tag (one hash per model, shared by
# its tenants), beside the other deploy keys in the "{deploy}" slot.
LIVE_PREFIX: Final = f"{KEY_ROOT}:live:{{deploy}}:"

# Hot prompt prefixes (warmers/prefix/hot.py): per tenant and model, the system prompts (with
# their template) of the requests that reached the backend, for KV prefix warming. Kept two
# weeks after their last write: a template retired that long ago is not worth a warm.
KIND_PREFIX_COUNTS: Final = "pc"
KIND_PREFIX_META: Final = "pm"
# Where prefix counts lived until they shared the kind "p" with the profile, and a model named
# "ns" or "wm" was the profile's namespace set or watermarks (WRONGTYPE for one of the two
# workers). HotPrefixes moves a sorted set found there to the key above on first touch.
KIND_PREFIX_COUNTS_BEFORE: Final = "p"
# Which tenants have prefixes of a model: the warmer's way to every tenant without a SCAN on
# every primary; one small set per model in its own slot.
PREFIX_INDEX_PREFIX: Final = f"{KEY_ROOT}:pi:{{prefixes}}:"
PREFIX_TTL_S: Final = 14 * 86_400

# The traffic profile (warmers/traffic/profile.py): every key of kind "p" is the profile's, each of its
# parts one fixed segment: per week "n" (hourly counts), "h" (hourly totals), "s" (summary),
# "k" (costs), "r" (representatives); per namespace "w" (weeks); per tenant "ns" (namespaces
# seen) and "wm" (watermarks).
KIND_PROFILE: Final = "p"
PROFILE_TENANTS: Final = f"{KEY_ROOT}:{KIND_PROFILE}:tenants"

# A generation key holding this value marks a retired namespace: no write for it lands again.
RETIRED: Final = b"retired"

# Exact answers: a day. Long enough to carry a daily traffic cycle, short enough that the TTL
# (the real guarantee; invalidation is best effort) bounds staleness to one day by default.
DEFAULT_EXACT_TTL_S: Final = 86_400
# Negative entries (errors, empty answers) only damp retry storms: 30 s.
DEFAULT_NEGATIVE_TTL_S: Final = 30
# Why an answer was not stored: an hour. Only a reason in a header rides on it (the request is
# asked upstream either way), so it need not last as long as an entry, only across a user's
# retries and rewordings of one question.
DEFAULT_NOT_STORED_TTL_S: Final = 3_600
# Embeddings never go stale for a fixed embedder id; 30 days bounds memory for one-off prompts.
DEFAULT_EMBEDDING_TTL_S: Final = 30 * 86_400

# Context generations and doc floors outlive every entry they guard (a week > the 1-day entry
# TTL): once they expire, every entry written under the old generation has expired too, and a
# write begun before the bump cannot still be in flight. Retirement markers never expire.
GENERATION_TTL_S: Final = 7 * 86_400

# The error budget's evidence window: a week, in 8 buckets (a bucket's key expires one window
# after its last write). A verdict counts for 7 to 8 days, then ages out: the matcher and the
# backend change (deploys, new traffic), and old evidence must not vouch for them forever.
# A week of a route's sampled traffic is what it takes to prove a 1% rate at all (300 clean
# verdicts); much shorter would keep quiet routes at the strictest level for good.
DEFAULT_BUDGET_WINDOW_S: Final = 7 * 86_400
BUDGET_BUCKETS: Final = 8

# Digest length: 128 bits of sha256 (32 hex chars); collisions are out of reach, keys stay short.
DIGEST_HEX: Final = 32

# Float parameters are rounded to this many decimals before keying: 0.1 and 0.1000000001 are
# the same request, 0.1 and 0.11 are not.
PARAM_FLOAT_DECIMALS: Final = 4
