"""The shared generative model: trajectories of one workload, simulated turn by turn, vectorized.

All trajectories of a chunk of steps advance together, one turn per loop iteration, so the cost
is O(max_turns) NumPy calls per chunk, not per trajectory (1M trajectories take seconds).

The model, per trajectory ``i`` of prompt ``p`` at step ``s``:

- prompt ``p`` has a latent difficulty ``z_p ~ N(0, 1)`` and a fixed prompt length; the GRPO
  samples of a prompt share both, and their latents are correlated through ``z_p``:
  persistence ``v_i = c z_p + sqrt(1-c^2) e_i`` (``c = group_corr``) and verbosity
  ``u_i = c' v_i + sqrt(1-c'^2) e'_i`` (``c' = gen_persistence_corr``, so trajectories with more
  turns also generate more per turn: tool-call count grows with sequence length);
- drift factor ``f_s = max(0.1, 1 + drift * s)`` scales generation lengths, and ``f_s^share``
  the expected turns;
- turn-count scale ``L_i = turns_median * exp(turns_sigma v_i) * f_s^share``; turn ``k`` (from
  0) ends the trajectory (no tool call, finish ``stop``) with the discrete Weibull hazard
  ``1 - exp(-(((k+1)/L_i)^b - (k/L_i)^b))``, ``b = turns_shape`` (times ``first_hazard_mult`` at
  turn 0): a lognormal mixture of Weibulls, heavy-tailed (``b = 1``: geometric, mean ``L_i``);
- turn generation ``~ gen_median exp(gen_sigma_traj u_i) f_s * lognormal(gen_sigma_turn) *
  Pareto tail``, times ``gen_first_mult`` on turn 0;
- a tool call fails (``error``) with probability ``sigmoid(error_logit + error_difficulty_coef
  z_p + error_streak [last call failed])``, times out per the latency model;
- CAUSAL error effect: a failure memory ``m`` (``m <- error_memory * m + [call failed]`` after
  every call, failed = ``error`` or ``timeout``) multiplies the stop hazard by
  ``exp(-error_effect * m)``: the agent keeps working to fix what broke, for a few turns; the
  generation right after a failure is multiplied by ``exp(error_gen_share * error_effect)``.
  With ``error_effect = 0`` an outcome changes nothing that follows (only the shared
  difficulty links them);
- caps: a generation that reaches ``max_context`` is cut there (no tool call, finish
  ``length``); a tool return that would pass it is truncated, the call still runs and the
  trajectory ends (finish ``length``); a trajectory still calling a tool at turn ``max_turns``
  ends after that call (finish ``tool_limit``);
- reward: 1 with probability ``sigmoid(reward_base_logit + reward_learn_per_step s -
  reward_difficulty_coef z_p - reward_turns_coef log(turns / expected turns at s) -
  reward_error_coef * failed-call fraction)`` for a ``stop`` finish, else 0.

Only the trajectory's own past drives each turn, so a policy reading the trace in order sees
exactly what a real system would.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from libra.errors import UserError
from libra.trace.columnar import StepArrays
from libra.trace.records import FINISHES, OUTCOMES, Trajectory, Turn
from libra.trace.workload.distributions import lognormal, pareto_tail_mult, round_tokens, sigmoid
from libra.trace.workload.params import WorkloadParams

#: Trajectories simulated together at most (bounds memory; a whole number of steps per chunk).
CHUNK_TRAJECTORIES = 262_144
#: Tool latencies are written with millisecond resolution (the trace stays small and exact).
LATENCY_DECIMALS = 3

_OK, _ERROR, _TIMEOUT = (OUTCOMES.index(o) for o in ("ok", "error", "timeout"))
_STOP, _LENGTH, _TOOL_LIMIT = (FINISHES.index(f) for f in ("stop", "length", "tool_limit"))


@dataclass(frozen=True)
class RunShape:
    """The size of a generated trace: which steps, how many trajectories per step and per prompt."""

    steps: int
    batch: int
    group_size: int
    seed: int
    first_step: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "group_size"):
            if int(getattr(self, name)) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.batch % self.group_size:
            raise UserError(f"--batch ({self.batch}) must be a multiple of --group-size ({self.group_size}): "
                            "a step holds whole prompt groups")
        if self.seed < 0:
            raise UserError(f"--seed must be >= 0, got {self.seed}")
        if self.first_step < 0:
            raise UserError(f"first step must be >= 0, got {self.first_step}")

    @property
    def prompts_per_step(self) -> int:
        """GRPO prompts per step (``batch / group_size``)."""
        return self.batch // self.group_size


def make_rng(seed: int, workload: str) -> np.random.Generator:
    """The generator of one trace: PCG64 seeded from the user's seed and the workload name."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(workload.encode())])))


def _prompt_schedule(rng: np.random.Generator, n_prompts: int, shape: RunShape) -> np.ndarray:
    """Prompt ids per step, int64 [steps, prompts_per_step]: epochs of random permutations.

    A step never holds a prompt twice: when the current epoch has fewer prompts left than a step
    needs, the rest of it is skipped and a new epoch starts.
    """
    per = shape.prompts_per_step
    out = np.empty((shape.steps, per), np.int64)
    perm = rng.permutation(n_prompts)
    pos = 0
    for s in range(shape.steps):
        if pos + per > n_prompts:
            perm, pos = rng.permutation(n_prompts), 0
        out[s] = perm[pos:pos + per]
        pos += per
    return out


def simulate(params: WorkloadParams, shape: RunShape) -> Iterator[StepArrays]:
    """Generate the trace's steps in order, each as ``StepArrays`` (the fast, columnar path)."""
    rng = make_rng(shape.seed, params.workload)
    n_prompts = max(params.dataset_prompts, shape.prompts_per_step)
    difficulty = rng.standard_normal(n_prompts)
    prompt_tokens = round_tokens(
        lognormal(rng, params.prompt_median * np.exp(params.prompt_difficulty_coef * difficulty),
                  params.prompt_sigma, n_prompts),
        params.prompt_min, params.prompt_max)
    schedule = _prompt_schedule(rng, n_prompts, shape)
    steps_per_chunk = max(1, CHUNK_TRAJECTORIES // shape.batch)
    for c0 in range(0, shape.steps, steps_per_chunk):
        c1 = min(shape.steps, c0 + steps_per_chunk)
        prompts = np.repeat(schedule[c0:c1], shape.group_size, axis=1).reshape(-1)
        steps = np.repeat(np.arange(c0, c1, dtype=np.int64) + shape.first_step, shape.batch)
        yield from _simulate_chunk(rng, params, shape, steps, prompts, difficulty, prompt_tokens)


def _simulate_chunk(rng: np.random.Generator, p: WorkloadParams, shape: RunShape, steps: np.ndarray,
                    prompts: np.ndarray, difficulty: np.ndarray, prompt_tokens_of: np.ndarray) -> Iterator[StepArrays]:
    n = len(steps)
    z = difficulty[prompts]
    ptok = prompt_tokens_of[prompts]
    f = np.maximum(0.1, 1.0 + p.drift * steps)
    gc, vc = p.group_corr, p.gen_persistence_corr
    v = gc * z + np.sqrt(1.0 - gc * gc) * rng.standard_normal(n)
    u = vc * v + np.sqrt(1.0 - vc * vc) * rng.standard_normal(n)
    expected_turns_med = p.turns_median * f ** p.turn_drift_share
    scale = expected_turns_med * np.exp(p.turns_sigma * v)
    gen_scale = p.gen_median * np.exp(p.gen_sigma_traj * u) * f
    err_base = p.error_logit + p.error_difficulty_coef * z
    latency_model = p.latency

    ctx = ptok.astype(np.int64).copy()
    n_turns = np.zeros(n, np.int64)
    n_calls = np.zeros(n, np.int64)
    n_failed = np.zeros(n, np.int64)
    prev_failed = np.zeros(n, bool)
    memory = np.zeros(n)
    finish = np.full(n, _STOP, np.int8)
    rows: list[tuple[np.ndarray, ...]] = []
    act = np.arange(n)
    gen_boost = np.exp(p.error_gen_share * p.error_effect)
    for k in range(p.max_turns):
        m = len(act)
        if m == 0:
            break
        pf = prev_failed[act]
        g = gen_scale[act] * np.exp(p.gen_sigma_turn * rng.standard_normal(m))
        g *= pareto_tail_mult(rng, p.gen_tail_prob, p.gen_tail_alpha, m)
        if k == 0:
            g *= p.gen_first_mult
        g[pf] *= gen_boost
        gen = round_tokens(g, 1, p.gen_max_per_turn)
        room = p.max_context - ctx[act]
        cut = gen >= room
        gen[cut] = room[cut]
        lam = scale[act]
        b = p.turns_shape
        h = -np.expm1(-(((k + 1) / lam) ** b - (k / lam) ** b))
        if k == 0:
            h *= p.first_hazard_mult
        if p.error_effect:
            h = h * np.exp(-p.error_effect * memory[act])
        stop = ~cut & (rng.random(m) < h)
        call = ~cut & ~stop

        lat = np.full(m, np.nan)
        ttok = np.zeros(m, np.int64)
        outcome = np.full(m, -1, np.int8)
        ci = np.flatnonzero(call)
        mc = len(ci)
        lat_c, timed_out = latency_model.sample(rng, mc)
        failed = ~timed_out & (rng.random(mc) < sigmoid(err_base[act[ci]] + p.error_streak * pf[ci]))
        out_c = np.where(timed_out, _TIMEOUT, np.where(failed, _ERROR, _OK)).astype(np.int8)
        tt = lognormal(rng, p.tool_tokens_median * np.where(failed, p.error_tokens_mult, 1.0),
                       p.tool_tokens_sigma, mc)
        tt = round_tokens(tt, 1, p.tool_tokens_max)
        tt[timed_out] = p.timeout_tokens
        over_c = ctx[act[ci]] + gen[ci] + tt >= p.max_context
        tt[over_c] = (p.max_context - ctx[act[ci]] - gen[ci])[over_c]
        lat[ci] = np.round(lat_c, LATENCY_DECIMALS)
        ttok[ci] = tt
        outcome[ci] = out_c

        rows.append((act, np.full(m, k, np.int64), gen, ttok, lat, call, outcome))
        ctx[act] += gen + ttok
        n_turns[act] += 1
        n_calls[act[ci]] += 1
        n_failed[act[ci]] += out_c != _OK
        prev_failed[act[ci]] = out_c != _OK
        memory[act[ci]] = p.error_memory * memory[act[ci]] + (out_c != _OK)

        over = np.zeros(m, bool)
        over[ci] = over_c
        finish[act[cut | over]] = _LENGTH
        # stop keeps the default finish; a call at the last allowed turn ends on the step limit
        cont = call & ~over
        if k == p.max_turns - 1:
            finish[act[cont]] = _TOOL_LIMIT
        act = act[cont]

    traj = np.concatenate([r[0] for r in rows])
    order = np.argsort(traj, kind="stable")
    traj = traj[order]
    gen_all = np.concatenate([r[2] for r in rows])[order]
    ttok_all = np.concatenate([r[3] for r in rows])[order]
    lat_all = np.concatenate([r[4] for r in rows])[order]
    tool_all = np.where(np.concatenate([r[5] for r in rows])[order], 0, -1).astype(np.int16)
    out_all = np.concatenate([r[6] for r in rows])[order]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(n_turns, out=offsets[1:])

    fail_frac = n_failed / np.maximum(1, n_calls)
    logit = (p.reward_base_logit + p.reward_learn_per_step * steps - p.reward_difficulty_coef * z
             - p.reward_turns_coef * np.log(n_turns / expected_turns_med) - p.reward_error_coef * fail_frac)
    success = (rng.random(n) < sigmoid(logit)) & (finish == _STOP)
    reward = success.astype(np.float64)

    sample = np.tile(np.arange(shape.group_size), n // shape.group_size)
    bounds = np.flatnonzero(np.diff(steps)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, n]):
        lo, hi = int(lo), int(hi)
        t0, t1 = int(offsets[lo]), int(offsets[hi])
        s = int(steps[lo])
        yield StepArrays(
            step=s,
            ids=tuple(f"s{s}-p{q}-r{r}" for q, r in zip(prompts[lo:hi].tolist(), sample[lo:hi].tolist())),
            groups=tuple(f"p{q}" for q in prompts[lo:hi].tolist()),
            prompt_tokens=ptok[lo:hi].astype(np.int64),
            turn_offsets=offsets[lo:hi + 1] - t0,
            gen_tokens=gen_all[t0:t1],
            tool_tokens=ttok_all[t0:t1],
            tool_latency_s=lat_all[t0:t1],
            tool_code=tool_all[t0:t1],
            outcome_code=out_all[t0:t1],
            reward=reward[lo:hi],
            finish_code=finish[lo:hi],
            tool_names=(p.tool_name,),
        )


def to_trajectories(sa: StepArrays) -> Iterator[Trajectory]:
    """The row form of a generated step (for the trace writer and the ``generate`` API)."""
    gen = sa.gen_tokens.tolist()
    ttok = sa.tool_tokens.tolist()
    lat = sa.tool_latency_s.tolist()
    tcode = sa.tool_code.tolist()
    ocode = sa.outcome_code.tolist()
    offs = sa.turn_offsets.tolist()
    rewards = sa.reward.tolist()
    fins = sa.finish_code.tolist()
    ptok = sa.prompt_tokens.tolist()
    names = sa.tool_names
    for i in range(sa.n):
        turns = tuple(
            Turn(gen_tokens=gen[j], tool=None, tool_latency_s=None, tool_tokens=0, outcome=None)
            if tcode[j] < 0 else
            Turn(gen_tokens=gen[j], tool=names[tcode[j]], tool_latency_s=lat[j], tool_tokens=ttok[j],
                 outcome=OUTCOMES[ocode[j]])  # type: ignore[arg-type]
            for j in range(offs[i], offs[i + 1])
        )
        r = rewards[i]
        yield Trajectory(id=sa.ids[i], step=sa.step, prompt_tokens=ptok[i], turns=turns, group=sa.groups[i],
                         reward=None if r != r else r,
                         finish=None if fins[i] < 0 else FINISHES[fins[i]])  # type: ignore[arg-type]
