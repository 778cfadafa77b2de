"""`python -m bench`: the benchmarks (bench/catalog.py).

Why an entry point of its own: a worker process (`bot.offload`) started by
multiprocessing imports the parent's main module again unless it is a package's
`__main__`, as `python -m app` is; started as `-m bench.run`, every worker would first
import the whole benchmark (and so the whole bot). From here, a worker starts as it
does under the bot. It starts once more under the bot's glibc settings first, as
`python -m app` does, so the figures include their cost (sonality/memory/freed_memory.py).
"""

from sonality.memory.freed_memory import restart_scrubbed

if __name__ == "__main__":
    restart_scrubbed()
    from bench.catalog import main

    main()
