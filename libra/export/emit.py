"""From a planner's search to a framework's configuration: fit the plan to what the framework can
say (``fit.py``), write it (the framework's emitter), validate it (``schema.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from libra.export import registry
from libra.export.fit import fit
from libra.export.schema import validate
from libra.export.target import Emitted
from libra.planner.search import Planner, SearchResult


def emit_plan(framework: str, planner: Planner, res: SearchResult, history: Sequence[Any], prompts: Any) -> tuple[Emitted, list[str]]:
    """(the configuration, the lines to tell the user: what changed, the emitted plan's predicted
    times). Raises ``AssertionError`` when an emitter writes a key its framework's schema lacks:
    a bug here, never the user's input."""
    mod = registry.get(framework)
    fitted = fit(planner, res, history, prompts, mod.CAPABILITIES, mod.trainers)
    out = mod.emit(fitted.export)
    errors = validate(out)
    if errors:
        raise AssertionError("; ".join(errors))
    p = fitted.export.plan
    lines = list(fitted.notes) + out.notes
    lines.append(f"emitted {framework} {out.layout}: {p.n_rollout_gpus if not p.colocated else 'all'} rollout GPUs "
                 f"({fitted.export.n_instances} x TP{fitted.export.rollout_tp}), {p.n_train_gpus} training GPUs "
                 f"({fitted.export.train_backend} TP{fitted.export.train.tp} PP{fitted.export.train.pp} DP{fitted.export.train.dp}"
                 f"{' EP' + str(fitted.export.train.ep) if fitted.export.train.ep > 1 else ''}, ZeRO-{fitted.export.train.zero_stage}); "
                 f"predicted SIMULATED: rollout {p.predicted_rollout_s:.1f} s, train {fitted.train_s:.1f} s, step {fitted.step_s:.1f} s")
    return out, lines
