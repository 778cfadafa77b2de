"""`GET /healthz`: can this bot serve right now? (SONALITY_HEALTH_PORT; off by default)

Why an endpoint and not just "the process is alive": a bot whose model key was revoked,
whose Discord connection is gone or whose database no longer answers is alive and
useless. A container runtime, systemd or a monitor asks this URL and gets 200 when the
bot can answer people, 503 (with the reason in the JSON) when it cannot.

What it checks, and why each is enough:

* the database answers a trivial query through the bot's own connection, so a stuck
  writer or a closed file shows up;
* the language model: the shared client is wrapped once (`RecordingLLM`, in
  `app.wiring.open_runtime`) and every call's outcome noted per model. A model counts as
  down once its failures, with no success in between, span more than
  SONALITY_HEALTH_LLM_FAILING_SECONDS. Why a span of failures and not "time since the
  first failure": with no traffic there is no news, and one failed call followed by a
  quiet night must not get a healthy bot restarted; a model that keeps failing for
  longer than the threshold does. One success ends it;
* the platforms: Discord's client is ready and its gateway open, the Slack adapter has
  connected (or is listening) and still runs, the terminal counts as connected while
  it runs.

The server is aiohttp (already a dependency), bound to 127.0.0.1 unless
SONALITY_HEALTH_HOST says otherwise, without an access log (a probe every few seconds
would bury the real log).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from app.logs import hide_credentials
from bot.interface import Adapter, StartupError
from bot.settings import Settings
from providers.forwarding import ForwardingLLM
from sonality.llm import (
    LLMClient,
    LLMError,
    R,
)
from storage import Database
from storage.maintenance import ping

log = logging.getLogger(__name__)

PATH = "/healthz"
#: A database that has not answered `SELECT 1` within this long counts as down.
DATABASE_TIMEOUT_SECONDS = 5.0
#: Calls made without naming a model use the client's default; reported under this key.
DEFAULT_MODEL_KEY = "default"

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


# ------------------------------------------------------------------------------ the LLM


@dataclass
class ModelRecord:
    """One model's recent outcomes."""

    last_success: datetime | None = None
    failing_since: datetime | None = None  # first failure after the last success
    last_failure: datetime | None = None
    consecutive_failures: int = 0
    last_error: str = ""

    def failing_for(self) -> float:
        """Seconds from the first to the latest failure since the last success."""
        if self.failing_since is None or self.last_failure is None:
            return 0.0
        return (self.last_failure - self.failing_since).total_seconds()


class LLMHealth:
    """When each model last answered, and how long it has been failing.

    `clock` is injectable so tests can let "five minutes of failures" pass instantly.
    """

    def __init__(self, clock: Clock = utc_now) -> None:
        self.clock = clock
        self.models: dict[str, ModelRecord] = {}

    def _record(self, model: str | None) -> ModelRecord:
        return self.models.setdefault(model or DEFAULT_MODEL_KEY, ModelRecord())

    def succeeded(self, model: str | None) -> None:
        record = self._record(model)
        record.last_success = self.clock()
        record.failing_since = None
        record.consecutive_failures = 0

    def failed(self, model: str | None, error: BaseException) -> None:
        record = self._record(model)
        now = self.clock()
        if record.failing_since is None:
            record.failing_since = now
        record.last_failure = now
        record.consecutive_failures += 1
        # Scrubbed whole, then cut: a model client names its endpoint in its errors, and
        # that URL may carry a proxy's `user:password@` (OPENAI_BASE_URL).
        record.last_error = hide_credentials(" ".join(str(error).split()))[:200]

    @property
    def last_success(self) -> datetime | None:
        times = [r.last_success for r in self.models.values() if r.last_success is not None]
        return max(times, default=None)

    def failing_for(self) -> float:
        """The longest failing span of any model (0 when all answer)."""
        return max((r.failing_for() for r in self.models.values()), default=0.0)

    def report(self, threshold_seconds: float) -> tuple[bool, dict[str, Any]]:
        failing_for = self.failing_for()
        ok = failing_for <= threshold_seconds
        return ok, {
            "ok": ok,
            "last_success_at": _iso(self.last_success),
            "failing_for_seconds": round(failing_for, 3),
            "threshold_seconds": threshold_seconds,
            "models": {
                name: {
                    "last_success_at": _iso(r.last_success),
                    "failing_since": _iso(r.failing_since),
                    "failing_for_seconds": round(r.failing_for(), 3),
                    "consecutive_failures": r.consecutive_failures,
                    "last_error": r.last_error if r.consecutive_failures else "",
                }
                for name, r in sorted(self.models.items())
            },
        }


class RecordingLLM(ForwardingLLM):
    """The shared `LLMClient`, noting each call's outcome in an `LLMHealth`.

    Only `LLMError` (no answer after the client's own retries) counts as a failure: a
    call cancelled at shutdown, or refused by the spending limit (checked before this
    wrapper is reached), says nothing about the model.
    """

    def __init__(self, inner: LLMClient, health: LLMHealth) -> None:
        super().__init__(inner)
        self.health = health

    async def _forward(
        self, purpose: str, model: str | None, call: Callable[[], Awaitable[R]]
    ) -> R:
        try:
            result = await call()
        except LLMError as exc:
            self.health.failed(model, exc)
            raise
        self.health.succeeded(model)
        return result


# ------------------------------------------------------------------------- platforms


class Platforms:
    """What the running adapters can tell about their connections."""

    def __init__(self) -> None:
        self._tasks: dict[asyncio.Task[Any], Adapter] = {}
        self._ready: set[str] = set()
        self._watchers: set[asyncio.Task[None]] = set()

    def watch(self, tasks: Mapping[asyncio.Task[Any], Adapter]) -> None:
        """Follow these adapters (each with the task running its `start()`)."""
        for task, adapter in tasks.items():
            self._tasks[task] = adapter
            wait_ready = getattr(adapter, "wait_ready", None)
            if wait_ready is not None:  # Slack: resolves once connected or listening
                watcher = asyncio.create_task(
                    self._note_ready(adapter.name, wait_ready), name=f"health:{adapter.name}"
                )
                self._watchers.add(watcher)
                watcher.add_done_callback(self._watchers.discard)

    async def _note_ready(self, name: str, wait_ready: Callable[[], Awaitable[None]]) -> None:
        await wait_ready()
        self._ready.add(name)

    def status(self) -> dict[str, bool]:
        """Adapter name -> connected."""
        return {
            adapter.name: not task.done() and self._connected(adapter)
            for task, adapter in self._tasks.items()
        }

    def _connected(self, adapter: Adapter) -> bool:
        if adapter.name == "discord":
            return _discord_connected(getattr(adapter, "client", None))
        if hasattr(adapter, "wait_ready"):
            return adapter.name in self._ready
        return True  # the terminal: connected for as long as it runs

    async def close(self) -> None:
        for watcher in list(self._watchers):
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)


def _discord_connected(client: Any) -> bool:
    """Ready, not closed, and the gateway socket(s) open (discord.py clears nothing on a
    dropped socket until it reconnects, so the socket itself is asked)."""
    if client is None or client.is_closed() or not client.is_ready():
        return False
    shards = getattr(client, "shards", None)
    if isinstance(shards, Mapping):  # AutoShardedClient
        return bool(shards) and all(not shard.is_closed() for shard in shards.values())
    ws = getattr(client, "ws", None)
    return ws is not None and bool(ws.open)


# --------------------------------------------------------------------------- endpoint


class HealthEndpoint:
    """Builds the report and, once started, serves it at `PATH`."""

    def __init__(
        self,
        db: Database,
        llm: LLMHealth,
        *,
        llm_failing_seconds: float,
        platforms: Platforms | None = None,
    ) -> None:
        self.db = db
        self.llm = llm
        self.llm_failing_seconds = llm_failing_seconds
        self.platforms = platforms or Platforms()
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def report(self) -> tuple[bool, dict[str, Any]]:
        """(healthy, the JSON body)."""
        problems: list[str] = []
        try:
            await asyncio.wait_for(ping(self.db), DATABASE_TIMEOUT_SECONDS)
            database: dict[str, Any] = {"ok": True}
        except Exception as exc:
            database = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            problems.append("the database does not answer")
        llm_ok, llm = self.llm.report(self.llm_failing_seconds)
        if not llm_ok:
            problems.append(
                f"the language model has been failing for {llm['failing_for_seconds']:.0f} s"
            )
        platforms = {name: {"connected": up} for name, up in self.platforms.status().items()}
        problems += [
            f"{name} is not connected" for name, p in platforms.items() if not p["connected"]
        ]
        healthy = not problems
        return healthy, {
            "status": "ok" if healthy else "unhealthy",
            "problems": problems,
            "checked_at": _iso(self.llm.clock()),
            "database": database,
            "llm": llm,
            "platforms": platforms,
        }

    async def _handle(self, request: web.Request) -> web.Response:
        healthy, body = await self.report()
        return web.json_response(body, status=200 if healthy else 503)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(PATH, self._handle)  # HEAD too (aiohttp adds it for GET)
        return app

    async def start(self, host: str, port: int) -> None:
        """Listen on host:port (0: any free port, then in `self.port`)."""
        runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            await runner.cleanup()
            raise StartupError(
                f"error: SONALITY_HEALTH_PORT={port} is not allowed: cannot listen on "
                f"{host}:{port} ({exc.strerror or exc})"
            ) from None
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        log.info("health check on http://%s:%d%s", host, self.port, PATH)

    def watch(self, tasks: Mapping[asyncio.Task[Any], Adapter]) -> None:
        self.platforms.watch(tasks)

    async def close(self) -> None:
        await self.platforms.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


@contextlib.asynccontextmanager
async def health_endpoint(
    settings: Settings, db: Database, llm: LLMHealth
) -> AsyncIterator[HealthEndpoint]:
    """The endpoint, serving if SONALITY_HEALTH_PORT is set; closed on exit."""
    endpoint = HealthEndpoint(db, llm, llm_failing_seconds=settings.health_llm_failing_seconds)
    try:
        if settings.health_port is not None:
            await endpoint.start(settings.health_host, settings.health_port)
        yield endpoint
    finally:
        await endpoint.close()


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()
