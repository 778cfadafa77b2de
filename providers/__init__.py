"""`LLMClient` implementations, one per vendor SDK, chosen once at start from settings.

Why outside `sonality/`: the engine must not learn which vendor it talks to; it sees
only the `sonality.llm.LLMClient` protocol.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import ssl
from collections.abc import Callable
from typing import Literal
from urllib.parse import urlsplit

Provider = Literal["anthropic", "openai"]

#: The most output tokens a call may ask for, by its `purpose` (None: what it asked).
#: The host decides the roles; the clients only apply the smaller of the two numbers.
OutputCap = Callable[[str], int | None]

#: SONALITY_LLM_TIMEOUT_SECONDS when unset: a hosted API answers in seconds, while a
#: model on the operator's own CPU may take a minute before its first token of a long
#: uncached prompt (54 s was measured for 2,400 tokens on 2 cores), and longer when the
#: server is still busy with an earlier call.
HOSTED_TIMEOUT_SECONDS = 60.0
LOCAL_TIMEOUT_SECONDS = 300.0

#: (reply model, evidence model) when SONALITY_MODEL / SONALITY_ESS_MODEL are unset.
#: The evidence work (ESS, insight, reflection) is a short classification or rewrite, so
#: it defaults to the vendor's small model; docs/models.md "Models and cost" has the measured
#: difference.
DEFAULT_MODELS: dict[str, tuple[str, str]] = {
    "anthropic": ("claude-sonnet-4-6", "claude-haiku-4-5"),
    "openai": ("gpt-4.1", "gpt-4.1-mini"),
}


@functools.cache
def shared_tls_context() -> ssl.SSLContext:
    """The TLS context every SDK client of this process shares.

    A client left to itself builds its own and reads the system's CA certificates
    again: about 80 ms of CPU each (a profile of the pipeline tests counted 96 clients
    and 8.2 s). This is the context the SDKs build by default (httpx2's, which honours
    SSL_CERT_FILE and SSL_CERT_DIR), made once; their aiohttp transport only reads it.
    """
    import httpx2  # the SDKs' HTTP library: imported with them, not before

    return httpx2.create_ssl_context()


def capped(max_tokens: int, purpose: str, cap: OutputCap | None) -> int:
    """`max_tokens`, lowered to the cap of `purpose`'s role if there is one."""
    limit = cap(purpose) if cap is not None else None
    return max_tokens if limit is None else max(1, min(max_tokens, limit))


#: Host names that are local by convention (RFC 6761 `.localhost`, mDNS `.local`, the
#: `.internal` and `.lan` names of home routers and Docker's `host.docker.internal`).
_LOCAL_SUFFIXES = (".localhost", ".local", ".internal", ".lan")


def is_local_endpoint(base_url: str | None) -> bool:
    """Whether `base_url` names a server on this machine or its private network:
    a loopback, private or link-local address, `localhost`, a name under a local
    suffix, or a single-label name such as a Compose service (`http://ollama:11434`).
    No name is looked up: this decides a default, and must not wait on DNS."""
    if not base_url:
        return False
    host = (urlsplit(base_url.strip()).hostname or "").rstrip(".").lower()
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost" or host.endswith(_LOCAL_SUFFIXES) or "." not in host
    return address.is_loopback or address.is_private or address.is_link_local


def connection_failure(err: BaseException) -> str | None:
    """Why no connection could be made, if that is what happened ("connection refused").

    Why not just an SDK's error class: the OpenAI SDK's aiohttp transport reports a refused
    connection as a connect *timeout*, which would send an operator looking for a slow
    server instead of a wrong URL. The cause chain still holds the socket's own error.
    """
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, socket.gaierror):
            return "host name not found"
        if isinstance(cause, ssl.SSLError):
            return f"TLS error: {cause.reason or cause}"
        cause = cause.__cause__ or cause.__context__
    return None
