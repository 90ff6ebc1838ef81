"""The one place bytes become events, and the one place that says why bad bytes are bad."""

from __future__ import annotations

from typing import Any, get_args

import orjson
from pydantic import TypeAdapter, ValidationError

from schemas.errors import EventDecodeError
from schemas.events import EVENT_TYPES, BaseEvent, Event

# 1 MiB: Kafka's default max.message.bytes; a bigger event is a producer bug, not traffic.
MAX_EVENT_BYTES = 1_048_576
# Enough pydantic errors to fix a producer; the rest only bloats the dead-letter record.
_MAX_RENDERED_ERRORS = 10

# Built once: building a TypeAdapter costs milliseconds, validating with it microseconds.
_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
_KNOWN_VERSIONS: dict[str, tuple[int, ...]] = {
    tag: get_args(cls.model_fields["schema_version"].annotation) for tag, cls in EVENT_TYPES.items()
}


class NotJsonObject(ValueError):
    """Bytes that are not a JSON object; the message says which part failed, to follow a
    noun ("the request body " + message)."""


def json_object(raw: bytes) -> dict[str, Any]:
    """`raw` parsed as a JSON object (an HTTP request body), or NotJsonObject."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise NotJsonObject(f"is not JSON: {e}") from None
    if not isinstance(obj, dict):
        raise NotJsonObject("must be a JSON object")
    return obj


def decode_event(data: bytes, *, max_bytes: int = MAX_EVENT_BYTES) -> Event:
    """Parse one Kafka value into an event, or raise EventDecodeError with a `reason` tag.

    Checks run cheapest first, so poison is named precisely and rejected early:
    1. size, 2. JSON, 3. top-level object, 4. known `type`, 5. known `schema_version`,
    6. the fields, validated by pydantic.
    """
    if len(data) > max_bytes:
        raise EventDecodeError("too_large", f"{len(data)} bytes, limit is {max_bytes}")
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise EventDecodeError("bad_json", str(exc)) from None
    if not isinstance(obj, dict):
        raise EventDecodeError(
            "not_an_object", f"top-level JSON is {_json_kind(obj)}, not an object"
        )
    tag = _check_type(obj)
    _check_version(obj, tag)
    try:
        return _ADAPTER.validate_python(obj)
    except ValidationError as exc:
        raise EventDecodeError("invalid_fields", _render_errors(exc)) from None


def encode_event(ev: BaseEvent) -> bytes:
    return orjson.dumps(ev.model_dump(mode="json"))


def decode_many(
    batch: list[bytes], *, max_bytes: int = MAX_EVENT_BYTES
) -> list[Event | EventDecodeError]:
    """Decode a batch in order; a bad value becomes its error, for the dead-letter topic."""
    out: list[Event | EventDecodeError] = []
    for data in batch:
        try:
            out.append(decode_event(data, max_bytes=max_bytes))
        except EventDecodeError as exc:
            out.append(exc)
    return out


def _check_type(obj: dict[str, Any]) -> str:
    tag = obj.get("type")
    if tag is None:
        raise EventDecodeError("missing_type", f'no "type" field; known types: {_known_types()}')
    # isinstance first: an unhashable tag (a list) would crash the dict lookup.
    if not isinstance(tag, str) or tag not in EVENT_TYPES:
        raise EventDecodeError("unknown_type", f"type {tag!r}; known types: {_known_types()}")
    return tag


def _check_version(obj: dict[str, Any], tag: str) -> None:
    if "schema_version" not in obj:
        raise EventDecodeError("missing_schema_version", f'{tag} event has no "schema_version"')
    version = obj["schema_version"]
    known = _KNOWN_VERSIONS[tag]
    # type() check: True == 1 in Python, and "1" is not a version either.
    if type(version) is not int or version not in known:
        raise EventDecodeError(
            "unknown_schema_version",
            f"{tag} schema_version {version!r}; this build knows {', '.join(map(str, known))}",
        )


def _render_errors(exc: ValidationError) -> str:
    """`field.path: message; ...`, without the union tag pydantic puts first in every path."""
    errors = exc.errors(include_url=False, include_input=False)
    parts = [f"{_loc(err['loc'][1:])}: {err['msg']}" for err in errors[:_MAX_RENDERED_ERRORS]]
    if len(errors) > _MAX_RENDERED_ERRORS:
        parts.append(f"... and {len(errors) - _MAX_RENDERED_ERRORS} more")
    return "; ".join(parts)


def _loc(loc: tuple[int | str, ...]) -> str:
    # An empty path is a whole-event check (a model validator).
    return ".".join(map(str, loc)) or "(event)"


def _json_kind(obj: object) -> str:
    if isinstance(obj, list):
        return "an array"
    if isinstance(obj, str):
        return "a string"
    if isinstance(obj, bool):
        return "a boolean"
    if obj is None:
        return "null"
    return "a number"


def _known_types() -> str:
    return ", ".join(sorted(EVENT_TYPES))
