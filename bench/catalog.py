"""Benchmarks of the whole bot against a loopback LLM of fixed latency: every figure by
name, and the command that runs them.

Run: `python3 scripts/bench.py` (or `.venv/bin/python -m bench`); `--help` lists
the figures by name and `--only 1,3m,5` runs some of them. Prints one line
per figure, each with the workload that produced it and the target it is held to.
Nothing here is a test: the figures depend on the machine and are for people to read.

Figures:
  1. time to reply ÷ one bare LLM round trip, 10,000 episodes stored (target ≤ 1.05)
  1s. the same with the state in PostgreSQL and the episodes on a Chroma server, both
     started here (see bench/scale.py)
  2. our own time per message with the LLM answering at once, 10,000 episodes
     (target p50 ≤ 25 ms, p99 ≤ 100 ms)
  3. capacity, 100 communities, LLM latency 200 ms, cap 32: 3a the bot's CPU time per
     answered message (reply and learning) with every community chatting, and the
     capacity it gives (cores ÷ CPU per message); 3b the reply time outside the model
     with messages arriving at half that capacity (see docs/performance.md);
     3m with SONALITY_CHROMA_MAX_OPEN=100, every active community's index open
     (what the default bound of 32 costs in CPU); 3h with 300 memories each to start
     with; 3k with 900 quiet communities known whose last writes wait in Chroma's
     write log; 3s the CPU per message
     over two bot processes on PostgreSQL and a Chroma server, the servers' beside
     it (see bench/scale.py)
  4. 1,000 known communities, 100 active: memory of the bot's process
     (PSS; target < 500 MB)
  4b. the same on PostgreSQL and a Chroma server: 10,000 known, 1,000 active across
     two bot processes; the bots' memory (PSS; target < 1 GB), the servers' beside it
     (see bench/scale.py)
  5. cost per message against the caching-honest fake, with the default models and
     with one model for everything (see bench/cost.py; targets ≤ 1.3× the bare reply
     call and ≤ 1,500 Sonnet-input-token equivalents)
  6. bytes on disk per 1,000 messages in one community, SQLite (file + WAL after a
     checkpoint) and Chroma, plain chat and after 75 topics were argued: the real
     engine at 1,000 messages, a fast path through the real stores at 1,000 and
     100,000 (see bench/storage.py; target: SQLite keeps < 1 MB per 1,000 chat
     messages for good, growth linear and independent of topics)
  7. forget one member with 1,000 of a community's 100,000 interactions: the whole
     forget-me in SQLite, replay included (see bench/forget.py; target < 10 s); 7b the
     event loop's worst stall during it and an old message's deletion (≤ 100 ms); 7c
     a member deleting the message they just sent (< 1 s); 7d a purge of 20 older
     messages at once (< 10 s); 7e a member deleting 10 older messages one at a time
     (the bot's CPU meanwhile ≤ half a core)
  8. time to first visible text ÷ the model's time to first token, streaming (≤ 1.1)
  9. `/sonality timeline` on 3,000 versions × 200 beliefs: one, cold (target ≤ 5 s);
     ten at once: the event loop's worst stall (≤ 100 ms) and another community's
     replies against idle (≤ 1.10×) (see bench/timeline.py)
  10. one member flooding long messages at list prices against a $1 daily limit: when
     the member share stops them and what is left for the others, with the share and
     without it (see bench/share.py)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench import figures
from bench.figures import Figure, FigureRun

# Each figure imports its own module when it runs, so `--help` and a mistyped name end
# in a second instead of after loading the whole bot (about 6 s on 2 cores).


def _figure_1(work: Path, args: argparse.Namespace) -> None:
    from bench.run import figure_reply_ratio

    url = args.chroma_url
    asyncio.run(figure_reply_ratio(work, args.episodes, args.latency, 20, chroma_url=url))
    asyncio.run(figure_reply_ratio(work, args.episodes, args.latency, 20, "openai", url))


def _figure_1s(work: Path, args: argparse.Namespace) -> None:
    from bench.scale import figure_scale_reply_ratio

    figure_scale_reply_ratio(work, args.episodes, args.latency, 20)


def _figure_2(work: Path, args: argparse.Namespace) -> None:
    from bench.run import figure_own_time

    asyncio.run(figure_own_time(work, args.episodes, args.messages))


def _capacity(max_open: int | None = None, history: int = 0, quiet: int = 0) -> FigureRun:
    """Figure 3 and its variants: 100 communities, LLM latency 200 ms, cap 32."""

    def run(work: Path, args: argparse.Namespace) -> None:
        from bench.run import figure_capacity

        asyncio.run(
            figure_capacity(
                work, 100, 0.2, 32, args.seconds, max_open, history=history, quiet=quiet
            )
        )

    return run


def _figure_3s(work: Path, args: argparse.Namespace) -> None:
    from bench.run import report
    from bench.scale import figure_scale_capacity

    figure_scale_capacity(work, 100, 0.2, 32, args.seconds, args.scale_processes, report)


def _figure_4(work: Path, args: argparse.Namespace) -> None:
    from bench.run import figure_memory

    figure_memory(work, args.known, args.active)


def _figure_4b(work: Path, args: argparse.Namespace) -> None:
    from bench.run import report
    from bench.scale import figure_scale_memory

    figure_scale_memory(work, args.scale_known, args.scale_active, args.scale_processes, report)


def _figure_5(work: Path, args: argparse.Namespace) -> None:
    from bench.run import figure_cost

    asyncio.run(figure_cost(work))


def _figure_6(work: Path, args: argparse.Namespace) -> None:
    from bench.run import report
    from bench.storage import figure_storage

    asyncio.run(figure_storage(work, report, fast=args.storage_messages))


def _figure_7(work: Path, args: argparse.Namespace) -> None:
    from bench.forget import figure_forget
    from bench.run import report

    asyncio.run(figure_forget(work, report, args.forget_messages))


def _figure_8(work: Path, args: argparse.Namespace) -> None:
    from bench.run import figure_stream_ratio

    asyncio.run(figure_stream_ratio(work, 20, 0.5, 50.0))


def _figure_9(work: Path, args: argparse.Namespace) -> None:
    """The timeline against another community's replies from a 50 ms loopback model."""
    from app.wiring import open_runtime
    from bench.run import llm_server, report, settings_for
    from bench.timeline import figure_timeline
    from bot.runtime import Runtime

    with llm_server(0.05) as url:

        def runtime_in(data: Path) -> contextlib.AbstractAsyncContextManager[Runtime]:
            return open_runtime(settings_for(data, url))

        asyncio.run(figure_timeline(work, report, runtime_in, args.timeline_versions))


def _figure_10(work: Path, args: argparse.Namespace) -> None:
    from bench.run import report
    from bench.share import figure_share

    asyncio.run(figure_share(work, report))


#: Every figure by the name `--only` takes, in report order (see the module docstring).
FIGURES: tuple[Figure, ...] = (
    Figure(
        "1",
        "reply time ÷ one bare LLM round trip, 10,000 episodes, both providers (≤ 1.05)",
        _figure_1,
    ),
    Figure(
        "1s",
        "figure 1 on the scale-out stack: state in PostgreSQL, episodes on a Chroma server "
        "(≤ 1.05)",
        _figure_1s,
    ),
    Figure(
        "2",
        "own time per message, the LLM answering at once (p50 ≤ 25 ms, p99 ≤ 100 ms)",
        _figure_2,
    ),
    Figure(
        "3",
        "capacity, 100 communities: bot CPU per answered message (3a), and reply time "
        "outside the model at half the capacity that gives (3b)",
        _capacity(),
    ),
    Figure(
        "3m",
        "figure 3 with SONALITY_CHROMA_MAX_OPEN=100, every active community's index "
        "kept open (what the default bound on open indexes costs in CPU)",
        _capacity(max_open=100),
    ),
    Figure(
        "3h",
        "figure 3 with 300 memories in each community to start with (a community after "
        "about 300 messages; figure 3's start with one)",
        _capacity(history=300),
    ),
    Figure(
        "3k",
        "figure 3 with 900 more communities known, each with 15 memories waiting in "
        "Chroma's write log (what a long-running bot's log holds)",
        _capacity(quiet=900),
    ),
    Figure(
        "3s",
        "figure 3a on the scale-out stack: 100 communities over 2 bot processes on "
        "PostgreSQL + a Chroma server, the servers' CPU per message beside the bots'",
        _figure_3s,
    ),
    Figure(
        "4",
        "memory of the bot, 1,000 communities known, 100 active (PSS < 500 MB)",
        _figure_4,
    ),
    Figure(
        "4b",
        "figure 4 on PostgreSQL + a Chroma server: 10,000 known, 1,000 active, 2 processes "
        "(bots < 1 GB)",
        _figure_4b,
    ),
    Figure(
        "5",
        "cost per message, several model setups, both providers (≤ 1.3×, ≤ 1,500)",
        _figure_5,
    ),
    Figure(
        "6",
        "bytes on disk per 1,000 messages, SQLite and Chroma (< 1 MB per 1,000 chat)",
        _figure_6,
    ),
    Figure(
        "7",
        "forget one member with 1,000 of a community's 100,000 interactions (< 10 s)",
        _figure_7,
    ),
    Figure(
        "8",
        "time to first visible text ÷ the model's time to first token, streaming (≤ 1.1)",
        _figure_8,
    ),
    Figure(
        "9",
        "/sonality timeline, 3,000 versions × 200 beliefs: ≤ 5 s; ten at once: loop stall "
        "≤ 100 ms, other replies ≤ 1.10× idle",
        _figure_9,
    ),
    Figure(
        "10",
        "one member flooding at list prices: stopped at their share, the rest left to others",
        _figure_10,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = figures.build_parser(" ".join(__doc__.split("\n\n")[0].split()), FIGURES)
    parser.add_argument(
        "--episodes",
        type=int,
        default=10_000,
        help="episodes stored for figures 1 and 2 (default %(default)s)",
    )
    parser.add_argument(
        "--latency",
        type=float,
        default=0.5,
        help="LLM latency in seconds for figure 1 (default %(default)s)",
    )
    parser.add_argument(
        "--messages", type=int, default=200, help="messages for figure 2 (default %(default)s)"
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=15.0,
        help="how long each of figure 3's workloads runs, in seconds (default %(default)s)",
    )
    parser.add_argument(
        "--known",
        type=int,
        default=1000,
        help="communities known for figure 4 (default %(default)s)",
    )
    parser.add_argument(
        "--storage-messages",
        type=int,
        default=100_000,
        help="messages in figure 6's fast path (default %(default)s)",
    )
    parser.add_argument(
        "--forget-messages",
        type=int,
        default=100_000,
        help="interactions in figure 7's community (default %(default)s)",
    )
    parser.add_argument(
        "--timeline-versions",
        type=int,
        default=3000,
        help="versions in figure 9's community (default %(default)s)",
    )
    parser.add_argument(
        "--active",
        type=int,
        default=100,
        help="communities active for figure 4 (default %(default)s)",
    )
    parser.add_argument(
        "--scale-known",
        type=int,
        default=10_000,
        help="communities known for figure 4b (default %(default)s)",
    )
    parser.add_argument(
        "--scale-active",
        type=int,
        default=1_000,
        help="communities active for figure 4b (default %(default)s)",
    )
    parser.add_argument(
        "--scale-processes",
        type=int,
        default=2,
        help="bot processes for figures 3s and 4b (default %(default)s)",
    )
    parser.add_argument(
        "--chroma-url",
        default=os.environ.get("CHROMA_URL") or None,
        metavar="URL",
        help="run figure 1 with its episodes on this Chroma server (default: $CHROMA_URL; "
        "unset: embedded Chroma); the other figures do not take one yet",
    )
    parser.add_argument("--phase", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
    # Settings would read CHROMA_URL from the environment for every figure; only the
    # figures that seed the server themselves may use one.
    os.environ.pop("CHROMA_URL", None)
    # Figures 1s, 3s and 4b start servers of their own and ignore the URL.
    on_server = [f.name for f in args.only if f.name not in ("1", "1s", "3s", "4b")]
    if args.chroma_url and on_server and not args.phase:
        parser.error(f"only figure 1 runs on a Chroma server so far, not {', '.join(on_server)}")

    if args.phase:
        from bench.run import measure_active, seed_known

        name, value = args.phase
        if name == "seed-known":
            asyncio.run(seed_known(args.data, int(value), per_community=5))
        else:
            asyncio.run(measure_active(args.data, int(value)))
        return

    print(f"# Sonality Bot benchmarks on {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="sonality-bench-") as tmp:
        work = Path(tmp)
        for figure in args.only:
            figure.run(work, args)


if __name__ == "__main__":
    main()
