"""The figures on the scale-out stack: PostgreSQL and a Chroma server, each started
here in a temporary directory. 1s is figure 1 (reply time ÷ bare LLM round trip) with
the state in PostgreSQL and the 10,000 episodes on the server; 3s is figure 3a (the CPU
per answered message, 100 communities) spread over several bot processes; 4b, below, is memory.

Figure 4b: the memory of several bot processes on PostgreSQL and a Chroma server.

Workload: `known` communities (a seed version and five episodes each) in a real
PostgreSQL 16 (pgserver's binaries, as the tests start it) and a real `chroma run`
server, each in a temporary directory; then `processes` bot processes, each a real
runtime with DATABASE_URL and CHROMA_URL, and each given its share of `active`
communities (as Discord shards or a Slack load balancer would), which send one
message each against the loopback LLM. Once every process has finished learning,
the memory of each process is read at the same moment: the bots (the figure, PSS, so
pages shared with nothing else count once), and beside them the Chroma server and
every PostgreSQL process (what the operator must also provision).

Why the episodes are written into the server's directory before the server starts,
not through it: a Chroma 1.5 server keeps the index of every collection it has opened
in memory until it stops (about 2.6 MB each; seeding 10,000 communities through a
server had it at 11 GB RSS after some 4,000 of them, measured, and climbing). Seeding
embedded, with the bot's own bound on open indexes, and then starting `chroma run` on
that directory leaves the server holding only what the bots' traffic opened.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import chromadb

from bot.messages import Community
from chroma_memory.community_store import CommunityEpisodeStore
from chroma_memory.embedding import close_chroma_client, default_embedding_function
from chroma_memory.shared_chroma import SharedChroma
from sonality.state import SpongeState
from sonality.store import StateCommit

if TYPE_CHECKING:
    from tests.pg import PostgresServer

Report = Callable[..., None]
EPISODES_PER_COMMUNITY = 5
SEED_THREADS = 8


def _pss_tree(pid: int) -> tuple[int, int, int]:
    """(PSS, RSS, processes) of a process and all its descendants."""
    import psutil

    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    pss = rss = 0
    for proc in procs:
        try:
            info = proc.memory_full_info()
        except psutil.Error:
            continue
        pss += info.pss
        rss += info.rss
    return pss, rss, len(procs)


def _postmaster_pid(data: Path) -> int:
    return int((data / "postmaster.pid").read_text().splitlines()[0])


def _mb(value: int) -> str:
    return f"{value / 2**20:,.0f} MB"


@contextlib.contextmanager
def postgres_server(figure: str) -> Iterator[PostgresServer]:
    """A real PostgreSQL 16 (pgserver's binaries, started as the tests start it) for one
    figure, in a temporary directory of its own, outside the figures' scratch
    directory: as root the server runs as nobody, who must be able to reach it."""
    from tests.pg import _bin_dir, running_postgres

    bindir = _bin_dir()
    if bindir is None:
        raise SystemExit(
            f"figure {figure} needs pgserver's PostgreSQL binaries: pip install pgserver"
        )
    with running_postgres(bindir, f"sonality-{figure}-pg-") as server:
        yield server


# ---------------------------------------------------------------------- child phases


async def seed(url: str, chroma_path: Path, known: int) -> None:
    """Phase run in a child process: `known` communities that once talked, each with a
    seed version in PostgreSQL and five episodes in the Chroma directory the server
    will serve (the vectors are computed once and shared: the figure is about memory,
    not embedding)."""
    from bench.run import MODEL_CACHE, embedded_episodes
    from storage import Database

    db = await Database.open_url(url)
    embed = default_embedding_function(MODEL_CACHE)
    episodes = embedded_episodes(EPISODES_PER_COMMUNITY, embed)
    # Embedded, with the bot's own bound on open indexes, straight into the directory
    # `chroma run` serves afterwards (see the module docstring for why not through it).
    chroma = SharedChroma(chroma_path, max_open=64)

    def store(i: int) -> None:
        CommunityEpisodeStore.for_community(
            f"bench:k{i}", None, client=chroma, embedding_function=embed
        ).store_many(episodes)

    async def state(i: int) -> None:
        cid = f"bench:k{i}"
        await db.community(cid).commit(
            StateCommit(state=SpongeState(), cause="seed", change="seed personality")
        )
        await db.touch_community(cid, f"k{i}")

    start = time.perf_counter()
    with ThreadPoolExecutor(SEED_THREADS) as pool:
        loop = asyncio.get_running_loop()
        for first in range(0, known, 100):
            chunk = range(first, min(known, first + 100))
            await asyncio.gather(
                *(state(i) for i in chunk), *(loop.run_in_executor(pool, store, i) for i in chunk)
            )
    close_chroma_client(chroma_path)
    await db.close()
    print(f"seeded {known} communities in {time.perf_counter() - start:.0f} s", file=sys.stderr)


async def serve(data: Path, llm_url: str, url: str, chroma_url: str, active: Sequence[int]) -> None:
    """Phase run in each bot process: its share of the active communities send one
    message each; once learning is finished, say so and wait to be measured."""
    from bench.run import bot, message

    async with bot(
        data,
        llm_url,
        cap=32,
        DATABASE_URL=url,
        CHROMA_URL=chroma_url,
    ) as (runtime, _llm):
        known = len(await runtime.db.community_ids())
        ids = list(active)
        for first in range(0, len(ids), 10):
            await asyncio.gather(
                *(
                    runtime.handle(message(Community(id=f"bench:k{i}"), i))
                    for i in ids[first : first + 10]
                )
            )
        await runtime.drain()
        for agent in runtime.registry.loaded().values():
            await agent.flush_episodes()
        gc.collect()
        loaded = len(runtime.registry.loaded())
        print(json.dumps({"known": known, "loaded": loaded}), flush=True)
        await asyncio.to_thread(sys.stdin.read)  # the parent measures, then closes stdin


# ------------------------------------------------------------------------- the figure


def figure_scale_memory(
    work: Path, known: int, active: int, processes: int, report: Report
) -> None:
    from bench.run import ROOT, llm_server
    from tests.chroma_server import ChromaServer, start_chroma_server, stop_chroma_server

    chroma_path = work / "4b-chroma" / "data"
    chroma: ChromaServer | None = None
    bots: list[subprocess.Popen[str]] = []
    with postgres_server("4b") as postgres:
        try:
            url = postgres.new_database()
            here = [sys.executable, "-m", "bench.scale"]
            subprocess.run(
                [*here, "seed", "--url", url, "--chroma", str(chroma_path), "--known", str(known)],
                cwd=ROOT,
                check=True,
            )
            chroma = start_chroma_server(chroma_path)
            served = chromadb.HttpClient(host="127.0.0.1", port=int(chroma.url.rsplit(":", 1)[1]))
            if served.count_collections() < known:  # the server must serve what was seeded
                raise SystemExit(
                    f"the Chroma server shows {served.count_collections()} collections"
                )
            with llm_server(0.0) as llm_url:
                for index in range(processes):
                    share = ",".join(str(i) for i in range(index, active, processes))
                    data = work / f"4b-bot-{index}"
                    data.mkdir(parents=True)
                    bots.append(
                        subprocess.Popen(
                            [
                                *here,
                                *("serve", "--url", url, "--chroma", chroma.url, "--llm", llm_url),
                                *("--data", str(data), "--active", share),
                            ],
                            cwd=ROOT,
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE,
                            text=True,
                        )
                    )
                states: list[dict[str, Any]] = []
                for proc in bots:
                    assert proc.stdout is not None
                    line = proc.stdout.readline()
                    if not line:
                        raise SystemExit(f"a bot process of figure 4b exited ({proc.wait()})")
                    states.append(json.loads(line))
                measured = [_pss_tree(proc.pid) for proc in bots]
                chroma_pss, chroma_rss, _ = _pss_tree(chroma.process.pid)
                pg_pss, pg_rss, pg_procs = _pss_tree(_postmaster_pid(postgres.data))
                for proc in bots:
                    assert proc.stdin is not None
                    proc.stdin.close()
                    proc.wait(120)
        finally:
            for proc in bots:
                if proc.poll() is None:
                    proc.kill()
            if chroma is not None:
                stop_chroma_server(chroma)
    bots_pss = sum(m[0] for m in measured)
    each = ", ".join(_mb(m[0]) for m in measured)
    loaded = sum(s["loaded"] for s in states)
    report(
        "4b. resident memory, scale-out",
        f"{_mb(bots_pss)} PSS over {processes} bot processes ({each}; RSS sum "
        f"{_mb(sum(m[1] for m in measured))}); beside them the Chroma server "
        f"{_mb(chroma_pss)} PSS (RSS {_mb(chroma_rss)}) and PostgreSQL {_mb(pg_pss)} PSS "
        f"over {pg_procs} processes (RSS sum {_mb(pg_rss)}, shared buffers counted in each)",
        f"{states[0]['known']:,} known communities with {EPISODES_PER_COMMUNITY} episodes "
        f"each in PostgreSQL 16 and a Chroma server, {loaded:,} of them active across "
        f"{processes} processes (one message each, learning finished)",
        "bot processes < 1 GB",
        bots_pss < 2**30,
    )


def figure_scale_reply_ratio(work: Path, episodes: int, latency: float, n: int) -> None:
    """Figure 1 with the community's state in PostgreSQL and its episodes on a Chroma
    server: what the two extra network hops cost a reply, next to the LLM round trip."""
    from bench.run import figure_reply_ratio
    from tests.chroma_server import running_chroma_server

    with (
        postgres_server("1s") as postgres,
        running_chroma_server(work / "1s-chroma" / "data") as chroma,
    ):
        asyncio.run(
            figure_reply_ratio(
                work,
                episodes,
                latency,
                n,
                chroma_url=chroma.url,
                database_url=postgres.new_database(),
            )
        )


async def chat(
    data: Path,
    llm_url: str,
    url: str,
    chroma_url: str,
    communities: Sequence[int],
    cap: int,
    seconds: float,
) -> None:
    """Phase run in each bot process of figure 3s: load its share of the communities,
    warm up, say it is ready, wait for the parent's go (so every process chats over the
    same seconds), run figure 3a's workload and print what it counted."""
    from bench.run import Window, answer, bot, chat_for, learned

    async with bot(data, llm_url, cap=cap, DATABASE_URL=url, CHROMA_URL=chroma_url) as (
        runtime,
        _llm,
    ):
        groups = [Community(id=f"bench:c{i}", name=f"c{i}") for i in communities]
        await asyncio.gather(*(runtime.registry.agent_for(c) for c in groups))
        await asyncio.gather(*(answer(runtime, c, 0, Window()) for c in groups))
        await learned(runtime)
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        window = await chat_for(runtime, groups, seconds, first=1)
        print(
            json.dumps({"cpu": window.cpu, "seconds": window.seconds, "replies": window.replies}),
            flush=True,
        )


def _cpu_tree(pid: int) -> float:
    """CPU seconds (user + system) so far of a process and its live descendants."""
    import psutil

    root = psutil.Process(pid)
    total = 0.0
    for proc in (root, *root.children(recursive=True)):
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def figure_scale_capacity(
    work: Path,
    communities: int,
    latency: float,
    cap: int,
    seconds: float,
    processes: int,
    report: Report,
) -> None:
    """Figure 3a over `processes` bot processes on PostgreSQL and a Chroma server: the
    CPU one answered message costs the bots, and beside it what it costs the two
    servers, which on this stack are part of every message. The concurrency cap is per
    process, so each gets an equal share of `cap`."""
    from bench.run import ROOT, cores, fmt_ms, llm_server
    from tests.chroma_server import running_chroma_server

    if cap % processes:
        raise SystemExit(f"figure 3s splits the cap {cap} evenly: {processes} processes do not")
    bots: list[subprocess.Popen[str]] = []
    results: list[dict[str, Any]] = []
    with (
        postgres_server("3s") as postgres,
        running_chroma_server(work / "3s-chroma" / "data") as chroma,
        llm_server(latency) as llm_url,
    ):
        url = postgres.new_database()
        servers = (chroma.process.pid, _postmaster_pid(postgres.data))
        try:
            for index in range(processes):
                share = ",".join(str(i) for i in range(index, communities, processes))
                data = work / f"3s-bot-{index}"
                data.mkdir(parents=True)
                bots.append(
                    subprocess.Popen(
                        [
                            *(sys.executable, "-m", "bench.scale", "chat"),
                            *("--url", url, "--chroma", chroma.url, "--llm", llm_url),
                            *("--data", str(data), "--active", share),
                            *("--cap", str(cap // processes), "--seconds", str(seconds)),
                        ],
                        cwd=ROOT,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                )
            for proc in bots:
                assert proc.stdout is not None
                if proc.stdout.readline().strip() != "ready":
                    raise SystemExit(f"a bot process of figure 3s exited ({proc.wait()})")
            before = [_cpu_tree(pid) for pid in servers]
            for proc in bots:  # all ready: start them together
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            for proc in bots:
                assert proc.stdout is not None
                line = proc.stdout.readline()
                if not line:
                    raise SystemExit(f"a bot process of figure 3s exited ({proc.wait()})")
                results.append(json.loads(line))
            after = [_cpu_tree(pid) for pid in servers]
            chroma_cpu, pg_cpu = (a - b for a, b in zip(after, before, strict=True))
            for proc in bots:
                proc.wait(120)
        finally:
            for proc in bots:
                if proc.poll() is None:
                    proc.kill()
    replies = sum(r["replies"] for r in results)
    bots_cpu = sum(r["cpu"] for r in results) / replies
    whole = bots_cpu + (chroma_cpu + pg_cpu) / replies
    report(
        f"3s. CPU per answered message, {communities} communities over {processes} processes",
        f"bots {fmt_ms(bots_cpu)} (per process "
        + ", ".join(fmt_ms(r["cpu"] / r["replies"]) for r in results)
        + f"), Chroma server {fmt_ms(chroma_cpu / replies)}, PostgreSQL "
        f"{fmt_ms(pg_cpu / replies)}: {fmt_ms(whole)} in all, capacity {cores()} cores ÷ "
        f"that = {cores() / whole:.0f} messages/s ({replies} replies in "
        f"{max(r['seconds'] for r in results):.1f} s)",
        f"figure 3a's workload for {seconds:.0f} s, its communities spread over "
        f"{processes} bot processes on PostgreSQL 16 and a Chroma server, LLM latency "
        f"{latency * 1000:.0f} ms, cap {cap} in all ({cap // processes} each); servers' "
        "CPU read over the same window",
        "none (shows what the two servers add per message)",
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="figures 3s and 4b's child phases (bench/catalog.py)"
    )
    parser.add_argument("phase", choices=["seed", "serve", "chat"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--chroma", required=True)
    parser.add_argument("--known", type=int, default=0)
    parser.add_argument("--llm")
    parser.add_argument("--data", type=Path)
    parser.add_argument("--active", default="")
    parser.add_argument("--cap", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args(argv)
    share = [int(i) for i in args.active.split(",") if i]
    if args.phase == "seed":
        asyncio.run(seed(args.url, Path(args.chroma), args.known))
    elif args.phase == "chat":
        asyncio.run(chat(args.data, args.llm, args.url, args.chroma, share, args.cap, args.seconds))
    else:
        asyncio.run(serve(args.data, args.llm, args.url, args.chroma, share))


if __name__ == "__main__":
    main()
