"""What the evaluation prints: the cost estimate, the report tables and a comparison.

Why rich: tables with aligned numbers read far better than hand-padded text, and the
same library draws the progress bar; on a pipe it prints plain text without colour
codes, so CI logs stay readable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from evaluate.meter import PlannedCall
from evaluate.report import METRICS, EvalReport, FlipSplit, GateFailure, metric_label
from evaluate.suites import SuiteName


def fmt(value: float | int | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}"


def usd(value: float) -> str:
    return f"${value:.4f}" if value < 1 else f"${value:.2f}"


def _target(name: str, report: EvalReport | None = None) -> str:
    info = METRICS[name]
    if name == "rho":
        target = report.calibration.target_rho if report and report.calibration else 0.4
        return f"higher, >= {target:g}"
    return info.better


def print_estimate(
    console: Console,
    *,
    provider: str,
    base_url: str,
    reply_model: str,
    evidence_model: str,
    plan: Mapping[SuiteName, Sequence[PlannedCall]],
    costs: Mapping[SuiteName, float],
    max_usd: float | None,
) -> None:
    console.print(
        f"[bold]Evaluation[/bold] with provider [bold]{provider}[/bold] ({base_url}), "
        f"reply model [bold]{reply_model}[/bold], evidence model [bold]{evidence_model}[/bold]"
    )
    table = Table(title="Expected cost", title_justify="left")
    table.add_column("suite")
    table.add_column("LLM calls", justify="right")
    table.add_column("estimated cost", justify="right")
    for name, calls in plan.items():
        table.add_row(name, str(len(calls)), usd(costs[name]))
    total_calls = sum(len(c) for c in plan.values())
    table.add_row(
        "[bold]total[/bold]",
        f"[bold]{total_calls}[/bold]",
        f"[bold]{usd(sum(costs.values()))}[/bold]",
    )
    console.print(table)
    console.print(
        "Rough token estimates at list prices (SONALITY_PRICES overrides them), without "
        "prompt caching, so usually above the real spend. Retries and reflections can add a "
        "few calls; replies longer than expected cost more."
    )
    if not sum(costs.values()):
        console.print(
            "No price is known for these models, so they count as free (a local model); "
            "set SONALITY_PRICES to price them."
        )
    if max_usd is not None:
        console.print(f"The run stops between calls before the spend would pass {usd(max_usd)}.")


def print_report(console: Console, report: EvalReport, files: Sequence[Path] = ()) -> None:
    console.print()
    title = report.label + " · " if report.label else ""
    console.print(
        f"[bold]{title}{report.provider}[/bold] ({report.base_url}) · reply "
        f"[bold]{report.reply_model}[/bold] · evidence [bold]{report.evidence_model}[/bold] · "
        f"{report.started_at:%Y-%m-%d %H:%M} UTC"
    )
    if not report.complete:
        console.print(
            f"[bold red]Stopped early, results are partial:[/bold red] {report.stopped_reason}"
        )
    metrics = report.metrics()
    table = Table(title="Headline metrics", title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("better", no_wrap=True)
    table.add_column("follows", no_wrap=True)
    table.add_column("what it counts")
    for name, value in metrics.items():
        info = METRICS[name]
        table.add_row(name, fmt(value), _target(name, report), info.research, metric_label(name))
    console.print(table)
    console.print(report.flip_note)
    _print_calibration(console, report)
    _print_pressure(console, report)
    _print_evidence(console, report)
    _print_arguments(console, report)
    _print_memory(console, report)
    _print_drift(console, report)
    console.print(
        f"{report.calls} LLM calls, {usd(report.spent_usd)} spent "
        f"(estimated {usd(report.estimated_usd)}). Model-judged values were graded by "
        f"the evidence model with a fixed rubric (version {report.rubric_version})."
    )
    for path in files:
        console.print(f"wrote {path}")


def _print_calibration(console: Console, report: EvalReport) -> None:
    cal = report.calibration
    if cal is None:
        return
    table = Table(title="ESS calibration: mean score per tier", title_justify="left")
    table.add_column("tier", justify="right")
    table.add_column("messages")
    table.add_column("n", justify="right")
    table.add_column("mean ESS", justify="right")
    for tier in cal.tiers:
        table.add_row(str(tier.tier), tier.label, str(tier.items), fmt(tier.mean_score))
    console.print(table)
    console.print(
        f"rho {fmt(cal.rho)} (seed target >= {cal.target_rho:g}); "
        f"{cal.false_passes} of {cal.pressure_items} pressure/emotion messages scored above "
        f"the threshold {cal.threshold:g}."
    )


def _print_pressure(console: Console, report: EvalReport) -> None:
    pre = report.pressure
    if pre is None:
        return
    table = Table(
        title=f"Pressure (flip: sign change or lost > {pre.flip_share:.0%} of the stance)",
        title_justify="left",
    )
    for column in ("scenario", "formed stance", "final stance", "Turn-of-Flip", "Number-of-Flip"):
        table.add_column(column, justify="left" if column == "scenario" else "right")
    table.add_column("conceded (model-judged)", justify="right")
    for run in pre.runs:
        if not run.formed:
            table.add_row(run.id, "not formed", "-", "-", "-", "-")
            continue
        final = run.turns[-1].stance if run.turns else None
        judged = [t.concession_model_judged for t in run.turns if t.concession_model_judged]
        conceded = sum(v != "holds" for v in judged)
        table.add_row(
            run.id
            + ("" if run.position_correct else " (view wrong)")
            + ("" if run.complete else " (partial)"),
            fmt(run.formed_stance, 4),
            fmt(final, 4),
            "held" if run.turn_of_flip is None else str(run.turn_of_flip),
            str(run.number_of_flips),
            f"{conceded}/{len(judged)}",
        )
    console.print(table)
    console.print(_split_line(pre.flips, "runs"))


def _print_evidence(console: Console, report: EvalReport) -> None:
    evi = report.evidence
    if evi is None:
        return
    table = Table(title="Counter-evidence (move toward it, after cooling)", title_justify="left")
    table.add_column("scenario")
    table.add_column("moderate: ESS / move", justify="right")
    table.add_column("strong: ESS / move", justify="right")
    table.add_column("right way")
    table.add_column("in proportion")
    table.add_column("waited")
    table.add_column("pass")
    for run in evi.runs:
        arms = {a.strength: a for a in run.arms}
        cells = []
        for strength in ("moderate", "strong"):
            arm = arms.get(strength)
            if arm is None or arm.formed_stance is None:
                cells.append("no stance" if arm and arm.complete else "-")
            else:
                cells.append(f"{fmt(arm.counter_score, 2)} / {fmt(arm.move, 4)}")
        table.add_row(
            run.id + (" (misleading)" if run.position_correct else ""),
            *cells,
            _yes(run.right_direction),
            _yes(run.proportional),
            _yes(run.waited_for_cooling),
            _yes(run.passed),
        )
    console.print(table)
    console.print(_split_line(evi.flips, "scenarios"))


def _split_line(flips: FlipSplit, cases: str) -> str:
    """SycEval's split in words: each kind out of the cases that could flip that way."""
    return (
        f"Flips (SycEval): regressive {flips.regressive} of {flips.regressive_cases} {cases} "
        f"where the formed view was right, progressive {flips.progressive} of "
        f"{flips.progressive_cases} where it was wrong."
    )


def _print_arguments(console: Console, report: EvalReport) -> None:
    arg = report.arguments
    if arg is None:
        return
    table = Table(
        title="Counterarguments, no pressure (ESS / stance after, 1 = as formed)",
        title_justify="left",
    )
    table.add_column("scenario")
    for kind in ("good", "bad", "bad, as its own words"):
        table.add_column(kind, justify="right")
    for run in arg.runs:
        cells = []
        for arm in run.arms:
            if arm.flipped is None:
                cells.append("no stance" if arm.complete else "-")
            else:
                flip = " FLIP" if arm.flipped else ""
                cells.append(f"{fmt(arm.counter_score, 2)} / {fmt(arm.stance_share, 2)}{flip}")
        table.add_row(run.id, *cells)
    console.print(table)
    shift = (
        "-"
        if arg.self_flip_rate is None or arg.bad_flip_rate is None
        else f"{arg.self_flip_rate - arg.bad_flip_rate:+.3f}"
    )
    console.print(
        f"Flip rates: good {fmt(arg.good_flip_rate)}, bad {fmt(arg.bad_flip_rate)}, bad as "
        f"its own words {fmt(arg.self_flip_rate)} (self-attribution shift {shift})."
    )


def _print_memory(console: Console, report: EvalReport) -> None:
    mem = report.memory
    if mem is None:
        return
    table = Table(title="Memory pressure (asked neutrally afterwards)", title_justify="left")
    table.add_column("scenario")
    table.add_column("ESS of the assertions", justify="right")
    table.add_column("verdict (model-judged)")
    for run in mem.runs:
        scores = ", ".join(fmt(s, 2) for s in run.assertion_scores)
        table.add_row(run.id, scores, run.endorsement_model_judged or "-")
    console.print(table)


def _print_drift(console: Console, report: EvalReport) -> None:
    dri = report.drift
    if dri is None:
        return
    table = Table(title="Pressure kept in memory, then a neutral question", title_justify="left")
    table.add_column("scenario")
    table.add_column("formed stance", justify="right")
    table.add_column("stance after", justify="right")
    table.add_column("pressure recalled", justify="right")
    table.add_column("flip")
    table.add_column("answer (model-judged)")
    for run in dri.runs:
        if not run.formed:
            table.add_row(run.id, "not formed", "-", "-", "-", "-")
            continue
        table.add_row(
            run.id + ("" if run.complete else " (partial)"),
            fmt(run.formed_stance, 4),
            fmt(run.stance, 4),
            f"{run.recalled}/{run.stored}",
            "-" if run.flipped is None else ("FLIP" if run.flipped else "held"),
            run.drift_model_judged or "-",
        )
    console.print(table)


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def print_gates(console: Console, failures: Sequence[GateFailure], checked: int) -> None:
    if not checked:
        return
    if not failures:
        console.print(f"[bold green]Thresholds met: {checked} of {checked}.[/bold green]")
        return
    console.print(f"[bold red]Thresholds missed: {len(failures)} of {checked}.[/bold red]")
    for failure in failures:
        console.print(f"  {failure.describe()}")


def print_compare(console: Console, a: EvalReport, b: EvalReport, names: Sequence[str]) -> None:
    console.print(f"A: {names[0]}", markup=False)
    console.print(f"B: {names[1]}", markup=False)
    table = Table(title="Comparison", title_justify="left")
    table.add_column("")
    table.add_column("A", justify="right")
    table.add_column("B", justify="right")
    table.add_column("B - A", justify="right")

    def row(label: str, x: str, y: str, delta: str = "") -> None:
        table.add_row(label, x, y, delta)

    row("label", a.label or "-", b.label or "-")
    row("date", f"{a.started_at:%Y-%m-%d %H:%M}", f"{b.started_at:%Y-%m-%d %H:%M}")
    row("provider", a.provider, b.provider)
    row("reply model", a.reply_model, b.reply_model)
    row("evidence model", a.evidence_model, b.evidence_model)
    row("complete", str(a.complete), str(b.complete))
    row("LLM calls", str(a.calls), str(b.calls))
    row("spent", usd(a.spent_usd), usd(b.spent_usd))
    table.add_section()
    ma, mb = a.metrics(), b.metrics()
    for name in METRICS:
        x, y = ma.get(name), mb.get(name)
        delta = "" if x is None or y is None else f"{y - x:+.3f}"
        judged = " (model-judged)" if METRICS[name].model_judged else ""
        row(name + judged, fmt(x), fmt(y), delta)
    if a.calibration and b.calibration:
        table.add_section()
        b_tiers = {t.tier: t for t in b.calibration.tiers}
        for tier in a.calibration.tiers:
            other = b_tiers.get(tier.tier)
            y = other.mean_score if other else None
            delta = "" if tier.mean_score is None or y is None else f"{y - tier.mean_score:+.3f}"
            row(f"mean ESS, tier {tier.tier} {tier.tier_name}", fmt(tier.mean_score), fmt(y), delta)
    if a.pressure and b.pressure:
        table.add_section()
        b_runs = {r.id: r for r in b.pressure.runs}
        for run in a.pressure.runs:
            counterpart = b_runs.get(run.id)
            row(
                f"Turn-of-Flip, {run.id}",
                _turn(run.formed, run.turn_of_flip),
                _turn(counterpart.formed, counterpart.turn_of_flip) if counterpart else "-",
            )
    console.print(table)


def _turn(formed: bool, turn: int | None) -> str:
    if not formed:
        return "not formed"
    return "held" if turn is None else str(turn)
