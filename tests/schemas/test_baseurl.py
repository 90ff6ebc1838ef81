"""Base URLs as users write them: every form maps to the same routes, a bad one is one line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.baseurl import BaseURL, route_of
from schemas.errors import ConfigError


@pytest.mark.parametrize(
    ("written", "chat", "metrics"),
    [
        ("http://h:8000", "http://h:8000/v1/chat/completions", "http://h:8000/metrics"),
        ("http://h:8000/", "http://h:8000/v1/chat/completions", "http://h:8000/metrics"),
        ("http://h:8000/v1", "http://h:8000/v1/chat/completions", "http://h:8000/metrics"),
        ("http://h:8000/v1/", "http://h:8000/v1/chat/completions", "http://h:8000/metrics"),
        (" http://h:8000/v1 ", "http://h:8000/v1/chat/completions", "http://h:8000/metrics"),
        ("http://h/llm/v1", "http://h/llm/v1/chat/completions", "http://h/llm/metrics"),
        ("https://h/openai/", "https://h/openai/chat/completions", "https://h/openai/metrics"),
        (
            "http://[::1]:8000/v1",
            "http://[::1]:8000/v1/chat/completions",
            "http://[::1]:8000/metrics",
        ),
    ],
)
def test_base_url__each_written_form_maps_to_the_routes_the_openai_sdk_would_call(
    written: str, chat: str, metrics: str
) -> None:
    url = BaseURL.parse(written)
    assert url.route("chat/completions") == url.route("/chat/completions") == chat
    assert url.server("/metrics") == metrics
    assert url.written == written


@pytest.mark.parametrize(
    ("written", "says"),
    [
        ("127.0.0.1:8002", "e.g. http://127.0.0.1:8002/v1"),
        ("localhost:8000/v1", "not an http:// or https:// URL"),
        ("localhost:8000/v1", "e.g. http://localhost:8000/v1"),  # its own path, not /v1/v1
        ("ftp://h/v1", "not an http:// or https:// URL"),
        ("", "not an http:// or https:// URL"),
        ("http:///v1", "names no host"),
        ("http://h:99999/v1", "bad port"),
        ("http://h:eighty/v1", "bad port"),
        ("http://h:0/v1", "port 0"),
        ("http://h/v1?key=1", "no ?query"),
        ("http://h /v1", "no spaces"),
        ("not a url", "e.g. http://127.0.0.1:8000/v1"),  # not "http://not a url/v1"
    ],
)
def test_base_url__a_malformed_one_is_one_line_saying_what_is_wrong(
    written: str, says: str
) -> None:
    with pytest.raises(ConfigError) as e:
        BaseURL.parse(written)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert "/v1/v1" not in str(e.value)


def test_base_url__credentials_are_refused_and_never_echoed() -> None:
    with pytest.raises(ConfigError) as e:
        BaseURL.parse("http://me:s3cret@h:8000/v1")
    assert "credentials" in str(e.value) and "s3cret" not in str(e.value)


def test_base_url__the_gateways_own_paths_map_to_routes() -> None:
    assert route_of("/v1/chat/completions") == "chat/completions"
    assert route_of("/v1/models") == "models"


@given(
    host=st.sampled_from(["h", "127.0.0.1", "model.internal"]),
    port=st.one_of(st.none(), st.integers(1, 65_535)),
    prefix=st.lists(st.text("abcxyz-_", min_size=1, max_size=6), max_size=3),
    slash=st.booleans(),
)
def test_base_url__with_or_without_v1_and_a_trailing_slash_the_routes_agree(
    host: str, port: int | None, prefix: list[str], slash: bool
) -> None:
    origin = f"http://{host}" + (f":{port}" if port else "")
    base = origin + "".join(f"/{p}" for p in prefix)
    with_v1 = BaseURL.parse(base + "/v1" + ("/" if slash else ""))
    assert with_v1.route("models") == base + "/v1/models"
    assert with_v1.server("metrics") == base + "/metrics"
    if not prefix:  # no path at all: /v1 is implied
        assert BaseURL.parse(origin + ("/" if slash else "")) == BaseURL(
            with_v1.api, with_v1.root, origin + ("/" if slash else "")
        )
