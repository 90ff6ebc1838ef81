"""Startable: leaving the `with` block ends what it started, whether the block failed or not."""

from __future__ import annotations

from typing import Self

import pytest

from schemas.lifecycle import Startable


class _Recorder(Startable):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self) -> Self:
        self.calls.append("start")
        return self

    def stop(self) -> None:
        self.calls.append("stop")


def test_startable__with_starts_then_stops_and_gives_the_started_object() -> None:
    r = _Recorder()
    with r as got:
        assert got is r and r.calls == ["start"]
    assert r.calls == ["start", "stop"]


def test_startable__a_failing_block_still_stops_and_the_error_propagates() -> None:
    r = _Recorder()
    with pytest.raises(RuntimeError, match="boom"), r:
        raise RuntimeError("boom")
    assert r.calls == ["start", "stop"]


def test_startable__close_is_what_exit_calls_so_a_server_can_also_wait() -> None:
    class Draining(_Recorder):
        def close(self) -> None:
            self.stop()
            self.calls.append("joined")

    d = Draining()
    with d:
        pass
    assert d.calls == ["start", "stop", "joined"]
