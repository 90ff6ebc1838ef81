"""librdkafka's own log lines through Python logging, at levels an operator can live with.

Left alone, librdkafka writes to stderr itself: `stoker deploy --wait` against a broker that is
down printed ~190 lines of "%3|...|FAIL|rdkafka#producer-1| ... Connection refused" (one per
reconnect, every 50 ms) before its one correct final line. Every client config built in
streams/topics.py sets `logger` to KAFKA_LOG, which sends each line to the "librdkafka" logger:
- connection trouble (facility FAIL: connect refused, disconnects, timeouts) at DEBUG: stoker
  reports the outcome itself, once ("Kafka at ... did not create topics within 10 s", the
  worker's back-off line), and librdkafka retries on its own;
- other errors and warnings at WARNING, each facility at most once a minute (the rest DEBUG);
- librdkafka's notices and info (broker up, purged queues) at DEBUG; its critical lines at ERROR.
confluent-kafka hands a client's lines over from poll()/flush()/consume(), in the caller's
thread, so nothing logs from librdkafka's own threads.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Final

LOGGER_NAME: Final = "librdkafka"
# One line a minute per facility: enough to see a problem persist, not enough to bury others.
REPEAT_EVERY_S: Final = 60.0
# Facilities of routine connection churn (librdkafka's FAIL is "a broker connection failed").
_ROUTINE: Final = frozenset({"FAIL"})


class KafkaClientLog:
    """What confluent-kafka's `logger` config calls: log(level, "%s [%s] %s", fac, name, text)."""

    def __init__(self, name: str = LOGGER_NAME, repeat_every_s: float = REPEAT_EVERY_S) -> None:
        self.logger = logging.getLogger(name)
        self.repeat_every_s = repeat_every_s
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()  # clients of several threads share this one object

    def log(self, level: int, msg: str, *args: object) -> None:
        facility = str(args[0]) if args else ""
        self.logger.log(self.level_for(level, facility), msg, *args)

    def level_for(self, level: int, facility: str) -> int:
        """The Python level a librdkafka line is logged at (see the module docstring)."""
        if level >= logging.CRITICAL:
            return logging.ERROR
        if level < logging.WARNING or facility in _ROUTINE:
            return logging.DEBUG
        now = time.monotonic()
        with self._lock:
            last = self._last.get(facility)
            if last is not None and now - last < self.repeat_every_s:
                return logging.DEBUG
            self._last[facility] = now
        return logging.WARNING


KAFKA_LOG: Final = KafkaClientLog()
