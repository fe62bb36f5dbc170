"""``libra-calibrate profile --engine-model DIR``: time a Hugging Face model's decode and prefill
iterations the way Libra's batched torch engine runs them, and fit the engine overhead.

Why measure the engine's own iteration rather than bare kernels: for a small model an iteration
is mostly per-forward framework work (transformers module calls, PyTorch dispatch, building the
input tensors, per-sequence sampling in Python), which no operator profile sees. The operator
part the cost model already predicts is subtracted (``engine.fit_overhead``), so what is fitted
is exactly what the operators miss.

What one measured iteration is (mirroring ``libra.runtime.engines.torch_engine``, which this
package may not import; keep the two in step):

- decode (B sequences, each with a KV cache of C tokens): a ``[B, 1]`` token tensor, the
  attention mask grown by one column, one ``model(...)`` forward with explicit positions and the
  batch ``DynamicCache``, float logits, then the engine's sampler: temperature-scaled
  ``log_softmax`` moved to the host and, per sequence, a seeded ``multinomial`` and its log-prob;
- prefill (B sequences each adding s tokens after c cached): B == 1 is one forward on the
  sequence's cache with ``logits_to_keep=1``; B > 1 left-pads the caches into one batch,
  right-pads the suffixes, one forward with logits at each row's last position, and cuts every
  sequence's cache back out; then the sampler as above (the cost model's prefill samples too).

Each point is the MEDIAN of repeats after warm-up (not the minimum the operator profile takes):
the engine in a run meets the same machine's typical, not best, iteration. The model runs in
float32 as the torch engine loads it, on ``cpu`` or ``cuda`` (synchronised before each clock
read).
"""

from __future__ import annotations

import inspect
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cost_models.calibration import data as cdata
from cost_models.calibration.engine import ENGINE_CSV, EngineRow, OverheadFit, fit_overhead, write_rows
from cost_models.calibration.fit import fit_frames
from cost_models.calibration.store import Calibration, EngineOverhead
from cost_models.errors import CostModelError
from cost_models.evaluator import CostEvaluator
from cost_models.hardware import GPUSpec


class EngineGrid:
    """Decode (B, C) and prefill (B, s, c) points; ``quick`` keeps a test to a few seconds."""

    def __init__(self, quick: bool, max_context: int) -> None:
        if quick:
            self.decode = [(b, c) for b in (1, 4) for c in (32, 128)]
            self.prefill = [(1, 32, 0), (4, 32, 0), (4, 16, 64)]
            self.repeats, self.warmup = 5, 2
        else:
            self.decode = [(b, c) for b in (1, 2, 4, 8, 16) for c in (32, 128, 384)]
            self.prefill = [(b, s, c) for b in (1, 4, 16) for s in (16, 64, 256) for c in (0, 128)]
            self.repeats, self.warmup = 15, 3
        self.decode = [(b, c) for b, c in self.decode if c + 1 <= max_context]
        self.prefill = [(b, s, c) for b, s, c in self.prefill if s + c <= max_context]


def operator_set(folder: Path, spec: GPUSpec) -> Any:
    """The operator timings ``libra-calibrate fit --data folder`` will give: the same fit of the
    folder's CSVs, so the overhead is measured against the operators it will be added to."""
    from cost_models.operators.fitted import FittedOperators

    tables = cdata.load_folder(folder)
    families = fit_frames({fam: t.frame for fam, t in tables.items()}, spec)
    if not families:
        raise CostModelError(f"{folder}: no operator CSVs to predict the model's compute with "
                             "(profile without --engine-only first)")
    return FittedOperators.from_calibration(spec, Calibration(gpu=spec.name, families=families))


def _kv_layers(cache: Any) -> list[tuple[Any, Any]]:
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def _cache_from(kv: list[tuple[Any, Any]]) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (k, v) in enumerate(kv):
        cache.update(k, v, i)
    return cache


class _Runner:
    """The model and the engine's iteration bodies (see module docstring)."""

    def __init__(self, torch: Any, model_dir: Path, device: str) -> None:
        try:
            from transformers import AutoConfig, AutoModelForCausalLM
        except ImportError:
            raise CostModelError("--engine-model needs transformers: pip install 'libra-rl[run]'") from None
        self.torch = torch
        self.dev = torch.device(device)
        try:
            cfg = AutoConfig.from_pretrained(model_dir)
            self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(self.dev).eval()
        except (OSError, ValueError) as exc:
            raise CostModelError(f"--engine-model {model_dir}: cannot load a causal LM ({exc})") from None
        params = inspect.signature(self.model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.layers = int(cfg.num_hidden_layers)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.vocab = int(cfg.vocab_size)
        self.max_context = int(getattr(cfg, "max_position_embeddings", 4096) or 4096)
        self.gen = torch.Generator(device="cpu").manual_seed(0)

    def sync(self) -> None:
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize()

    def kv(self, batch: int, tokens: int) -> list[tuple[Any, Any]]:
        shape = (batch, self.kv_heads, tokens, self.head_dim)
        return [(self.torch.randn(*shape, generator=self.gen).to(self.dev),
                 self.torch.randn(*shape, generator=self.gen).to(self.dev)) for _ in range(self.layers)]

    def sample(self, logits: Any, gens: list[Any]) -> None:
        """The engine's sampler: temperature 1, one seeded draw and its log-prob per row."""
        torch = self.torch
        temps = torch.ones(len(gens), device=logits.device)
        logp = torch.log_softmax(logits / temps[:, None], dim=-1).cpu()
        out = []
        for row, g in enumerate(gens):
            lp = logp[row]
            tok = int(torch.multinomial(lp.exp(), 1, generator=g))
            out.append((tok, float(lp[tok])))

    def decode_fn(self, batch: int, context: int) -> Callable[[], Callable[[], None]]:
        """A factory: each call sets up a fresh batch cache of ``context`` tokens per sequence
        (untimed) and returns the timed iteration."""
        torch = self.torch
        base = self.kv(batch, context)
        gens = [torch.Generator(device="cpu").manual_seed(i) for i in range(batch)]
        toks = list(range(3, 3 + batch))

        def setup() -> Callable[[], None]:
            cache = _cache_from(base)
            state = {"mask": torch.ones(batch, context, dtype=torch.long, device=self.dev),
                     "pos": torch.full((batch,), context, dtype=torch.long, device=self.dev)}

            def step() -> None:
                x = torch.tensor(toks, dtype=torch.long, device=self.dev)[:, None]
                mask = torch.cat([state["mask"], torch.ones_like(state["mask"][:, :1])], dim=1)
                out = self.model(input_ids=x, attention_mask=mask, position_ids=state["pos"][:, None],
                                 **{self.cache_kw: cache}, use_cache=True)
                logits = out.logits[:, -1].float()
                self.sample(logits, gens)

            return step

        return setup

    def prefill_fn(self, batch: int, new: int, cached: int) -> Callable[[], Callable[[], None]]:
        torch = self.torch
        pasts = [self.kv(1, cached) if cached else None for _ in range(batch)]
        suffixes = [[3 + (i + j) % max(1, self.vocab - 3) for j in range(new)] for i in range(batch)]
        gens = [torch.Generator(device="cpu").manual_seed(i) for i in range(batch)]
        pad = torch.nn.functional.pad

        def one() -> None:
            cache = _cache_from(pasts[0]) if pasts[0] else _cache_from_empty()
            x = torch.tensor([suffixes[0]], dtype=torch.long, device=self.dev)
            out = self.model(input_ids=x, **{self.cache_kw: cache}, use_cache=True, logits_to_keep=1)
            self.sample(out.logits[:, -1].float(), gens)

        def many() -> None:
            lens = [cached] * batch
            width = cached
            if width:
                kv_batch = []
                for layer in range(self.layers):
                    ks = [pad(p[layer][0], (0, 0, width - n, 0)) for p, n in zip(pasts, lens)]  # type: ignore[index]
                    vs = [pad(p[layer][1], (0, 0, width - n, 0)) for p, n in zip(pasts, lens)]  # type: ignore[index]
                    kv_batch.append((torch.cat(ks), torch.cat(vs)))
                cache = _cache_from(kv_batch)
            else:
                cache = _cache_from_empty()
            ids = suffixes
            mask = [[1] * (width + new) for _ in range(batch)]
            pos = [list(range(n, n + new)) for n in lens]
            out = self.model(input_ids=torch.tensor(ids, dtype=torch.long, device=self.dev),
                             attention_mask=torch.tensor(mask, dtype=torch.long, device=self.dev),
                             position_ids=torch.tensor(pos, dtype=torch.long, device=self.dev),
                             **{self.cache_kw: cache}, use_cache=True,
                             logits_to_keep=torch.tensor([new - 1], dtype=torch.long, device=self.dev))
            layers = _kv_layers(getattr(out, self.cache_kw))
            logits = []
            for row in range(batch):
                _cache_from([(k[row:row + 1, :, 0:width + new].clone(), v[row:row + 1, :, 0:width + new].clone())
                             for k, v in layers])
                logits.append(out.logits[row, 0].float().clone())
            self.sample(torch.stack(logits), gens)

        fn = one if batch == 1 else many
        return lambda: fn


def _cache_from_empty() -> Any:
    from transformers import DynamicCache

    return DynamicCache()


def _median_time(runner: _Runner, setup: Callable[[], Callable[[], None]], repeats: int, warmup: int) -> float:
    """Median seconds of the iteration ``setup()`` returns, each run on a fresh setup."""
    times = []
    for i in range(warmup + repeats):
        fn = setup()
        runner.sync()
        t0 = time.perf_counter()
        fn()
        runner.sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def profile_engine(
    torch: Any, model_dir: Path, device: str, out: Path, spec: GPUSpec, quick: bool = False,
    progress: Callable[[str], None] | None = None,
) -> tuple[Path, OverheadFit]:
    """Measure the grid, subtract the cost model's operator time, fit; writes ``engine.csv``."""
    model_dir = Path(model_dir)
    config = model_dir / "config.json"
    if not config.is_file():
        raise CostModelError(f"--engine-model {model_dir}: no config.json there (a Hugging Face model folder)")
    ops = operator_set(out, spec)
    ev = CostEvaluator(spec, config, ops=ops, engine=EngineOverhead(0.0, 0.0))
    runner = _Runner(torch, model_dir, device)
    grid = EngineGrid(quick, runner.max_context)
    rows: list[EngineRow] = []
    with torch.inference_mode():
        for b, c in grid.decode:
            meas = _median_time(runner, runner.decode_fn(b, c), grid.repeats, grid.warmup)
            rows.append(EngineRow("decode", b, c, 1, meas, float(ev.decode_s(1, b, b * c))))
            if progress:
                progress(f"decode B={b} C={c}: {meas * 1e3:.2f} ms")
        for b, s, c in grid.prefill:
            meas = _median_time(runner, runner.prefill_fn(b, s, c), grid.repeats, grid.warmup)
            rows.append(EngineRow("prefill", b, c, s, meas, float(ev.prefill_s(1, s, c, b))))
            if progress:
                progress(f"prefill B={b} s={s} c={c}: {meas * 1e3:.2f} ms")
    path = write_rows(out / ENGINE_CSV, rows)
    return path, fit_overhead(rows)
