"""stoker's one error tree; every other library's errors are translated into it at the boundary.

StokerError                  root: the CLI and the workers catch only this
├── PoisonError              bad input: dead-letter it, never retry (kind="poison")
│   ├── EventDecodeError     bytes that are not a valid event (bad JSON, unknown type/version, fields)
│   ├── RequestRejected      a request stoker refuses to key (oversized prompt, bad tenant id)
│   └── BackendRejected      the inference backend refused the request itself (HTTP 4xx but 408/429)
├── RetriableError           a dependency is down or slow: back off, retry, do not commit (kind="retriable")
│   ├── CacheUnavailable     Redis or Qdrant did not answer
│   ├── BrokerUnavailable    Kafka did not answer
│   └── BackendUnavailable   the inference backend did not answer (timeout, connect error, 5xx)
│       ├── BackendOverloaded    it answered 429: back off (the warmer's AIMD must see every one)
│       ├── BackendTimedOut      it did not answer in time (the gateway answers 504, not 502)
│       └── BackendUnreachable   its connections are refused: a run stops sending at once
└── FatalError               cannot go on: exit non-zero (kind="fatal")
    ├── ConfigError          settings that cannot work
    ├── UsageError           input the user gave cannot be used (a setting out of range or
    │                        unknown, an unreadable file, a log with no valid row): the CLI exits 2
    └── ServiceStartError    an embedded service did not start
"""

from __future__ import annotations

from typing import ClassVar, Literal

ErrorKind = Literal["poison", "retriable", "fatal"]


class StokerError(Exception):
    """Root of every error stoker raises on purpose."""

    kind: ClassVar[ErrorKind] = "fatal"


class PoisonError(StokerError):
    kind: ClassVar[ErrorKind] = "poison"


class EventDecodeError(PoisonError):
    """Bytes that do not decode into a known event; `reason` is a short machine-readable tag."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class RequestRejected(PoisonError):
    pass


class RetriableError(StokerError):
    kind: ClassVar[ErrorKind] = "retriable"


class CacheUnavailable(RetriableError):
    pass


class BrokerUnavailable(RetriableError):
    pass


class BackendUnavailable(RetriableError):
    pass


class FatalError(StokerError):
    kind: ClassVar[ErrorKind] = "fatal"


class ConfigError(FatalError):
    pass


class UsageError(FatalError):
    """Bad input to a command: the CLI exits 2 (bad usage), not 1 (failed)."""


class ServiceStartError(FatalError):
    pass


class BackendOverloaded(BackendUnavailable):
    """HTTP 429: the backend is alive but full. `retry_after_s` is its Retry-After, if it sent one."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BackendTimedOut(BackendUnavailable):
    """The backend took longer than the client's limit to connect or to answer."""


class BackendUnreachable(BackendUnavailable):
    """The backend refused connections several times in a row (nothing listens at its URL, or
    no route to it): the client's circuit is open, and the run it serves stops sending rather
    than retry each item. Still retriable for a worker: its next run (or batch) tries again."""


class BackendRejected(PoisonError):
    """HTTP 4xx (not 408/429): the same request would fail again, so it is never retried."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status
