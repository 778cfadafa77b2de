"""A recording pass-through in front of the real llama.cpp server.

Why: the tests must see every call the bot made (how many, what it asked for, how long
each took, how it finished) without changing what the server answers. Bytes go through
unchanged, streams included; the proxy only keeps a copy of each request body and, for
answers that are not streamed, the response body.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Self

import aiohttp
from aiohttp import web

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"}
)


@dataclass
class Call:
    """One request as the bot sent it, and what came back."""

    path: str
    body: dict[str, Any]
    status: int = 0
    seconds: float = 0.0
    response: dict[str, Any] = field(default_factory=dict)  # empty for a stream

    @property
    def is_chat(self) -> bool:
        return self.path.endswith("/chat/completions")

    @property
    def structure(self) -> str:
        """How a JSON answer was asked for: "tool", "response_format" or "" (prose)."""
        if self.body.get("tools"):
            return "tool"
        if isinstance(self.body.get("response_format"), dict):
            return "response_format"
        return ""

    @property
    def finish_reason(self) -> str | None:
        choices = self.response.get("choices") or [{}]
        reason = choices[0].get("finish_reason")
        return str(reason) if reason is not None else None

    @property
    def completion_tokens(self) -> int:
        return int((self.response.get("usage") or {}).get("completion_tokens") or 0)


class RecordingProxy:
    """`async with RecordingProxy(upstream) as proxy:` serves `proxy.base_url`."""

    def __init__(self, upstream_root: str, port: int = 0) -> None:
        """`port` 0: a free one. A fixed port lets a restarted bot find the same
        endpoint (what it remembers is keyed by its base URL)."""
        self.upstream_root = upstream_root.rstrip("/")
        self.port = port
        self.calls: list[Call] = []
        self.base_url = ""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def chat_calls(self) -> list[Call]:
        return [c for c in self.calls if c.is_chat]

    async def __aenter__(self) -> Self:
        # No total timeout: the bot's own client decides how long it waits.
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        call = Call(path=request.path, body=body if isinstance(body, dict) else {})
        self.calls.append(call)
        started = time.monotonic()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers.pop("Host", None)
        async with self._session.request(
            request.method, self.upstream_root + request.path_qs, data=raw, headers=headers
        ) as upstream:
            call.status = upstream.status
            out_headers = {
                k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP
            }
            if "text/event-stream" in upstream.headers.get("content-type", ""):
                response = web.StreamResponse(status=upstream.status, headers=out_headers)
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                call.seconds = time.monotonic() - started
                return response
            payload = await upstream.read()
        call.seconds = time.monotonic() - started
        try:
            parsed = json.loads(payload)
            call.response = parsed if isinstance(parsed, dict) else {}
        except ValueError:
            pass
        return web.Response(status=call.status, body=payload, headers=out_headers)
