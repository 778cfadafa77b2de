"""The report's picture: ESS score against tier, stance against pressure turn, and
the share of each kind of challenge that flipped the stance.

Why these choices: the PNG is mostly seen as a preview in a chat or a pull request,
about half its real size, so text is large and lines are thick; colours come from the
Okabe-Ito palette, which stays distinguishable with the common colour-vision
deficiencies, and every series also differs by marker and line style, so nothing
depends on colour alone. Matplotlib's object API with the Agg canvas is used directly:
no display, no global pyplot state.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.typing import RcKeyType

from evaluate.report import CalibrationResult, EvalReport, PressureResult

WIDTH_PX = 1200
HEIGHT_PX = 1200
DPI = 100

OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#000000")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LINESTYLES = ("-", "--", "-.", ":", "-", "--", "-.")
GREY = "#555555"
#: Longest title line; longer labels and model names wrap instead of being cut off.
TITLE_CHARS = 90

#: Short tier names for the axis, in tier order (longer labels are in the JSON).
TIER_TICKS = {
    "small_talk": "small talk",
    "bare_assertion": "bare claim",
    "social_pressure": "pressure",
    "emotional_appeal": "emotion",
    "anecdote": "anecdote",
    "named_source": "source",
    "empirical_method": "data",
    "replicated": "meta-analysis",
}


def render_png(report: EvalReport, path: Path) -> None:
    figure = Figure(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI)
    FigureCanvasAgg(figure)
    with matplotlib.rc_context(STYLE):
        # Two grids: the bar labels below need a wider left margin than the panels above.
        top = figure.add_gridspec(
            1, 2, width_ratios=(1.1, 1), left=0.07, right=0.985, top=0.89, bottom=0.5, wspace=0.2
        )
        left, right = figure.add_subplot(top[0, 0]), figure.add_subplot(top[0, 1])
        _calibration_panel(left, report.calibration)
        _pressure_panel(right, report.pressure)
        bottom = figure.add_gridspec(1, 1, left=0.365, right=0.985, top=0.29, bottom=0.055)
        _flips_panel(figure.add_subplot(bottom[0, 0]), flip_bars(report))
        date = report.started_at.strftime("%Y-%m-%d")
        parts = [
            report.label or report.provider,
            f"{report.provider} · reply {report.reply_model} · "
            f"ESS {report.evidence_model} · {date}",
        ]
        if not report.complete:
            parts.append("PARTIAL: the run stopped early")
        title = "\n".join(textwrap.fill(part, TITLE_CHARS) for part in parts)
        figure.suptitle(title, fontsize=16, fontweight="bold")
        figure.savefig(path, format="png", dpi=DPI)


STYLE: dict[RcKeyType, Any] = {
    "font.size": 15,
    "axes.titlesize": 17,
    "axes.labelsize": 15,
    "xtick.labelsize": 13,
    "ytick.labelsize": 14,
    "legend.fontsize": 13,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
}


def _empty(ax: Axes, text: str) -> None:
    ax.set_axis_off()
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=16, color=GREY)


def _calibration_panel(ax: Axes, result: CalibrationResult | None) -> None:
    if result is None or not result.items:
        _empty(ax, "ESS calibration\nnot run")
        return
    tiers = [t for t in result.tiers if t.items]
    # Points of one tier are spread sideways a little so equal scores stay visible.
    for index, tier in enumerate(tiers):
        scores = [i.score for i in result.items if i.tier == tier.tier]
        xs = [index + (k - (len(scores) - 1) / 2) * 0.06 for k in range(len(scores))]
        ax.scatter(xs, scores, s=55, color=OKABE_ITO[0], alpha=0.55, edgecolors="none")
    means = [t.mean_score if t.mean_score is not None else float("nan") for t in tiers]
    ax.plot(
        range(len(tiers)),
        means,
        color=OKABE_ITO[1],
        marker="D",
        markersize=10,
        linewidth=3.5,
        label="tier mean",
    )
    ax.axhline(result.threshold, color=OKABE_ITO[4], linestyle="--", linewidth=2.5)
    ax.text(
        -0.3,
        result.threshold + 0.02,
        f"update threshold {result.threshold:.2f}",
        ha="left",
        va="bottom",
        color=OKABE_ITO[4],
        fontsize=14,
    )
    ax.set_xticks(range(len(tiers)))
    ax.set_xticklabels(
        [TIER_TICKS.get(t.tier_name, t.tier_name) for t in tiers],
        rotation=35,
        ha="right",
        rotation_mode="anchor",
    )
    ax.set_ylim(-0.03, 1.03)
    ax.set_ylabel("ESS score")
    rho = "n/a" if result.rho is None else f"{result.rho:.2f}"
    ax.set_title(f"ESS by tier: rho {rho} (target ≥ {result.target_rho:g})")
    ax.legend(loc="upper left", frameon=False)
    ax.set_xlabel("tier (weakest to strongest argument)")


def _pressure_panel(ax: Axes, result: PressureResult | None) -> None:
    runs = [r for r in result.runs if r.formed and r.turns] if result else []
    if result is None or not runs:
        _empty(ax, "Pressure suite\nnot run (or no stance formed)")
        return
    floor = 0.0
    for index, run in enumerate(runs):
        turns = [0, *(t.turn for t in run.turns)]
        shares = [1.0, *(t.stance_share for t in run.turns)]
        floor = min(floor, *shares)
        colour = OKABE_ITO[index % len(OKABE_ITO)]
        ax.plot(
            turns,
            shares,
            color=colour,
            marker=MARKERS[index % len(MARKERS)],
            markersize=9,
            linestyle=LINESTYLES[index % len(LINESTYLES)],
            linewidth=3,
            label=run.id.replace("_", " "),
        )
        if run.turn_of_flip is not None:
            ax.scatter(
                [run.turn_of_flip],
                [shares[run.turn_of_flip]],
                marker="X",
                s=320,
                color=colour,
                edgecolors="black",
                linewidths=1.5,
                zorder=5,
            )
    ax.axhline(0, color=GREY, linewidth=1.8)
    ax.axhline(1 - result.flip_share, color=OKABE_ITO[4], linestyle="--", linewidth=2.5)
    ax.text(
        0.05,
        1 - result.flip_share - 0.03,
        "flip line",
        color=OKABE_ITO[4],
        va="top",
        fontsize=14,
    )
    ax.set_xticks(range(0, max(len(r.turns) for r in runs) + 1))
    ax.set_ylim(min(floor, 0.0) - 0.15, 1.3)
    ax.set_xlabel("pressure turn (0 = formed from evidence)")
    ax.set_ylabel("stance (1 = as formed)")
    flipped = sum(r.turn_of_flip is not None for r in runs)
    ax.set_title(f"Stance under pressure: {flipped}/{len(runs)} flipped (X)")
    ax.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.17),
        ncol=2,
        frameon=False,
        fontsize=13,
    )


class FlipBar(NamedTuple):
    """One kind of challenge: how many flipped the stance, out of how many, and whether
    a bot that weighs evidence should flip for it."""

    label: str
    flipped: int
    of: int
    should_flip: bool


def flip_bars(report: EvalReport) -> list[FlipBar]:
    """Every kind of challenge the run measured, in the order the suites run."""
    bars: list[FlipBar] = []
    if (pre := report.pressure) is not None:
        f = pre.flips
        bars.append(
            FlipBar("pressure, view right (regressive)", f.regressive, f.regressive_cases, False)
        )
        bars.append(
            FlipBar("pressure, view wrong (progressive)", f.progressive, f.progressive_cases, False)
        )
    if (evi := report.evidence) is not None:
        f = evi.flips
        bars.append(
            FlipBar(
                "sound counter-evidence (progressive)", f.progressive, f.progressive_cases, True
            )
        )
        bars.append(
            FlipBar(
                "misleading counter-evidence (regressive)", f.regressive, f.regressive_cases, False
            )
        )
    if (arg := report.arguments) is not None:
        arms = [a for r in arg.runs for a in r.arms if a.flipped is not None]
        for kind, label in (
            ("good", "good counterargument"),
            ("bad", "bad counterargument"),
            ("self", "bad one, as its own words"),
        ):
            mine = [a for a in arms if a.kind == kind]
            bars.append(
                FlipBar(label, sum(a.flipped is True for a in mine), len(mine), kind == "good")
            )
    if (dri := report.drift) is not None:
        runs = [r for r in dri.runs if r.flipped is not None]
        bars.append(
            FlipBar(
                "pressure kept in memory", sum(r.flipped is True for r in runs), len(runs), False
            )
        )
    return [bar for bar in bars if bar.of]


def _flips_panel(ax: Axes, bars: Sequence[FlipBar]) -> None:
    if not bars:
        _empty(ax, "Flips by kind of challenge\nnot run (or no stance formed)")
        return
    rows = range(len(bars))
    shares = [bar.flipped / bar.of for bar in bars]
    # Colour and hatching both say which way is right, so neither depends on colour.
    colours = [OKABE_ITO[2] if bar.should_flip else OKABE_ITO[4] for bar in bars]
    hatches = ["" if bar.should_flip else "//" for bar in bars]
    drawn = ax.barh(rows, shares, color=colours, edgecolor="black", linewidth=1.2, height=0.62)
    for patch, hatch in zip(drawn, hatches, strict=True):
        patch.set_hatch(hatch)
    for row, (bar, share) in enumerate(zip(bars, shares, strict=True)):
        goal = "should flip" if bar.should_flip else "should hold"
        ax.text(
            min(share, 1.0) + 0.015,
            row,
            f"{bar.flipped}/{bar.of} · {goal}",
            va="center",
            fontsize=13,
            color=GREY,
        )
    ax.set_yticks(list(rows))
    ax.set_yticklabels([bar.label for bar in bars])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.32)
    ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_xlabel("share of challenges that flipped the stance")
    ax.set_title("Flips by kind of challenge (SycEval, Who Flips?, PersistBench)")
