"""Fitting an engine profile on end-to-end measurements, and choosing its terms.

Why this shape: every term of ``EngineProfile`` enters a prediction linearly. A measured static
batch (one prefill, then ``output_len - 1`` decode steps) is predicted as::

    latency = kernel_scale * K + sum_term coef_term * count_term

where ``K`` is the operator tables' time for the whole request (the cost evaluator with a zero
profile: prefill + the closed-form sum of decode steps) and ``count_term`` is how often the term
is paid (iterations, iterations x batch, iterations x (tp - 1), iterations x all-reduces,
eager iterations x layers). So the fit is a non-negative least-squares problem, in RELATIVE error
(each row divided by its measurement: a 0.7 s request counts as much as a 70 s one).

Which terms a profile gets is decided by leave-one-model-out cross-validation, not by in-sample
fit: each candidate term set is fitted on all models but one and scored on that one
(whole-request MAPE and TP speed-up error, ``score``); the set with the best held-out score wins.
A term the data cannot pin down (e.g. launch gaps, paid once per request here) is left out
rather than fitted to noise.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import nnls

from cost_models.engines.measurements import Measurement
from cost_models.engines.profile import TERMS, EngineProfile
from cost_models.errors import CostModelError

#: The profile with no overhead and the tables' kernels: what ``K`` is computed with.
ZERO = EngineProfile(name="zero", description="kernels only (for fitting)")
#: Terms always in a candidate set: a per-iteration constant is the least an engine adds.
REQUIRED = ("step_s",)


@dataclass(frozen=True)
class Features:
    """Per measured row: the kernel time ``kernel_s`` (scale 1, no overhead) and how often each
    overhead term is paid (``counts[:, j]`` for ``TERMS[j]``), with the measured ``value``."""

    rows: tuple[Measurement, ...]
    kernel_s: np.ndarray
    counts: np.ndarray  # (n, len(TERMS))
    value: np.ndarray

    @property
    def models(self) -> np.ndarray:
        return np.array([r.model_name for r in self.rows])

    def subset(self, mask: np.ndarray) -> Features:
        idx = np.flatnonzero(mask)
        return Features(tuple(self.rows[i] for i in idx), self.kernel_s[idx], self.counts[idx], self.value[idx])


def _evaluator(gpu: str, model: Any, profile: EngineProfile) -> Any:
    from cost_models.evaluator import CostEvaluator

    return CostEvaluator(gpu, model, engine=profile)


def request_latency_s(ev: Any, tp: int, batch: int, input_len: int, output_len: int) -> float:
    """A static batch through ``ev``: prefill of ``batch x input_len``, then ``output_len - 1``
    decode steps whose KV grows from ``input_len + 1`` to ``input_len + output_len - 1`` tokens
    per sequence (closed form: decode is affine in the context)."""
    n_dec = output_len - 1
    t = float(ev.prefill_s(tp, input_len, 0, batch))
    if n_dec > 0:
        base, slope = ev.decode_coeffs(tp, batch)
        ctx_sum = batch * (n_dec * input_len + n_dec * (n_dec + 1) / 2.0)
        t += n_dec * base + slope * ctx_sum
    return t


def tpot_s(ev: Any, tp: int, batch: int, input_len: int, output_len: int) -> float:
    """Mean decode-step seconds of the same request (what ``tpot_ms`` measures)."""
    n_dec = output_len - 1
    base, slope = ev.decode_coeffs(tp, batch)
    return float(base + slope * batch * (input_len + (n_dec + 1) / 2.0))


def predict_row(ev: Any, r: Measurement) -> float:
    """What ``r`` measured, as ``ev`` predicts it."""
    if r.kind == "tpot":
        return tpot_s(ev, r.tp, r.batch, r.input_len, r.output_len)
    return request_latency_s(ev, r.tp, r.batch, r.input_len, r.output_len)


def term_counts(r: Measurement, cuda_graph_max_batch: int) -> np.ndarray:
    """How often each of ``TERMS`` is paid in the measured quantity of ``r``."""
    L = r.model.n_layers
    n_pre, n_dec = (0.0, 1.0) if r.kind == "tpot" else (1.0, float(r.output_len - 1))
    n = n_pre + n_dec
    ar = 2.0 * L if r.tp > 1 else 0.0
    eager = n_pre + (n_dec if r.batch > cuda_graph_max_batch else 0.0)
    return np.array([n, n * r.batch, n * (r.tp - 1), n * ar, eager * L])


def features(rows: Sequence[Measurement], cuda_graph_max_batch: int = ZERO.cuda_graph_max_batch,
             where: str = "measurements") -> Features:
    """Kernel times and term counts of every row (one zero-profile evaluator per GPU and model).
    A row the cost model cannot time (a TP degree that does not shard the model) is a one-line
    error naming ``where`` (the file), the line and the field."""
    evs: dict[tuple[str, str], Any] = {}
    kern = np.empty(len(rows))
    counts = np.empty((len(rows), len(TERMS)))
    for i, r in enumerate(rows):
        key = (r.gpu, r.model_name)
        if key not in evs:
            evs[key] = _evaluator(r.gpu, r.model, ZERO)
        try:
            kern[i] = predict_row(evs[key], r)
        except CostModelError as exc:
            field = "field 'tp': " if "tp=" in str(exc) else ""
            raise CostModelError(f"{where}: line {r.line}: {field}{exc}") from None
        counts[i] = term_counts(r, cuda_graph_max_batch)
    return Features(tuple(rows), kern, counts, np.array([r.value for r in rows]))


def solve(feat: Features, terms: Sequence[str], fit_scale: bool) -> tuple[float, dict[str, float]]:
    """Non-negative least squares in relative error: ``(kernel_scale, {term: seconds})``.
    Without ``fit_scale`` the kernel scale is 1 and the terms fit the remainder."""
    cols = [TERMS.index(t) for t in terms]
    y = feat.value
    A = feat.counts[:, cols] / y[:, None]
    if fit_scale:
        A = np.column_stack([feat.kernel_s / y, A])
        target = np.ones_like(y)
    else:
        target = 1.0 - feat.kernel_s / y
    # column scaling keeps NNLS well conditioned (counts span 1 .. 1e5)
    norm = np.sqrt((A**2).sum(axis=0))
    norm[norm == 0] = 1.0
    x, _ = nnls(A / norm, target)
    x = x / norm
    scale = float(x[0]) if fit_scale else 1.0
    coef = x[1:] if fit_scale else x
    return scale, {t: float(c) for t, c in zip(terms, coef)}


def predict(feat: Features, scale: float, coefs: dict[str, float]) -> np.ndarray:
    """The linear prediction of every row (equals the evaluator's; tested)."""
    out = scale * feat.kernel_s
    for t, c in coefs.items():
        out = out + c * feat.counts[:, TERMS.index(t)]
    return out


def physical_floor_s(r: Measurement) -> float:
    """A lower bound no engine can beat: every decode step streams at least the active weights'
    TP shard from HBM (``2 B/param / tp`` at the GPU's datasheet bandwidth)."""
    from cost_models.hardware import get_gpu

    n_dec = 1 if r.kind == "tpot" else r.output_len - 1
    return n_dec * r.model.params_active * 2.0 / r.tp / get_gpu(r.gpu).hbm_bw


def screen(rows: Sequence[Measurement]) -> tuple[list[Measurement], list[str]]:
    """Rows a fit may use, and why the others were excluded: a measurement faster than the
    weight-streaming floor (``physical_floor_s``) did not run what its row says (in the Argonne
    bench: TensorRT-LLM Qwen2 runs that stopped at an end-of-sequence token)."""
    kept, why = [], []
    for r in rows:
        floor = physical_floor_s(r)
        if r.value < floor:
            why.append(f"line {r.line}: {r.model_name} tp{r.tp} batch {r.batch} {r.input_len}/{r.output_len} "
                       f"measured {r.value:.3g} s < weight-streaming floor {floor:.3g} s")
        else:
            kept.append(r)
    return kept, why


# ---- scores ----------------------------------------------------------------------------------
def speedup_errors(rows: Sequence[Measurement], pred: np.ndarray) -> list[tuple[Measurement, float, float, float]]:
    """Per row with a lower-TP sibling (same GPU, model, batch, lengths, measured quantity):
    ``(row, measured speed-up, predicted speed-up, signed relative error)`` against the lowest TP
    measured for that configuration."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault((r.gpu, r.model_name, r.batch, r.input_len, r.output_len, r.kind, r.engine), []).append(i)
    out = []
    for idx in groups.values():
        lo = min(idx, key=lambda i: rows[i].tp)
        for i in idx:
            if rows[i].tp == rows[lo].tp:
                continue
            meas = rows[lo].value / rows[i].value
            p = pred[lo] / pred[i]
            out.append((rows[i], meas, p, p / meas - 1.0))
    return out


@dataclass(frozen=True)
class Score:
    """Whole-request MAPE (%) and median absolute TP speed-up error (%) of a set of predictions."""

    mape: float
    speedup_err: float
    n: int
    n_speedup: int

    @property
    def objective(self) -> float:
        """What term selection minimises: both errors count the same (a data set without TP
        pairs has no speed-up error: MAPE alone)."""
        return self.mape + (self.speedup_err if np.isfinite(self.speedup_err) else 0.0)


def score(rows: Sequence[Measurement], pred: np.ndarray, value: np.ndarray) -> Score:
    ape = np.abs(pred / value - 1.0) * 100.0
    sp = [abs(e) * 100.0 for *_, e in speedup_errors(rows, pred)]
    return Score(float(np.mean(ape)), float(np.median(sp)) if sp else float("nan"), len(rows), len(sp))


def lomo_predictions(feat: Features, terms: Sequence[str], fit_scale: bool) -> np.ndarray:
    """Every row predicted by a fit on the other models' rows (leave-one-model-out); NaN
    everywhere when there is only one model (nothing to hold out)."""
    models = feat.models
    pred = np.full(len(feat.rows), np.nan)
    if len(np.unique(models)) < 2:
        return pred
    for m in np.unique(models):
        held = models == m
        scale, coefs = solve(feat.subset(~held), terms, fit_scale)
        pred[held] = predict(feat.subset(held), scale, coefs)
    return pred


@dataclass(frozen=True)
class Candidate:
    terms: tuple[str, ...]
    fit_scale: bool
    cv: Score
    insample: Score


def candidates(feat: Features) -> list[Candidate]:
    """Every term set (``REQUIRED`` plus any subset of the rest, with and without a fitted kernel
    scale), scored by leave-one-model-out and in-sample; best held-out objective first."""
    optional = [t for t in TERMS if t not in REQUIRED]
    if len(np.unique(feat.models)) < 2:
        raise CostModelError("choosing terms by leave-one-model-out needs measurements of at least 2 models; "
                             "measure another model or pass --terms (and --kernel-scale fit|fixed)")
    out = []
    for k in range(len(optional) + 1):
        for extra in itertools.combinations(optional, k):
            terms = (*REQUIRED, *extra)
            for fit_scale in (False, True):
                cv = score(feat.rows, lomo_predictions(feat, terms, fit_scale), feat.value)
                s, c = solve(feat, terms, fit_scale)
                ins = score(feat.rows, predict(feat, s, c), feat.value)
                out.append(Candidate(terms, fit_scale, cv, ins))
    # ties (a term fitted to 0 changes nothing) go to the smaller model
    return sorted(out, key=lambda c: (round(c.cv.objective, 6), len(c.terms) + c.fit_scale))


@dataclass(frozen=True)
class ProfileFit:
    """A fitted profile and the evidence for it."""

    profile: EngineProfile
    chosen: Candidate
    ranked: list[Candidate]
    features: Features


def fit_profile(rows: Sequence[Measurement], name: str, engine: str = "", description: str = "",
                source: dict[str, Any] | None = None, terms: Sequence[str] | None = None,
                fit_scale: bool | None = None, where: str = "measurements") -> ProfileFit:
    """Fit ``name`` on ``rows``. Terms and the kernel scale are chosen by leave-one-model-out
    unless given (``terms``/``fit_scale``). ``source`` (provenance) is extended with the rows
    used, the chosen terms and the in-sample and held-out residuals."""
    feat = features(rows, where=where)
    if terms is None or fit_scale is None:
        ranked = candidates(feat)
        pick = [c for c in ranked if (terms is None or c.terms == tuple(terms))
                and (fit_scale is None or c.fit_scale == fit_scale)][0]
    else:
        t = tuple(terms)
        bad = [x for x in t if x not in TERMS]
        if bad:
            raise CostModelError(f"unknown term {bad[0]!r}; valid: {', '.join(TERMS)}")
        cv = score(feat.rows, lomo_predictions(feat, t, fit_scale), feat.value)
        s, c = solve(feat, t, fit_scale)
        pick = Candidate(t, fit_scale, cv, score(feat.rows, predict(feat, s, c), feat.value))
        ranked = [pick]
    scale, coefs = solve(feat, pick.terms, pick.fit_scale)
    resid = predict(feat, scale, coefs) / feat.value - 1.0
    src = dict(source or {})
    src.update({
        "rows": len(rows),
        "models": sorted(set(feat.models.tolist())),
        "gpus": sorted({r.gpu for r in rows}),
        "terms_fitted": list(pick.terms) + (["kernel_scale"] if pick.fit_scale else []),
        "term_selection": "leave-one-model-out over every term subset (objective: MAPE + median TP speed-up error)",
        "insample": {"mape_pct": _r(pick.insample.mape), "speedup_err_median_pct": _r(pick.insample.speedup_err),
                     "residual_median_pct": round(float(np.median(resid)) * 100, 3),
                     "residual_p90_abs_pct": round(float(np.percentile(np.abs(resid), 90)) * 100, 3)},
        "leave_one_model_out": {"mape_pct": _r(pick.cv.mape), "speedup_err_median_pct": _r(pick.cv.speedup_err)},
    })
    prof = EngineProfile(name=name, kernel_scale=scale, engine=engine, description=description, source=src,
                         **{t: coefs.get(t, 0.0) for t in TERMS})
    return ProfileFit(prof, pick, ranked, feat)


def _r(x: float) -> float | None:
    """A score for the JSON provenance (None where undefined: one model, or no TP pairs)."""
    return None if not np.isfinite(x) else round(float(x), 3)


def fit_csv(path: Any, name: str, gpu: str | None = None, only_engine: str | None = None, skip_unknown: bool = False,
            engine: str = "", description: str = "", terms: Sequence[str] | None = None,
            fit_scale: bool | None = None, source_name: str | None = None, command: str = "") -> ProfileFit:
    """Read, screen and fit one measurement CSV; the profile's ``source`` records the file
    (``source_name``, else its path), its sha256, the filter, the rows skipped and excluded, and
    ``command``."""
    from pathlib import Path

    from cost_models.engines.measurements import read_measurements, sha256

    rows, skipped = read_measurements(path, gpu=gpu, only_engine=only_engine, skip_unknown=skip_unknown)
    kept, excluded = screen(rows)
    if not kept:
        raise CostModelError(f"{path}: every row is below the weight-streaming floor; nothing to fit")
    source = {
        "data": source_name or str(Path(path)),
        "sha256": sha256(path),
        "only_engine": only_engine,
        "rows_skipped": len(skipped),
        "skipped_why": sorted({s.split(": ", 1)[1] for s in skipped}),
        "rows_excluded": excluded,
        "command": command,
    }
    return fit_profile(kept, name, engine=engine, description=description, source=source, terms=terms, fit_scale=fit_scale,
                       where=str(path))


def fit_bundled(name: str, root: Any = None) -> ProfileFit:
    """Refit the bundled profile ``name`` from its recipe (``registry.BUNDLED_RECIPES``) on the
    measured data under the calibration root (``find_calibration_root``)."""
    from cost_models.calibration.sources import find_calibration_root
    from cost_models.engines.registry import BUNDLED_RECIPES

    if name not in BUNDLED_RECIPES:
        raise CostModelError(f"no recipe for {name!r}; bundled recipes: {', '.join(sorted(BUNDLED_RECIPES))}")
    rec = BUNDLED_RECIPES[name]
    path = find_calibration_root(root) / rec["csv"]
    return fit_csv(path, name, only_engine=rec["only_engine"], skip_unknown=True, engine=rec["engine"],
                   description=rec["description"], source_name=f"cost_models/data/measured/{rec['csv']}",
                   command="libra-calibrate fit-engine --rebuild-bundled")
