"""A new user's first minutes, replayed as they ran them: `stoker worker all` on the embedded stack
with no model server at the warm backend's URL, and the verbs they ran beside it with nothing
configured. Before: the deploy exited 1 after 183 s ("failed 62") with 174 log lines of
`warm send failed: POST /v1/chat/completions: ConnectError` that never named the URL, `stoker
warm` said no Redis was set while the stack ran, and `stoker status` with nothing running
exited 1."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from stoker import embedded_state
from stoker.embedded import free_port
from stoker.redisconn import connect
from tests.cli import run_stoker, running_stoker, stop
from tests.waiting import wait_for
from tests.warmers.hotset_helpers import event, fill
from warmers.traffic.profile import TrafficProfile


def _last_week(tenant: str, per_hour: dict[str, int]) -> list:
    """Every hour of the last eight days asking `per_hour`: the coming hours are forecast."""
    now = datetime.now(UTC)
    out = []
    for h in range(1, 8 * 24):
        for prompt, n in per_hour.items():
            for i in range(n):
                out.append(event(len(out), tenant, prompt, now - timedelta(hours=h, minutes=i)))
    return out


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_first_contact__a_deploy_whose_backend_is_not_there_fails_at_once_naming_it(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    backend = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens, as on :8000 in the repro
    env = {"STOKER_STATE_DIR": str(state), "STOKER_WARM_BACKEND_URL": backend}
    user = {"STOKER_STATE_DIR": str(state)}  # the user's shell: nothing configured
    with running_stoker("worker", "all", env=env) as (proc, lines):
        wait_for(lambda: any("does not answer" in x for x in lines) or proc.poll() is not None,
                 180, "worker all to start and check its URLs")  # fmt: skip
        assert proc.poll() is None, "".join(lines)
        (warning,) = [_flat(x) for x in lines if "does not answer" in x]
        assert warning.startswith(f"warning: the warm backend at {backend} ")
        assert "(STOKER_WARM_BACKEND_URL)" in warning and "ConnectError" in warning
        doc = embedded_state.read(state / "embedded.json")
        assert doc is not None, "".join(lines)
        r = connect(doc["redis_url"])
        try:  # traffic learned for model m: the pre-warm has items to send
            fill(
                TrafficProfile(r), _last_week("acme", {"what is my balance": 3, "reset my pin": 2})
            )
        finally:
            r.close()

        t0 = time.monotonic()
        deploy = run_stoker(
            "deploy", "--model", "m", "--version", "2026-12-01", "--previous", "2026-11-01",
            "--grace", "1m", "--wait", "--timeout", "3m", env=user, timeout=240,
        )  # fmt: skip
        took = time.monotonic() - t0
        said = _flat(deploy.stderr)
        assert deploy.returncode == 1, deploy.stderr
        assert "using the embedded stack of `stoker worker all`" in said
        assert f"cannot connect to {backend} (STOKER_WARM_BACKEND_URL): ConnectError" in said
        assert took < 30, f"failed after {took:.0f} s, not at once"  # the bound

        warm = run_stoker("warm", "--dry-run", env=user, timeout=240)
        assert warm.returncode == 0, warm.stderr
        assert "using the embedded stack of `stoker worker all`" in _flat(warm.stderr)
        assert "dry run: nothing sent" in warm.stderr
        assert stop(proc) == 0, "".join(lines)
    failed_sends = [x for x in lines if "warm send failed" in x]
    assert len(failed_sends) <= 2, failed_sends  # one item's refusals, not 174 lines
    (stopped,) = [_flat(x) for x in lines if "warm run stopped" in x]
    assert f"cannot connect to {backend} (STOKER_WARM_BACKEND_URL)" in stopped

    gone = run_stoker("status", env=user)  # nothing runs now: a configuration error
    assert gone.returncode == 2 and "STOKER_REDIS_URL" in gone.stderr, gone.stderr
