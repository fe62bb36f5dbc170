"""libra-run on a GPU cluster (issue 19), checked where a CPU can check it:

- engine placement: a TP-t instance is t one-device bundles and, on GPUs with TP >= 2, an engine
  actor holding no GPU whose child workers land in the group (the layout verl/OpenRLHF give
  vLLM's Ray executor); on local Ray with CPU bundles, a probe actor with the engine's options
  starts a child task that must be scheduled into the group's other bundle;
- DeepSpeed workers: LOCAL_RANK is the index of the worker's GPU among the visible devices, the
  rendezvous is the rank-0 worker's node IP (not 127.0.0.1); two ZeRO-3 workers on CPU build the
  model partitioned (no full copy) and train with micro-batched log-probs;
- micro-batched gradients equal the whole batch's (torch trainer);
- the GPU-only paths (a TP-2 vLLM instance in its group, bf16 DeepSpeed, NCCL weight sync) are
  skipped without CUDA.
"""

from __future__ import annotations

import importlib.util

import pytest

from runtime_markers import needs_deepspeed, needs_ray, needs_torch


def _cuda_devices() -> int:
    if importlib.util.find_spec("torch") is None:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


needs_2_gpus_vllm = pytest.mark.skipif(_cuda_devices() < 2 or importlib.util.find_spec("vllm") is None or importlib.util.find_spec("ray") is None,
                                       reason="needs 2 CUDA GPUs, vllm and ray (GPU-only path, not run in CI)")
needs_cuda = pytest.mark.skipif(_cuda_devices() < 1, reason="needs a CUDA GPU (GPU-only path, not run in CI)")


# ---- layout (pure) -----------------------------------------------------------------------------
def test_tp2_vllm_on_gpus_is_two_one_gpu_bundles_and_a_gpu_less_actor() -> None:
    from libra.runtime.engine_layout import engine_layout

    lay = engine_layout(2, use_gpu=True, kind="vllm")
    assert lay.bundles == ({"GPU": 1.0}, {"GPU": 1.0}) and lay.strategy == "STRICT_PACK"
    assert lay.actor_resources == {"num_cpus": 0.0, "num_gpus": 0.0} and lay.actor_bundle == 0 and lay.capture_child_tasks
    assert lay.executor == "ray" and lay.unset_visible_devices
    assert lay.env == {"VLLM_RAY_BUNDLE_INDICES": "0,1", "VLLM_RAY_PER_WORKER_GPUS": "1.0"}
    # TP 1 on a GPU: the actor takes the GPU and vLLM runs in-process
    one = engine_layout(1, use_gpu=True, kind="vllm")
    assert one.bundles == ({"GPU": 1.0},) and one.actor_resources["num_gpus"] == 1.0 and one.executor == "uni" and not one.env
    # a colocated plan: the instance's TP ranks take half of bundles 4..7 of the group it shares
    # with the trainer (whose rank r takes the other half of bundle r)
    half = engine_layout(4, use_gpu=True, kind="vllm", frac=0.5, first_bundle=4)
    assert half.bundles == tuple({"GPU": 1.0} for _ in range(4)) and half.env["VLLM_RAY_PER_WORKER_GPUS"] == "0.5"
    assert half.env["VLLM_RAY_BUNDLE_INDICES"] == "4,5,6,7" and half.actor_bundle == 4
    tp1 = engine_layout(1, use_gpu=True, kind="vllm", frac=0.5, first_bundle=3)
    assert tp1.actor_bundle == 3 and tp1.actor_resources["num_gpus"] == 0.5
    with pytest.raises(ValueError):
        engine_layout(0, True, "vllm")


def test_cpu_layout_keeps_one_cpu_per_bundle() -> None:
    from libra.runtime.engine_layout import engine_layout

    lay = engine_layout(2, use_gpu=False, kind="torch")
    assert lay.bundles == ({"CPU": 1.0}, {"CPU": 1.0}) and lay.actor_resources == {"num_cpus": 1.0} and lay.executor is None
    assert engine_layout(2, use_gpu=False, kind="vllm").executor == "mp"


# ---- rendezvous and device index (pure) ------------------------------------------------------------
def test_local_rank_is_the_index_of_the_rays_gpu_among_the_visible_ones() -> None:
    from libra.runtime.rendezvous import local_rank

    assert local_rank([3], "3", rank=5) == 0  # Ray shows each worker one GPU: cuda:0, whatever the rank
    assert local_rank([6], "4,6", rank=1) == 1
    assert local_rank(["2"], None, rank=0) == 2  # visibility not restricted: the physical id
    assert local_rank([], None, rank=3) == 3  # CPU workers keep their rank
    with pytest.raises(ValueError):
        local_rank([1], "0", rank=0)


# ---- on local Ray --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_local():  # type: ignore[no-untyped-def]
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@needs_ray
def test_engine_group_on_ray_holds_tp_bundles_and_captures_the_engines_workers(ray_local) -> None:
    """The group of a TP-2 instance has two one-CPU bundles; an actor started with the engine's
    options sits in bundle 0, and a task it starts (as vLLM's Ray executor starts a worker per
    rank) is scheduled into the same group, on the other bundle."""
    ray = ray_local
    from ray.util.placement_group import placement_group_table, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from libra.runtime.actors import engine_actor_options, make_engine_group

    pg = make_engine_group(2, use_gpu=False, kind="torch")
    try:
        assert [dict(b) for b in pg.bundle_specs] == [{"CPU": 1.0}, {"CPU": 1.0}]
        assert placement_group_table(pg)["strategy"] == "STRICT_PACK"

        @ray.remote
        def rank_worker() -> str | None:
            g = ray.util.get_current_placement_group()
            return None if g is None else g.id.hex()

        @ray.remote
        class Probe:
            def where(self) -> tuple[str | None, str | None]:
                g = ray.util.get_current_placement_group()
                # a child asking for one CPU: only the group's second bundle has one left
                child = rank_worker.options(num_cpus=1).remote()
                return (None if g is None else g.id.hex()), ray.get(child, timeout=60)

        opts = engine_actor_options(pg, 2, use_gpu=False, kind="torch")
        assert opts["num_cpus"] == 1.0
        strat = opts["scheduling_strategy"]
        assert isinstance(strat, PlacementGroupSchedulingStrategy) and strat.placement_group_capture_child_tasks
        assert strat.placement_group_bundle_index == 0
        probe = Probe.options(**opts).remote()
        mine, childs = ray.get(probe.where.remote(), timeout=90)
        assert mine == pg.id.hex() and childs == pg.id.hex()
        ray.kill(probe)
    finally:
        remove_placement_group(pg)


@needs_torch
def test_torch_engine_sleeps_and_wakes_with_the_same_outputs() -> None:
    """A colocated plan's engine releases its memory for training (KV caches dropped; weights to
    the host on a GPU) and comes back unchanged."""
    from libra.runtime.chat_format import for_tokenizer
    from libra.runtime.engines.base import TurnRequest
    from libra.runtime.engines.torch_engine import TorchEngine
    from libra.runtime.tiny_model import DEFAULT_DIR

    eng = TorchEngine(DEFAULT_DIR, seed=0)
    ctx = tuple(for_tokenizer(eng.tokenizer).prompt_ids("Compute 12*34+5."))
    req = [TurnRequest("a", ctx, 8, temperature=0.0)]
    before = eng.generate(req)[0].tokens
    assert eng.cached_tokens() > 0
    assert eng.sleep() > 0 and eng.cached_tokens() == 0
    eng.wake()
    again = eng.generate(req)[0]
    assert again.tokens == before and again.cached_tokens == 0  # recomputed: the KV was released


@needs_ray
def test_colocated_roles_share_one_group_bundle_by_bundle(ray_local) -> None:
    """A colocated plan's engine (TP 1, half a device, bundle 1) and a trainer worker (the other
    half of bundle 1) both start in the one group that holds both roles."""
    ray = ray_local
    from ray.util.placement_group import remove_placement_group

    from libra.runtime.actors import engine_actor_options, make_group

    pg = make_group(2, use_gpu=False, strategy="PACK")
    try:
        assert [dict(b) for b in pg.bundle_specs] == [{"CPU": 1.0}, {"CPU": 1.0}]
        opts = engine_actor_options(pg, 1, use_gpu=False, kind="torch", frac=0.5, first_bundle=1)
        assert opts["num_cpus"] == 0.5 and opts["scheduling_strategy"].placement_group_bundle_index == 1

        @ray.remote
        class Probe:
            def group(self) -> str | None:
                g = ray.util.get_current_placement_group()
                return None if g is None else g.id.hex()

        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        eng = Probe.options(**opts).remote()
        trainer = Probe.options(num_cpus=0.5, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=1)).remote()
        assert ray.get([eng.group.remote(), trainer.group.remote()], timeout=60)[0] == pg.id.hex()
        ray.kill(eng)
        ray.kill(trainer)
    finally:
        remove_placement_group(pg)


@needs_deepspeed
def test_deepspeed_zero3_workers_meet_at_rank0_node_and_build_partitioned(ray_local, tmp_path) -> None:
    """Two DeepSpeed workers on CPU: LOCAL_RANK is each worker's rank (CPU), MASTER_ADDR is the
    rank-0 worker's node IP as Ray reports it, ZeRO-3 built the model partitioned, and a step
    whose mini-batches exceed the log-prob token budget trains in micro-batches."""
    ray = ray_local
    from ray.util.placement_group import remove_placement_group

    from libra.runtime.actors import make_group, start_trainers
    from libra.runtime.grpo import Sample
    from libra.runtime.tiny_model import DEFAULT_DIR

    pg = make_group(2, use_gpu=False, strategy="PACK")
    workers: list = []
    try:
        opts = {"model_dir": DEFAULT_DIR, "backend": "deepspeed", "zero_stage": 3, "lr": 1e-3, "mini_batches": 1, "seed": 0,
                "device": "cpu", "threads": 1, "logprob_tokens": 40, "kl_coef": 0.05}
        workers, ready = start_trainers(pg, 2, opts, use_gpu=False)
        ray.get(ready, timeout=600)
        infos = ray.get([w.info.remote() for w in workers])
        node_ip = ray.util.get_node_ip_address()
        assert [i["RANK"] for i in infos] == ["0", "1"] and [i["LOCAL_RANK"] for i in infos] == ["0", "1"]
        assert {i["MASTER_ADDR"] for i in infos} == {node_ip}
        assert all(i["built_partitioned"] and i["zero_stage"] == 3 and not i["bf16"] for i in infos)
        assert all(i["frozen_partitioned"] for i in infos)  # the KL reference is partitioned too
        # the partitions hold the folder's weights (gathered: a collective, both ranks call it)
        import os

        import torch
        from safetensors.torch import load_file

        want = load_file(os.path.join(DEFAULT_DIR, "model.safetensors"))
        got = ray.get([w.state_dict.remote() for w in workers])[0]
        assert want and all(torch.equal(got[k], v.to(got[k].dtype)) for k, v in want.items())
        # 3 samples of ~20 tokens per rank: 60 tokens > the 40-token budget, so micro-batches
        samples = [Sample(tuple(range(10, 30 + k)), tuple([0] * 8 + [1] * (12 + k)), 1.0 if k % 2 else -1.0) for k in range(6)]
        stats = ray.get([w.train_step.remote(samples[r::2]) for r, w in enumerate(workers)], timeout=600)
        assert all(s["samples"] == 3.0 and s["loss"] == s["loss"] for s in stats)  # ran, no NaN
        # streaming: the partitioned behaviour copy takes the trained shards (no gather), so the
        # first streamed mini-batch's ratio is 1 and its KL to the initial reference is not 0
        ray.get([w.begin_step.remote() for w in workers], timeout=600)
        st = ray.get([w.train_minibatch.remote(samples[r::2], None, 1.0) for r, w in enumerate(workers)], timeout=600)
        assert all(abs(s["ratio_mean"] - 1.0) < 1e-5 and s["kl"] > 0 for s in st), st
    finally:
        for w in workers:
            ray.kill(w)
        remove_placement_group(pg)


@needs_torch
def test_micro_batched_gradient_equals_the_whole_batchs() -> None:
    import torch

    from libra.runtime.grpo import Sample, accumulate_grpo, collate, token_logprobs
    from libra.runtime.trainer import Learner
    from libra.runtime.tiny_model import DEFAULT_DIR

    ln = Learner(DEFAULT_DIR, seed=0)
    samples = [Sample(tuple(range(12, 30 + 3 * k)), tuple([0] * 6 + [1] * (12 + 3 * k)), (-1.0) ** k) for k in range(5)]
    batch = collate(samples, ln.pad_id)
    with torch.no_grad():
        old = token_logprobs(ln.model, batch[0], batch[1]) + 0.05  # off-policy enough to exercise the clip
        assert torch.allclose(token_logprobs(ln.model, batch[0], batch[1], token_budget=50), old - 0.05, atol=1e-6)

    def grads(budget: int | None) -> list[torch.Tensor]:
        ln.model.zero_grad(set_to_none=True)
        calls: list[bool] = []
        accumulate_grpo(ln.model, batch, old, None, 0.2, 0.0, lambda loss, last: (calls.append(last), loss.backward()), budget)
        assert calls[-1] and not any(calls[:-1])
        grads.calls = len(calls)  # type: ignore[attr-defined]
        return [p.grad.clone() for p in ln.model.parameters() if p.grad is not None]

    whole = grads(None)
    assert grads.calls == 1  # type: ignore[attr-defined]
    micro = grads(30)  # padded rows of 30 tokens: one row per micro-batch
    assert grads.calls == 5  # type: ignore[attr-defined]
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(whole, micro))


def test_deepspeed_config_is_bf16_with_fp32_master_on_gpus() -> None:
    from libra.runtime.trainer import _ds_config

    assert _ds_config(3, 1.0, bf16=True)["bf16"] == {"enabled": True}
    assert _ds_config(2, 1.0)["bf16"] == {"enabled": False}  # CPU runs stay fp32
    assert "fp16" not in _ds_config(3, 1.0, bf16=True)  # bf16 needs no loss scaling; DeepSpeed keeps fp32 masters


# ---- GPU-only: skipped without CUDA ---------------------------------------------------------------
@needs_cuda
@needs_torch
def test_torch_trainer_on_gpu_keeps_fp32_masters_and_computes_in_bf16() -> None:
    import torch

    from libra.runtime.grpo import Sample
    from libra.runtime.trainer import Learner
    from libra.runtime.tiny_model import DEFAULT_DIR

    ln = Learner(DEFAULT_DIR, device="cuda", seed=0)
    assert ln.bf16 and all(p.dtype == torch.float32 for p in ln.model.parameters())
    samples = [Sample(tuple(range(12, 40)), tuple([0] * 8 + [1] * 20), (-1.0) ** k) for k in range(4)]
    st = ln.train_step(samples)
    assert st["loss"] == st["loss"]


@needs_2_gpus_vllm
def test_tp2_vllm_instance_starts_in_its_group_on_two_gpus(ray_local) -> None:  # pragma: no cover - GPU only
    ray = ray_local
    from ray.util.placement_group import remove_placement_group

    from libra.runtime.actors import make_engine_group, start_engine
    from libra.runtime.engines.base import TurnRequest
    from libra.runtime.tiny_model import DEFAULT_DIR

    pg = make_engine_group(2, use_gpu=True, kind="vllm")
    try:
        h = start_engine(pg, 0, "vllm", DEFAULT_DIR, {"device": "cuda", "seed": 0, "max_context": 256}, True, 2)
        out = ray.get(h.generate.remote([TurnRequest("t", (1, 2, 3), 4, temperature=0.0)]), timeout=600)
        assert len(out[0].tokens) >= 1
        ray.get(h.shutdown.remote())
    finally:
        remove_placement_group(pg)


# ---- weight sync over NCCL: layout (pure) and the GPU path (skipped without CUDA) --------------------
def test_broadcast_group_puts_the_trainer_first_and_each_instances_workers_after() -> None:
    from libra.runtime.weight_broadcast import group_layout

    assert group_layout([2, 1, 4]) == (8, [1, 3, 4])
    assert group_layout([1]) == (2, [1])
    with pytest.raises(ValueError):
        group_layout([0])


@needs_torch
def test_broadcast_metadata_names_every_parameter_in_bf16() -> None:
    import torch

    from libra.runtime.trainer import Learner
    from libra.runtime.tiny_model import DEFAULT_DIR
    from libra.runtime.weight_broadcast import model_params, weight_meta

    ln = Learner(DEFAULT_DIR, seed=0)
    meta = ln.weight_meta()
    assert meta == weight_meta(ln.model, torch.bfloat16)
    assert set(meta["dtype_names"]) == {"bfloat16"} and len(meta["names"]) == len(list(ln.model.parameters()))
    sent = list(model_params(ln.model, torch.bfloat16, rank=0, zero3=False))
    assert [n for n, _ in sent] == meta["names"] and [list(t.shape) for _, t in sent] == meta["shapes"]
    assert all(t.dtype == torch.bfloat16 for _, t in sent)
    assert list(model_params(ln.model, torch.bfloat16, rank=1, zero3=False)) == []  # only rank 0 sends


@needs_2_gpus_vllm
def test_nccl_weight_sync_equals_the_file_path_on_gpus(ray_local) -> None:  # pragma: no cover - GPU only
    """A TP-1 vLLM instance on GPU 1 gets the trainer's (GPU 0) weights by NCCL broadcast; its
    greedy output then equals that of an instance loaded through the safetensors file path."""
    ray = ray_local
    from ray.util.placement_group import remove_placement_group

    from libra.runtime.actors import make_engine_group, make_group, start_engine, start_trainers
    from libra.runtime.engines.base import TurnRequest
    from libra.runtime.tiny_model import DEFAULT_DIR
    from libra.runtime.weight_broadcast import group_layout

    pgs = [make_group(1, True, "PACK"), make_engine_group(1, True, "vllm")]
    try:
        workers, ready = start_trainers(pgs[0], 1, {"model_dir": DEFAULT_DIR, "device": "cuda", "seed": 0}, True)
        ray.get(ready)
        eng = start_engine(pgs[1], 0, "vllm", DEFAULT_DIR, {"device": "cuda", "seed": 0, "max_context": 256}, True, 1)
        assert ray.get(eng.weight_sync_kind.remote())
        from libra.runtime.grpo import Sample

        # move the trainer away from the folder's weights, so a broadcast that did not arrive shows
        samples = [Sample(tuple(range(12, 40)), tuple([0] * 8 + [1] * 20), (-1.0) ** k) for k in range(4)]
        ray.get(workers[0].train_step.remote(samples))
        master, port = ray.get(workers[0].rendezvous.remote())
        world, offs = group_layout([1])
        meta = ray.get(workers[0].weight_meta.remote())
        ray.get([eng.join_weight_group.remote(master, port, offs[0], world), workers[0].broadcast_weights.remote(master, port, world),
                 eng.receive_weights.remote(meta)])
        req = [TurnRequest("t", (1, 2, 3, 4), 8, temperature=0.0)]
        via_nccl = ray.get(eng.generate.remote(req))[0].tokens
        ray.get(eng.load_state_dict.remote(ray.get(workers[0].state_dict.remote())))
        via_file = ray.get(eng.generate.remote(req))[0].tokens
        assert via_nccl == via_file
    finally:
        for pg in pgs:
            remove_placement_group(pg)
