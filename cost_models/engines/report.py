"""How well an engine profile predicts end-to-end runs: per GPU and TP, the TP speed-up error
and the whole-request error, held out by model.

Why these two numbers: the planner chooses TP degrees by comparing predicted times across TP, so
the speed-up of TP t over the lowest TP measured (same GPU, model, batch and lengths) is what
must be right; the whole-request error says whether absolute times (rollout length, the split
between rollout and training) are right. Both are reported three ways:

- ``cv``: leave-one-model-out: the profile's terms refitted on every other model, predicting the
  held-out model (a model the profile has never seen, which is what a user's model is);
- ``in-sample``: the profile as fitted on all rows;
- ``constants``: the cost model before profiles (1 ms + 5 us per sequence, tables' kernels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cost_models.engines import fit as F
from cost_models.engines.profile import TERMS, EngineProfile
from cost_models.engines.registry import constants_profile

WAYS = ("cv", "in-sample", "constants")


@dataclass(frozen=True)
class Cell:
    """One (GPU, TP) row of the report; errors in %, ``None`` where not defined (TP speed-up at
    the lowest TP measured)."""

    gpu: str
    tp: str
    rows: int
    speedup_rows: int
    speedup_err: dict[str, float | None]  # way -> median |predicted / measured speed-up - 1|
    mape: dict[str, float]  # way -> mean |predicted / measured latency - 1|
    ratio: dict[str, float]  # way -> median predicted / measured latency


def profile_predictions(feat: F.Features, profile: EngineProfile) -> np.ndarray:
    """``profile``'s predictions of the rows (the linear form the evaluator computes)."""
    return F.predict(feat, profile.kernel_scale, {t: getattr(profile, t) for t in TERMS})


def fitted_terms(profile: EngineProfile) -> tuple[tuple[str, ...], bool]:
    """The term set a profile was fitted with (``EngineProfile.fitted_terms``)."""
    return profile.fitted_terms


def predictions(feat: F.Features, profile: EngineProfile) -> dict[str, np.ndarray]:
    """Every row predicted each of the ``WAYS``."""
    terms, scale = fitted_terms(profile)
    return {
        "cv": F.lomo_predictions(feat, terms or ("step_s",), scale),
        "in-sample": profile_predictions(feat, profile),
        "constants": profile_predictions(feat, constants_profile()),
    }


def cells(feat: F.Features, preds: dict[str, np.ndarray]) -> list[Cell]:
    """Per GPU and TP, then per GPU over all TP, then everything."""
    rows = feat.rows
    sp = {w: F.speedup_errors(rows, p) for w, p in preds.items()}
    ratio = {w: p / feat.value for w, p in preds.items()}
    gpus = sorted({r.gpu for r in rows})
    keys: list[tuple[str, str, Any]] = []
    for g in gpus:
        for t in sorted({r.tp for r in rows if r.gpu == g}):
            keys.append((g, str(t), lambda r, g=g, t=t: r.gpu == g and r.tp == t))
        keys.append((g, "all", lambda r, g=g: r.gpu == g))
    keys.append(("all", "all", lambda r: True))
    out = []
    for g, t, sel in keys:
        mask = np.array([sel(r) for r in rows])
        spe: dict[str, float | None] = {}
        n_sp = 0
        for w in preds:
            errs = [abs(e) * 100.0 for r, _, _, e in sp[w] if sel(r)]
            n_sp = len(errs)
            spe[w] = float(np.median(errs)) if errs else None
        out.append(Cell(g, t, int(mask.sum()), n_sp, spe,
                        {w: float(np.mean(np.abs(ratio[w][mask] - 1.0)) * 100.0) for w in preds},
                        {w: float(np.median(ratio[w][mask])) for w in preds}))
    return out


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}%"


def to_markdown(name: str, cs: list[Cell]) -> str:
    """One table: a row per (GPU, TP)."""
    lines = [
        f"Engine profile `{name}`: TP speed-up error (median |pred/meas - 1| of the speed-up over the lowest TP measured) "
        "and whole-request MAPE; cv = leave-one-model-out.",
        "",
        "| GPU | TP | rows | speed-up rows | speed-up err cv | in-sample | constants | MAPE cv | in-sample | constants "
        "| pred/meas cv | constants |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in cs:
        lines.append(f"| {c.gpu} | {c.tp} | {c.rows} | {c.speedup_rows} | " + " | ".join(_pct(c.speedup_err[w]) for w in WAYS)
                     + " | " + " | ".join(_pct(c.mape[w]) for w in WAYS)
                     + f" | {c.ratio['cv']:.2f} | {c.ratio['constants']:.2f} |")
    return "\n".join(lines) + "\n"


def engine_report(name: str, root: Any = None) -> tuple[EngineProfile, list[Cell], F.Features]:
    """The report of a bundled profile on the data it was fitted on (rows screened as in the
    fit). The in-sample profile is the bundled file, so the report checks what ships."""
    from cost_models.engines.measurements import read_measurements
    from cost_models.engines.registry import BUNDLED_RECIPES, get_profile
    from cost_models.calibration.sources import find_calibration_root

    profile = get_profile(name)
    rec = BUNDLED_RECIPES[profile.name]
    rows, _ = read_measurements(find_calibration_root(root) / rec["csv"], only_engine=rec["only_engine"], skip_unknown=True)
    kept, _ = F.screen(rows)
    feat = F.features(kept)
    return profile, cells(feat, predictions(feat, profile)), feat
