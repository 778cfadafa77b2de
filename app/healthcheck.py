"""`python -m app.healthcheck`: ask this machine's bot for /healthz; exit 0 or 1.

Why a module and not `curl`: the slim container image has no curl, and the probe must
find the endpoint the same way the bot does (SONALITY_HEALTH_PORT and
SONALITY_HEALTH_HOST from the environment or .env), so it reads the same `Settings`.
It is what the Dockerfile's HEALTHCHECK runs; systemd or a cron job can run it too.

Exit codes follow Docker's HEALTHCHECK: 0 healthy, 1 unhealthy. With the endpoint off
there is nothing to ask, and "unknown" must not get a working bot restarted, so that
is 0 with a note.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

from app.health import PATH
from bot.settings import Settings

TIMEOUT_SECONDS = 8.0
#: A bot listening on every interface is asked on loopback.
_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def url(settings: Settings) -> str | None:
    if settings.health_port is None:
        return None
    host = _LOOPBACK.get(settings.health_host, settings.health_host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.health_port}{PATH}"


def main() -> int:
    target = url(Settings())
    if target is None:
        print("health endpoint off (SONALITY_HEALTH_PORT unset): nothing to check")
        return 0
    try:
        with urllib.request.urlopen(target, timeout=TIMEOUT_SECONDS) as response:
            print(response.read().decode(errors="replace"))
            return 0 if response.status == 200 else 1
    except urllib.error.HTTPError as exc:  # 503: the body says why
        print(exc.read().decode(errors="replace"))
        return 1
    except OSError as exc:
        print(f"no answer from {target}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
