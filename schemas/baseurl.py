"""The base URL of an OpenAI-compatible server as users write it, and the one rule that maps it.

The OpenAI convention, which the `openai` SDK, vLLM, llama.cpp and TGI all document: the base
URL includes the API version, and a route is appended to it. stoker takes every form a user
writes (the gateway's upstream, the warm, monitor and prefix-warm backends, the embedder):

    written                        routes go to (chat/completions)          server root (metrics)
    http://host:8000               http://host:8000/v1/chat/completions     http://host:8000
    http://host:8000/v1            http://host:8000/v1/chat/completions     http://host:8000
    http://host:8000/v1/           the same                                 the same
    http://host/llm/v1             http://host/llm/v1/chat/completions      http://host/llm
    https://host/openai            https://host/openai/chat/completions     https://host/openai

A URL with no path means `/v1` (what stoker took before, and vLLM's layout); any path is used as
written, as the SDK uses it. The server's own endpoints (Prometheus /metrics, /health) sit at
its root: the base without a final `/v1`. Here, not in each client, so that the gateway, the
warmers and the embedder cannot disagree about a URL; in schemas because all of them use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from schemas.errors import ConfigError

API_VERSION = "/v1"


@dataclass(frozen=True)
class BaseURL:
    """`api`: where routes go (no trailing slash); `root`: where the server's own endpoints are;
    `written`: the text as given, for messages."""

    api: str
    root: str
    written: str

    @classmethod
    def parse(cls, text: str) -> BaseURL:
        """Both bases; ConfigError, one line saying what is wrong and how to write it."""
        u = text.strip()
        parts = urlsplit(u)
        example = "http://127.0.0.1:8000/v1"
        if parts.scheme not in ("http", "https"):
            # host:port with the scheme left out; text with spaces is no host to suggest
            bare = (
                bool(u) and "://" not in u and not u.startswith("/")
                and not any(c.isspace() for c in u)
            )  # fmt: skip
            raise ConfigError(
                f"{text!r} is not an http:// or https:// URL: write the base URL as the openai "
                f"SDK takes it, e.g. {_with_scheme(u) if bare else example}"
            )
        if not parts.hostname:
            raise ConfigError(f"{text!r} names no host, e.g. {example}")
        if any(c.isspace() for c in u):
            raise ConfigError(f"{text!r}: a URL holds no spaces")
        if parts.query or parts.fragment:
            raise ConfigError(f"{text!r}: a base URL takes no ?query or #fragment")
        if parts.username is not None or parts.password is not None:
            # never echoed: the password is the point of the refusal
            raise ConfigError(
                f"the URL of {parts.hostname} holds credentials: give the key in the API key "
                "setting instead"
            )
        try:
            port = parts.port
        except ValueError as e:  # out of range, or not a number
            raise ConfigError(f"{text!r}: bad port ({e})") from None
        if port == 0:
            raise ConfigError(f"{text!r}: port 0 is not a server's port")
        origin = f"{parts.scheme}://{parts.netloc}"
        path = parts.path.rstrip("/")
        if not path:
            return cls(origin + API_VERSION, origin, text)
        return cls(origin + path, origin + path.removesuffix(API_VERSION), text)

    def route(self, path: str) -> str:
        """An API route's URL: route("chat/completions") -> <api>/chat/completions."""
        return f"{self.api}/{path.lstrip('/')}"

    def server(self, path: str) -> str:
        """One of the server's own endpoints: server("metrics") -> <root>/metrics."""
        return f"{self.root}/{path.lstrip('/')}"

    def __str__(self) -> str:
        return self.api


def route_of(gateway_path: str) -> str:
    """The upstream route of one of the gateway's own paths: /v1/chat/completions ->
    chat/completions (the gateway serves the API under /v1, as every OpenAI server does)."""
    return gateway_path.removeprefix(API_VERSION).lstrip("/")


def _with_scheme(bare: str) -> str:
    """`bare` (host:port, maybe a path) as the example to write: http:// before it, and /v1
    after it only when it names no path of its own."""
    return f"http://{bare}" if "/" in bare else f"http://{bare}/v1"
