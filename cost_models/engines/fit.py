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

Runs of ONE model at several TP degrees (what a user measures) cannot be held out by model.
Two things change then (``identifiability``, ``cv_groups``): a term is fitted only where its
count is not a combination of the counts of the terms already fitted (with one model the layer
count is fixed, so e.g. a cost per all-reduce and a cost per extra TP worker move together when
only one TP degree above 1 was measured); a term that is not identifiable keeps the value of a
base profile (``--base``, default the bundled default profile) and the profile's ``source`` says
which and why. Term choice is then cross-validated by configuration: each (GPU, batch,
lengths) is held out with all its TP degrees, so the held-out score still includes TP speed-ups.
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
#: A count column within this relative distance of the span of the columns already fitted is not
#: identifiable: its coefficient could move by any amount and the others absorb it (to 0.1 %).
COLLINEAR_TOL = 1e-3


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


@dataclass(frozen=True)
class Prior:
    """What a fit does not estimate: ``fixed`` terms (seconds, e.g. a base profile's values of the
    terms the rows cannot identify) and the kernel scale used when it is not fitted."""

    fixed: tuple[tuple[str, float], ...] = ()
    scale: float = 1.0

    @property
    def terms(self) -> dict[str, float]:
        return dict(self.fixed)


NO_PRIOR = Prior()


def solve(feat: Features, terms: Sequence[str], fit_scale: bool, prior: Prior = NO_PRIOR) -> tuple[float, dict[str, float]]:
    """Non-negative least squares in relative error: ``(kernel_scale, {term: seconds})``.
    Without ``fit_scale`` the kernel scale is ``prior.scale`` (1 unless a base profile's); the
    ``prior.fixed`` terms are subtracted from the measurements first and returned as given."""
    cols = [TERMS.index(t) for t in terms]
    y = feat.value
    offset = feat.counts @ np.array([prior.terms.get(t, 0.0) for t in TERMS])
    A = feat.counts[:, cols] / y[:, None]
    if fit_scale:
        A = np.column_stack([feat.kernel_s / y, A])
        target = 1.0 - offset / y
    else:
        target = 1.0 - (prior.scale * feat.kernel_s + offset) / y
    # column scaling keeps NNLS well conditioned (counts span 1 .. 1e5)
    norm = np.sqrt((A**2).sum(axis=0))
    norm[norm == 0] = 1.0
    x, _ = nnls(A / norm, target)
    x = x / norm
    scale = float(x[0]) if fit_scale else prior.scale
    coef = x[1:] if fit_scale else x
    return scale, {**prior.terms, **{t: float(c) for t, c in zip(terms, coef)}}


def predict(feat: Features, scale: float, coefs: dict[str, float]) -> np.ndarray:
    """The linear prediction of every row (equals the evaluator's; tested)."""
    out = scale * feat.kernel_s
    for t, c in coefs.items():
        out = out + c * feat.counts[:, TERMS.index(t)]
    return out


# ---- identifiability -------------------------------------------------------------------------
@dataclass(frozen=True)
class Identifiability:
    """Which terms (and whether the kernel scale) the rows can pin down, given the ones before
    them in priority order; ``why_not``: term -> the reason, in words."""

    terms: tuple[str, ...]
    scale: bool
    why_not: dict[str, str]


def _columns(feat: Features) -> dict[str, np.ndarray]:
    """Each estimable quantity's column in the fit's relative-error design (row / measurement)."""
    y = feat.value
    cols = {t: feat.counts[:, j] / y for j, t in enumerate(TERMS)}
    cols["kernel_scale"] = feat.kernel_s / y
    return cols


def _cause(term: str, feat: Features, partners: Sequence[str]) -> str:
    """Why ``term``'s count is tied to its ``partners`` in these rows, where the reason is one the
    engine model makes known (else the generic statement alone)."""
    tps = sorted({r.tp for r in feat.rows})
    layers = sorted({r.model.n_layers for r in feat.rows})
    tp_terms = {"per_worker_s", "per_collective_s"}
    if term == "per_collective_s" and tps[0] > 1 and "step_s" in partners:
        return (f"no row runs at TP 1 (TP {', '.join(map(str, tps))})"
                + (" and there is one layer count" if len(layers) == 1 else "")
                + ", so a cost per all-reduce, paid at every TP above 1, moves with the cost per iteration; measure TP 1 too")
    if term in tp_terms and tp_terms & set(partners) and len([t for t in tps if t > 1]) == 1:
        return (f"only one TP degree above 1 was measured (TP {', '.join(map(str, tps))})"
                + (" and one layer count" if len(layers) == 1 else "")
                + ", so a cost per extra TP worker and a cost per all-reduce rise together; measure a third TP degree")
    if term == "per_layer_s" and len({r.output_len for r in feat.rows if r.kind == "latency"}) <= 1:
        return ("every request has the same output length and no decode batch runs eagerly, so launch gaps paid once "
                "per request (the prefill) move with the per-iteration cost; vary output_len or measure batches above "
                "the CUDA-graph limit")
    batches = sorted({r.batch for r in feat.rows})
    if term == "per_seq_s" and len(batches) == 1:
        return (f"every row runs batch {batches[0]}, so a cost per sequence is a cost per iteration; "
                "measure two or more batch sizes")
    if term == "kernel_scale":
        return "the kernel time moves with the per-iteration terms in these rows; vary batch and lengths"
    return ""


def identifiability(feat: Features, priority: Sequence[str] = ()) -> Identifiability:
    """Greedy, in the order ``REQUIRED``, ``priority`` (a base profile's fitted terms), the
    kernel scale, then the rest of ``TERMS``: a quantity is identifiable when its column is farther
    than ``COLLINEAR_TOL`` (relative) from the span of those already accepted. The accepted set
    has full column rank, so each of its coefficients is unique given the others; a rejected
    term's coefficient is not (any value fits as well, the accepted ones absorbing it)."""
    cols = _columns(feat)
    order = list(dict.fromkeys([*REQUIRED, *[t for t in priority if t in TERMS], "kernel_scale", *TERMS]))
    accepted: list[str] = []
    why: dict[str, str] = {}
    basis = np.zeros((len(feat.rows), 0))
    for q in order:
        a = cols[q]
        na = float(np.linalg.norm(a))
        if na == 0.0:
            if q in ("per_worker_s", "per_collective_s"):
                why[q] = "never paid in these rows: every row runs at TP 1 (nothing to time across TP workers)"
            elif q == "per_layer_s":
                why[q] = "never paid in these rows: no row runs an eager iteration (tpot rows of CUDA-graph batches)"
            else:
                why[q] = "never paid in these rows"
            continue
        if basis.shape[1]:
            coef, *_ = np.linalg.lstsq(basis, a, rcond=None)
            resid = float(np.linalg.norm(a - basis @ coef)) / na
        else:
            coef, resid = np.zeros(0), 1.0
        if resid < COLLINEAR_TOL:
            contrib = np.abs(coef) * np.linalg.norm(basis, axis=0) / na
            partners = [accepted[i] for i in np.argsort(-contrib) if contrib[i] > 0.01]
            cause = _cause(q, feat, partners)
            why[q] = (f"in these rows it is paid in fixed proportion to {' and '.join(partners) or 'the fitted terms'}"
                      + (f": {cause}" if cause else ""))
            continue
        accepted.append(q)
        basis = np.column_stack([basis, a])
    return Identifiability(tuple(t for t in accepted if t in TERMS), "kernel_scale" in accepted, why)


def _sq_residual(feat: Features, terms: Sequence[str], fit_scale: bool, prior: Prior) -> float:
    """In-sample squared relative residual of the fit of ``terms`` under ``prior``."""
    scale, coefs = solve(feat, terms, fit_scale, prior)
    return float(np.sum((predict(feat, scale, coefs) / feat.value - 1.0) ** 2))


def prior_for(feat: Features, terms: Sequence[str], fit_scale: bool, base: Prior,
              base_name: str = "the base profile") -> tuple[Prior, dict[str, str]]:
    """The values the unidentified terms keep in a fit of ``terms``: ``base``'s, unless the rows
    cannot absorb them (the fitted terms would have to go negative to compensate, e.g. a base
    per-all-reduce cost larger than the whole TP overhead measured). Then the values closest to
    the base's that fit as well as zeros do (any such values fit equally: that is what not
    identifiable means): all scaled down together to the largest common factor that fits, then
    each raised back towards the base's value as far as it still fits. Also returns, per term
    lowered, why."""
    want = base.terms

    def fits(vals: dict[str, float]) -> bool:
        return _sq_residual(feat, terms, fit_scale, Prior(tuple(vals.items()), base.scale)) <= best + tol

    best = _sq_residual(feat, terms, fit_scale, Prior(tuple(dict.fromkeys(want, 0.0).items()), base.scale))
    tol = best * 1e-6 + 1e-12 * len(feat.rows)
    if not any(want.values()) or fits(want):
        return base, {}

    def largest(lo: float, hi: float, at: Any) -> float:
        """The largest x in [lo, hi] with ``fits(at(x))`` (``fits(at(lo))`` holds)."""
        for _ in range(40):
            mid = (lo + hi) / 2.0
            lo, hi = (mid, hi) if fits(at(mid)) else (lo, mid)
        return lo

    alpha = largest(0.0, 1.0, lambda a: {t: a * v for t, v in want.items()})
    fixed = {t: alpha * v for t, v in want.items()}
    for t in want:
        if want[t] > fixed[t]:
            fixed[t] = largest(fixed[t], want[t], lambda x, t=t: {**fixed, t: x})
    lowered = {t: (f"{base_name}'s {want[t] * 1e6:.3g} us does not fit these rows (the fitted terms would have to be "
                   f"negative), so the closest value that fits as well: {fixed[t] * 1e6:.3g} us")
               for t in want if fixed[t] < want[t] * (1 - 1e-9)}
    return Prior(tuple(fixed.items()), base.scale), lowered


def cv_groups(feat: Features) -> tuple[np.ndarray | None, str]:
    """The held-out unit of term selection and its name: the model when there are at least two;
    else each (GPU, batch, lengths, measured quantity) configuration with all its TP degrees;
    ``None`` when there is only one configuration (nothing to hold out)."""
    if len(np.unique(feat.models)) >= 2:
        return feat.models, "leave-one-model-out"
    conf = np.array([f"{r.gpu}|{r.batch}|{r.input_len}|{r.output_len}|{r.kind}" for r in feat.rows])
    if len(np.unique(conf)) >= 2:
        return conf, "leave-one-configuration-out"
    return None, "none (one model, one configuration)"


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


def lomo_predictions(feat: Features, terms: Sequence[str], fit_scale: bool, groups: np.ndarray | None = None,
                     prior: Prior = NO_PRIOR) -> np.ndarray:
    """Every row predicted by a fit on the rows of the other groups (default: the other models,
    leave-one-model-out; ``cv_groups`` gives configurations for one model); NaN everywhere when
    there is only one group (nothing to hold out)."""
    groups = feat.models if groups is None else groups
    pred = np.full(len(feat.rows), np.nan)
    if len(np.unique(groups)) < 2:
        return pred
    for m in np.unique(groups):
        held = groups == m
        scale, coefs = solve(feat.subset(~held), terms, fit_scale, prior)
        pred[held] = predict(feat.subset(held), scale, coefs)
    return pred


@dataclass(frozen=True)
class Candidate:
    terms: tuple[str, ...]
    fit_scale: bool
    cv: Score
    insample: Score
    prior: Prior = NO_PRIOR  # the unidentified terms' values this term set is fitted with (``prior_for``)


def candidates(feat: Features, optional: Sequence[str] | None = None, scales: Sequence[bool] = (False, True),
               groups: np.ndarray | None = None, prior: Prior = NO_PRIOR) -> list[Candidate]:
    """Every term set (``REQUIRED`` plus any subset of ``optional``, default every other term;
    with each of ``scales``: kernel scale fixed, fitted), scored held out by ``groups`` (default
    the models) and in-sample; best held-out objective first."""
    optional = [t for t in TERMS if t not in REQUIRED] if optional is None else [t for t in optional if t not in REQUIRED]
    g = feat.models if groups is None else groups
    if len(np.unique(g)) < 2:
        raise CostModelError("choosing terms by cross-validation needs at least 2 models or 2 configurations "
                             "(batch, lengths); measure more or pass --terms (and --kernel-scale fit|fixed)")
    out = []
    for k in range(len(optional) + 1):
        for extra in itertools.combinations(optional, k):
            terms = (*REQUIRED, *extra)
            for fit_scale in scales:
                pr = prior_for(feat, terms, fit_scale, prior)[0]
                cv = score(feat.rows, lomo_predictions(feat, terms, fit_scale, g, pr), feat.value)
                s, c = solve(feat, terms, fit_scale, pr)
                ins = score(feat.rows, predict(feat, s, c), feat.value)
                out.append(Candidate(terms, fit_scale, cv, ins, pr))
    # ties (a term fitted to 0 changes nothing) go to the smaller model
    return sorted(out, key=lambda c: (round(c.cv.objective, 6), len(c.terms) + c.fit_scale))


@dataclass(frozen=True)
class ProfileFit:
    """A fitted profile and the evidence for it: the chosen and ranked term sets, which terms the
    rows could identify, and the held-out unit of the cross-validation (``cv_by``)."""

    profile: EngineProfile
    chosen: Candidate
    ranked: list[Candidate]
    features: Features
    identified: Identifiability | None = None
    cv_by: str = "leave-one-model-out"


def measured_range(rows: Sequence[Measurement]) -> dict[str, Any]:
    """The TP degrees, batch sizes, GPUs and models a profile was fitted on: outside them its
    predictions are extrapolations (``EngineProfile.extrapolation``)."""
    return {"tp": sorted({int(r.tp) for r in rows}), "batch": [int(min(r.batch for r in rows)), int(max(r.batch for r in rows))],
            "gpus": sorted({r.gpu for r in rows})}


def _default_base() -> EngineProfile:
    from cost_models.engines.registry import DEFAULT_PROFILE, get_profile

    return get_profile(DEFAULT_PROFILE)


def fit_profile(rows: Sequence[Measurement], name: str, engine: str = "", description: str = "",
                source: dict[str, Any] | None = None, terms: Sequence[str] | None = None,
                fit_scale: bool | None = None, where: str = "measurements", base: EngineProfile | None = None) -> ProfileFit:
    """Fit ``name`` on ``rows``. Only terms the rows identify (``identifiability``) are fitted;
    the others keep ``base``'s values (default: the bundled default profile) and the source says
    why. Terms and the kernel scale are chosen by cross-validation (``cv_groups``: by model, or
    by configuration for one model) unless given (``terms``/``fit_scale``). ``source``
    (provenance) is extended with the rows used, the measured TP/batch range, the chosen,
    unidentified and fixed terms, and the in-sample and held-out residuals."""
    feat = features(rows, where=where)
    base = _default_base() if base is None else base
    ident = identifiability(feat, base.fitted_terms[0])
    prior = Prior(tuple((t, float(getattr(base, t))) for t in TERMS if t not in ident.terms),
                  float(base.kernel_scale) if not ident.scale else 1.0)
    groups, cv_by = cv_groups(feat)
    for t in [*(terms or ()), *(["kernel_scale"] if fit_scale else [])]:
        if t not in TERMS and t != "kernel_scale":
            raise CostModelError(f"unknown term {t!r}; valid: {', '.join(TERMS)}")
        if t in ident.why_not:
            raise CostModelError(f"{t} is not identifiable from these rows ({ident.why_not[t]}); leave it out of --terms "
                                 f"and it keeps {base.name}'s value")
    scales = [fit_scale] if fit_scale is not None else ([False, True] if ident.scale else [False])
    if terms is None and groups is not None:
        ranked = candidates(feat, ident.terms, scales, groups, prior)
    else:  # the terms given, or (nothing to hold out) every identifiable one; the kernel scale as given or identified
        t = tuple(terms) if terms is not None else ident.terms
        ranked = []
        for fs in (scales if groups is not None else [ident.scale if fit_scale is None else fit_scale]):
            pr = prior_for(feat, t, fs, prior)[0]
            cv = score(feat.rows, lomo_predictions(feat, t, fs, groups, pr), feat.value) if groups is not None \
                else Score(float("nan"), float("nan"), len(rows), 0)
            s, c = solve(feat, t, fs, pr)
            ranked.append(Candidate(t, fs, cv, score(feat.rows, predict(feat, s, c), feat.value), pr))
        ranked.sort(key=lambda c: (round(c.cv.objective, 6) if np.isfinite(c.cv.objective) else 0.0, c.fit_scale))
    pick = ranked[0]
    prior, lowered = prior_for(feat, pick.terms, pick.fit_scale, prior, base.name)
    scale, coefs = solve(feat, pick.terms, pick.fit_scale, prior)
    resid = predict(feat, scale, coefs) / feat.value - 1.0
    kept = {**prior.terms, "kernel_scale": prior.scale}
    src = dict(source or {})
    src.update({
        "rows": len(rows),
        "models": sorted(set(feat.models.tolist())),
        "gpus": sorted({r.gpu for r in rows}),
        "measured": measured_range(rows),
        "terms_fitted": list(pick.terms) + (["kernel_scale"] if pick.fit_scale else []),
        "term_selection": (f"{cv_by} over every subset of the identifiable terms (objective: MAPE + median TP speed-up error)"
                           if terms is None and groups is not None
                           else "given (--terms)" if terms is not None else "every identifiable term (nothing to hold out)"),
        "base_profile": base.name,
        "not_identifiable": {q: {"why": why + (f"; {lowered[q]}" if q in lowered else ""), "kept": round(float(kept[q]), 12),
                                 "from": base.name} for q, why in ident.why_not.items()},
        "insample": {"mape_pct": _r(pick.insample.mape), "speedup_err_median_pct": _r(pick.insample.speedup_err),
                     "residual_median_pct": round(float(np.median(resid)) * 100, 3),
                     "residual_p90_abs_pct": round(float(np.percentile(np.abs(resid), 90)) * 100, 3)},
        "cross_validation": cv_by,
        cv_by.split(" ")[0].replace("-", "_"): {"mape_pct": _r(pick.cv.mape), "speedup_err_median_pct": _r(pick.cv.speedup_err)},
    })
    prof = EngineProfile(name=name, kernel_scale=scale, engine=engine, description=description, source=src,
                         **{t: coefs.get(t, 0.0) for t in TERMS})
    return ProfileFit(prof, pick, ranked, feat, ident, cv_by)


def _r(x: float) -> float | None:
    """A score for the JSON provenance (None where undefined: one model, or no TP pairs)."""
    return None if not np.isfinite(x) else round(float(x), 3)


def fit_csv(path: Any, name: str, gpu: str | None = None, only_engine: str | None = None, skip_unknown: bool = False,
            engine: str = "", description: str = "", terms: Sequence[str] | None = None,
            fit_scale: bool | None = None, source_name: str | None = None, command: str = "",
            base: EngineProfile | None = None) -> ProfileFit:
    """Read, screen and fit one measurement CSV; the profile's ``source`` records the file
    (``source_name``, else its path), its sha256, the filter, the rows skipped and excluded, and
    ``command``; ``base`` is the profile whose values the terms the rows cannot identify keep."""
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
                       where=str(path), base=base)


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
                   command="libra-calibrate fit-engine --rebuild-bundled", base=ZERO)
