"""`stoker purge` and `stoker invalidate` as CI runs them: a subprocess, exit codes, real services."""

from __future__ import annotations

import subprocess

import orjson
import redis
from confluent_kafka import Consumer

from caches import keys as K
from schemas.codec import decode_event
from schemas.events import KnowledgeBaseChanged
from streams.topics import consumer_config, topic_name
from tests.cli import run_stoker


def stoker(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_stoker(*args, env=env)


def put(r: redis.Redis, tenant: str, version: str, n: int) -> list[str]:
    ns = K.Namespace(tenant, "llama", version, "t1")
    keys = [K.CacheKey(ns, f"p{i}", "{}", "c").exact() for i in range(n)]
    r.mset(dict.fromkeys(keys, b"x"))
    return keys


def test_purge_cli__dry_run_counts_then_purge_deletes(redis_client, redis_url):
    doomed = put(redis_client, "acme", "v1", 120) + put(redis_client, "globex", "v1", 30)
    kept = put(redis_client, "acme", "v2", 50)
    args = ("purge", "--model", "llama", "--version", "v1", "--batch", "40", "--json")
    dry = stoker(*args, "--dry-run", STOKER_REDIS_URL=redis_url)
    assert dry.returncode == 0, dry.stderr
    assert orjson.loads(dry.stdout)["matched"] == len(doomed)
    assert redis_client.exists(*doomed) == len(doomed)

    run = stoker(*args, STOKER_REDIS_URL=redis_url)
    assert run.returncode == 0, run.stderr
    out = orjson.loads(run.stdout)
    assert (out["state"], out["deleted"]) == ("done", len(doomed))
    assert redis_client.exists(*doomed) == 0 and redis_client.exists(*kept) == len(kept)


def test_purge_cli__bad_usage_and_no_redis_configured_exit_2():
    assert stoker("purge", "--model", "llama").returncode == 2
    assert stoker("purge", "--model", "m", "--version", "v", "--rate", "0").returncode == 2
    res = stoker("purge", "--model", "llama", "--version", "v1")
    assert res.returncode == 2 and "STOKER_REDIS_URL" in res.stderr


def test_invalidate_cli__publishes_a_kb_change_with_or_without_its_texts(
    kafka_bootstrap, unique, tmp_path
):
    prefix = f"cli{unique}."
    env = {
        "STOKER_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "STOKER_TOPIC_PREFIX": prefix,
        "STOKER_KAFKA_BROKER": "tansu",
    }
    res = stoker("invalidate", "kb", "kb/refunds", "--tenant", "acme", "--doc-version", "3", **env)
    assert res.returncode == 0, res.stderr
    new, old = tmp_path / "new.txt", tmp_path / "old.txt"
    new.write_text("Refunds take 2 days.\n", encoding="utf-8")
    old.write_text("Refunds take 5 days.\n", encoding="utf-8")
    res = stoker("invalidate", "kb", "kb/refunds", "--tenant", "acme", "--doc-version", "4",
                 "--text-file", str(new), "--previous-text-file", str(old), **env)  # fmt: skip
    assert res.returncode == 0, res.stderr
    consumer = Consumer(consumer_config(kafka_bootstrap, f"g{unique}", embedded=True))
    try:
        consumer.subscribe([topic_name("inference.kb-changes", prefix)])
        msgs = consumer.consume(num_messages=2, timeout=20)
    finally:
        consumer.close()
    assert len(msgs) == 2
    ev, with_text = (decode_event(m.value()) for m in msgs)
    assert isinstance(ev, KnowledgeBaseChanged) and isinstance(with_text, KnowledgeBaseChanged)
    assert (ev.tenant, ev.doc_id, ev.doc_version, ev.change) == ("acme", "kb/refunds", 3, "updated")
    assert (ev.schema_version, ev.text) == (1, None)
    assert (with_text.schema_version, with_text.doc_version) == (2, 4)
    assert (with_text.text, with_text.previous_text) == (
        "Refunds take 2 days.\n",
        "Refunds take 5 days.\n",
    )


def test_invalidate_cli__a_text_file_that_cannot_be_read_or_a_text_of_a_deletion_is_bad_usage(
    kafka_bootstrap, tmp_path
):
    env = {"STOKER_KAFKA_BOOTSTRAP": kafka_bootstrap}
    base = ("invalidate", "kb", "kb/x", "--tenant", "acme", "--doc-version", "1")
    missing = stoker(*base, "--text-file", str(tmp_path / "absent.txt"), **env)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    text = tmp_path / "t.txt"
    text.write_text("x", encoding="utf-8")
    deleted = stoker(*base, "--change", "deleted", "--text-file", str(text), **env)
    assert deleted.returncode == 2 and "has no new text" in deleted.stderr


def test_invalidate_cli__without_a_broker_configured_says_so_and_exits_2():
    res = stoker("invalidate", "doc", "kb/x", "--tenant", "acme")
    assert res.returncode == 2 and "STOKER_KAFKA_BOOTSTRAP" in res.stderr


def test_invalidate_cli__an_invalid_event_is_bad_usage(kafka_bootstrap):
    res = stoker(
        "invalidate",
        "kb",
        "kb/x",
        "--tenant",
        "a{b}",
        "--doc-version",
        "1",
        STOKER_KAFKA_BOOTSTRAP=kafka_bootstrap,
    )
    assert res.returncode == 2
