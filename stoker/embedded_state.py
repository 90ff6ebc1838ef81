"""Where a process running the embedded stack writes its addresses, so scripts need no banner.

`stoker worker all` and `stoker gateway` with nothing configured start Tansu and redis-server on
free ports. A script that wants to reach them (`stoker invalidate`, `stoker deploy`, its own
producer) reads them from one JSON file instead of parsing the startup banner:

    $STOKER_STATE_DIR/embedded.json   (default ~/.cache/stoker/embedded.json)
    {"kafka_bootstrap": "127.0.0.1:40123", "redis_url": "redis://127.0.0.1:40125/0",
     "qdrant_path": "/tmp/stoker-qdrant-...", "pid": 4242, "started_at": 1796123856.4,
     "what": "stoker worker all"}

The file is written atomically (a temp file renamed) once the stack answers, and removed when it
stops, by the process that wrote it only (a second stack started meanwhile keeps its own).
`read()` returns None for a file whose process is gone (a SIGKILL leaves it behind).
`stoker status --json` shows it as "embedded", and `stoker status` reads its Redis when
STOKER_REDIS_URL is unset.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

FILE_NAME = "embedded.json"


def state_path(state_dir: Path | None) -> Path:
    """The addresses file under `state_dir` (STOKER_STATE_DIR), else ~/.cache/stoker."""
    return (state_dir or Path.home() / ".cache" / "stoker") / FILE_NAME


@contextlib.contextmanager
def published(path: Path, addresses: dict[str, Any], what: str) -> Iterator[Path]:
    """Write the addresses for the life of the block; remove them after, if still ours."""
    doc = {**addresses, "pid": os.getpid(), "started_at": time.time(), "what": what}
    write(path, doc)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            current = _load(path)
            if current is not None and current.get("pid") == os.getpid():
                path.unlink()


def write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".embedded-", suffix=".json")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps(doc, default=str, option=orjson.OPT_INDENT_2))
        os.replace(tmp, path)  # readers see the old file or the new one, never half of one
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read(path: Path) -> dict[str, Any] | None:
    """The addresses of a live embedded stack, or None (no file, unreadable, process gone)."""
    doc = _load(path)
    if doc is None or not _alive(doc.get("pid")):
        return None
    return doc


def _load(path: Path) -> dict[str, Any] | None:
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # signal 0: is there such a process (that we may signal)?
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True
