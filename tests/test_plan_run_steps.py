"""``libra-sim plan --trace`` prices a plan as the trace's replay does: knowing the run's length.

``libra-sim replay`` tells the policy how many steps the run has (``PolicyOptions.run_steps``), and
an async pipeline not yet running is then priced as the run it starts over the steps left, fill
and drain included (``Planner.search``, ``async_run_s``). ``libra-sim plan`` priced every async
plan at its steady state, so on a short trace it could show a plan its replay's planner would not
pick: MCPMark's step 1 on 42 B200 with Llama-3.1-70B at K = 1 showed an 18:24 async split (469 s a
step at the steady state) where a planner told the run's four steps chose the time-shared plan
(session 39, on session 38's code, SIMULATED).
"""

from __future__ import annotations

from typing import Any

import pytest

from sim.cli import main
from sim.commands import plan as plan_cmd


class _Captured(Exception):
    pass


def _options_of(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> Any:
    """The ``SearchOptions`` ``libra-sim plan`` searches with (the search itself is not run)."""
    seen: dict[str, Any] = {}

    def capture(cluster: Any, opts: Any, history: Any, prompts: Any, ev: Any = None) -> Any:
        seen["opts"], seen["history"] = opts, history
        raise _Captured

    monkeypatch.setattr(plan_cmd, "_search", capture)
    with pytest.raises(_Captured):
        main(argv)
    return seen


def test_a_traces_plan_knows_the_runs_length_as_its_replay_does(monkeypatch: pytest.MonkeyPatch) -> None:
    base = ["plan", "--trace", "traces/swe-qwen3-14b.jsonl.gz", "--step", "3", "--gpus", "48", "--gpu", "a800", "--max-staleness", "1"]
    seen = _options_of(monkeypatch, base)
    assert seen["opts"].run_steps == 20 and len(seen["history"]) == 3  # the bundled SWE trace has 20 steps
    assert _options_of(monkeypatch, base + ["--run-steps", "200"])["opts"].run_steps == 200


def test_without_a_trace_the_plan_is_priced_at_the_steady_state(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _options_of(monkeypatch, ["plan", "--gpus", "16", "--gpu", "h100", "--model", "qwen3-8b", "--max-staleness", "1"])
    assert seen["opts"].run_steps is None


def test_a_run_of_no_steps_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpus", "16", "--gpu", "h100", "--model", "qwen3-8b", "--run-steps", "0"]) == 2
    assert "--run-steps must be >= 1" in capsys.readouterr().err
