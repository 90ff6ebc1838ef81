"""`stoker worker all` on the embedded stack: one Qdrant Edge store per process, shared by the
serving client and every worker, removed at stop; its addresses in embedded.json for scripts."""

from __future__ import annotations

from pathlib import Path

import orjson
import redis
from rich.console import Console

from caches.request import CacheRequest
from schemas.common import DocRef
from schemas.events import KnowledgeBaseChanged
from stoker import embedded_state
from stoker.registry import available
from stoker.runtime import WorkerGroup, embedded_settings
from stoker.settings import StokerSettings
from stoker.stack import Stack
from tests.cli import run_stoker, running_stoker, stop
from tests.waiting import wait_for


def test_worker_all__one_qdrant_folder_and_an_addresses_file_both_gone_at_stop(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    env = {"TMPDIR": str(tmp_path), "STOKER_STATE_DIR": str(state)}
    with running_stoker("worker", "all", env=env) as (proc, lines):
        wait_for(lambda: any("worker traffic: group" in x for x in lines) or proc.poll() is not None,
                 120, "worker all to start")  # fmt: skip
        assert proc.poll() is None, "".join(lines)
        assert len(list(tmp_path.glob("stoker-qdrant-*"))) == 1  # not one per part
        doc = embedded_state.read(state / "embedded.json")
        assert doc is not None and doc["pid"] == proc.pid, "".join(lines)
        assert redis.Redis.from_url(doc["redis_url"]).ping()
        assert str(doc["qdrant_path"]).startswith(str(tmp_path))
        # a script reaches the stack from the file: status reads its Redis, invalidate its Kafka
        status = run_stoker("status", "--json", env={"STOKER_STATE_DIR": str(state)})
        assert status.returncode == 0, status.stderr
        assert orjson.loads(status.stdout)["embedded"]["kafka_bootstrap"] == doc["kafka_bootstrap"]
        sent = run_stoker("invalidate", "doc", "kb/x", "--tenant", "acme",
                          env={"STOKER_KAFKA_BOOTSTRAP": doc["kafka_bootstrap"]})  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        code = stop(proc)
    text = "".join(lines)
    assert code == 0, text
    assert "worker invalidation: 1 events" in text
    assert list(tmp_path.glob("stoker-qdrant-*")) == [], text
    assert not (state / "embedded.json").exists()


def test_worker_all__an_invalidation_reaches_the_store_the_serving_client_reads(
    tmp_path: Path,
) -> None:
    """What `stoker worker all` (and `stoker gateway`) run, in this process: the embedded
    stack, every worker, and a serving cache client, with no STOKER_QDRANT_PATH."""
    base = StokerSettings(state_dir=tmp_path, worker_poll_s=0.05)
    with embedded_settings(base, Console(stderr=True), what="this test") as s:
        assert s.qdrant_path is not None
        stack = Stack(s)
        client = stack.cache
        workers = WorkerGroup(stack, available())
        workers.start()
        try:
            assert client.semantic is not None
            assert stack.semantic is client.semantic  # the workers' store is the client's
            req = CacheRequest("acme", "m", "v1", "t1", "how do i reset my password",
                               docs=(DocRef(doc_id="kb/reset"),))  # fmt: skip
            stored = client.store(client.lookup(req), "Open settings, then Security.")
            assert stored.landed and stored.semantic_indexed
            assert client.semantic.count({"tenant": "acme"}) == 1
            with stack.publisher as pub:
                ev = KnowledgeBaseChanged(tenant="acme", doc_id="kb/reset", doc_version=2,
                                          change="updated")  # fmt: skip
                pub.publish("inference.kb-changes", ev, key="acme")
                pub.flush()
            wait_for(lambda: client.semantic.count({"tenant": "acme"}) == 0, 60,  # type: ignore[union-attr]
                     "the invalidation worker to delete the vector the client reads")  # fmt: skip
            paraphrase = CacheRequest("acme", "m", "v1", "t1", "How can I reset my password?",
                                      docs=(DocRef(doc_id="kb/reset"),))  # fmt: skip
            assert client.lookup(paraphrase).outcome == "miss"
            assert client.lookup(req).outcome == "miss"
        finally:
            workers.join()
            stack.close()
        assert not workers.errors
