"""The replay plots stay readable with many runs (issue 21, item 7): with ``--max-staleness 0,1``
(21 runs) throughput.png was 4,032 px wide with labels off the axes and both classes' bars under
one label, the reward legend (21 entries) ran off the figure, the step breakdown's tallest bar was
clipped, and the Gantt showed verl-colocated's instances without saying it was not Libra's.
Each check below inspects the drawn figure (its artists' pixel extents) as it is saved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sim.cli import main


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import matplotlib.figure

    from test_sim_replay_cli import _trace

    tmp = tmp_path_factory.mktemp("plots")
    seen: dict[str, Any] = {}
    real = matplotlib.figure.Figure.savefig

    def record(fig: Any, path: Any, *a: Any, **k: Any) -> Any:
        out = real(fig, path, *a, **k)  # draws the figure: extents below are the saved ones
        seen[Path(str(path)).name] = fig
        return out

    mp = pytest.MonkeyPatch()
    mp.setattr(matplotlib.figure.Figure, "savefig", record)
    try:
        tr = _trace(tmp / "t.jsonl", steps=2, n=16)
        assert main(["replay", str(tr), "--gpus", "16", "--compare", "--max-staleness", "0,1", "--out", str(tmp / "o"),
                     "--jobs", "2"]) == 0
    finally:
        mp.undo()
    return seen


def _runs_per_class() -> tuple[int, int]:
    """Runs a --compare at --max-staleness 0,1 draws: every registered policy that runs on-policy,
    then every policy (21 when the plots were fixed; 23 since libra-full joined the registry)."""
    from libra.policies import POLICY_NAMES, min_staleness

    return sum(min_staleness(p) == 0 for p in POLICY_NAMES), len(POLICY_NAMES)


def _renderer(fig: Any) -> Any:
    """The figure drawn again on an Agg canvas (the saved figure was closed): its renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _inside(inner: Any, outer: Any, slack: float = 1.0) -> bool:
    return inner.x0 >= outer.x0 - slack and inner.y0 >= outer.y0 - slack and inner.x1 <= outer.x1 + slack \
        and inner.y1 <= outer.y1 + slack


def test_throughput_is_readable_and_tells_the_classes_apart(figures: dict[str, Any]) -> None:
    fig = figures["throughput.png"]
    ax = fig.axes[0]
    width_px = fig.get_size_inches()[0] * 120
    assert width_px <= 1200, width_px
    labels = [t.get_text() for t in ax.get_yticklabels()]
    n0, n1 = _runs_per_class()
    assert len(labels) == n0 + n1 and len(set(labels)) == n0 + n1  # one bar per run, never two under one label
    assert sum(lab.endswith("K=0") for lab in labels) == n0 and sum(lab.endswith("K=1") for lab in labels) == n1
    r = _renderer(fig)
    for t in [*ax.get_yticklabels(), *ax.texts, ax.title]:
        assert _inside(t.get_window_extent(r), fig.bbox), t.get_text()
    for t in ax.texts:  # the values sit inside the axes, right of their bars
        assert _inside(t.get_window_extent(r), ax.get_window_extent(r)), t.get_text()
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["staleness class K=0", "staleness class K=1"]
    colours = {tuple(p.get_facecolor()) for p in ax.patches}
    assert len(colours) == 2


def test_reward_legend_fits_the_figure(figures: dict[str, Any]) -> None:
    fig = figures["reward_vs_time.png"]
    legend = (fig.legends or [fig.axes[0].get_legend()])[0]
    assert len(legend.get_texts()) == sum(_runs_per_class())
    r = _renderer(fig)
    assert _inside(legend.get_window_extent(r), fig.bbox)
    assert not legend.get_window_extent(r).overlaps(fig.axes[0].get_window_extent(r))  # beside the plot, not on it


def test_step_breakdown_shows_the_tallest_bar_whole(figures: dict[str, Any]) -> None:
    fig = figures["step_breakdown.png"]
    ax = fig.axes[0]
    ends = [p.get_x() + p.get_width() for p in ax.patches]
    assert max(ends) <= ax.get_xlim()[1]
    r = _renderer(fig)
    assert _inside(fig.legends[0].get_window_extent(r), fig.bbox)
    assert not fig.legends[0].get_window_extent(r).overlaps(ax.get_window_extent(r))


def test_gantt_is_libras_and_says_so(figures: dict[str, Any]) -> None:
    title = figures["gantt.png"].axes[0].get_title()
    assert "Gantt of libra (K=0)" in title and title.startswith("SIMULATED")
