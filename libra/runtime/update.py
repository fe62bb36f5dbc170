"""The step's GRPO update on the trainer workers, and what happens when one of them dies.

Batch (``train``): after the rollout, the samples are sharded over the workers, each updates,
and the new weights go to the engines. Streamed (``streamer`` then ``finish_streamed``): a
``streaming.StreamingTrainer`` trains mini-batches as GRPO groups finish during the rollout
(lending idle rollout instances as gradient helpers on the torch trainer), and the remaining
mini-batches after it. Either way a trainer worker that dies brings the group back from the last
checkpoint (``Actors.place(..., from_checkpoint_only=True)``) and the step's update is redone on
the same driver-held samples; ``restarts`` counts those for ``steps.csv``. In the asynchronous
loop (``train`` with ``max_staleness``) the update runs while the next rollout does, so only the
trainer group is replaced (``Actors.restart_trainers``): the engines keep generating.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from libra.planner.plan import Plan
from libra.runtime.placement import Actors


def streams(plan: Plan, pinned: bool | None) -> bool:
    """Whether the step runs the streamed loop (sync + streaming) rather than the batch update:
    the plan's choice (``Plan.streaming``, the policy's decision) unless the user pinned it
    (``streaming: true/false``, as ``libra-sim --streaming/--no-streaming`` override it). A
    colocated plan never streams: rollout and training time-share its devices. The same rule as
    the simulator's loop (``sim/loop.py``), so both backends run the loop the core decided."""
    want = plan.streaming if pinned is None else pinned
    return bool(want) and plan.mode == "sync" and not plan.colocated


def loop_name(plan: Plan, pinned: bool | None) -> str:
    """The loop a step runs, by the simulator's names: ``sync``, ``sync+streaming`` or ``async``."""
    if plan.mode == "async":
        return "async"
    return "sync+streaming" if streams(plan, pinned) else "sync"


class Updater:
    """Runs each step's update over ``actors``' trainer workers (see the module docstring)."""

    def __init__(self, cfg: Any, actors: Actors, model_dir: str, log: Any) -> None:
        self.cfg, self.actors, self.model_dir, self.log = cfg, actors, model_dir, log
        self.restarts = 0  # trainer groups restarted from a checkpoint, over the run
        self._said_no_lend = False

    def train(self, plan: Plan, samples: list[Any], step: int, max_staleness: int | None = None) -> tuple[dict[str, float], float]:
        """Shard the samples over the trainer workers, update, and push the new weights to the
        engines. A worker that dies (during the update or the weight gather) brings the group
        back from the last checkpoint and the step's update is redone. Returns (stats, sync_s).
        ``max_staleness`` (the async loop): each worker refuses samples staler than it allows
        (``Learner.train_step``), and a dead worker replaces the trainer group alone."""
        import ray

        faults = [f for f in self.cfg.faults if f["kill"] == "trainer" and f["step"] == step]
        if plan.colocated:  # the roles time-share the devices: engines release theirs; the sync wakes them
            self.actors.sleep_engines()
        for attempt in range(3):
            trainers = self.actors.trainers
            world = len(trainers)
            shards = [samples[r::world] for r in range(world)]
            # fault injection: the last worker exits after its first optimizer step of this update
            die = [None] * world
            if faults and attempt == 0:
                die[-1] = 1
            refs = [w.train_step.remote(s, d, max_staleness) for w, s, d in zip(trainers, shards, die)]
            try:
                stats = ray.get(refs)
                # the weights' version: the trainer's count of its updates (RL steps trained)
                sync_s = self.actors.sync_weights(int(stats[0]["version"]))
                return {k: float(np.mean([s[k] for s in stats])) for k in stats[0]}, sync_s
            except ray.exceptions.RayActorError:
                self.restarts += 1
                self.log(f"a trainer worker died during step {step}; restarting the group from the last checkpoint")
                if max_staleness is not None and not plan.colocated:
                    done = self.actors.restart_trainers(plan)  # the engines keep running the next rollout
                    if done != self.actors.version:
                        # the checkpoint is not the update before this one (checkpoint_every > 1, or 0):
                        # redoing this step from it would silently drop the updates in between
                        raise RuntimeError(f"a trainer worker died during step {step}'s update and the newest checkpoint holds "
                                           f"{done} step(s), the engines {self.actors.version}: the updates between are lost "
                                           f"(checkpoint_every {self.cfg.checkpoint_every}; the async loop recovers a trainer "
                                           f"only with checkpoint_every 1)")
                else:
                    self.actors.shape = None
                    self.actors.place(plan, from_checkpoint_only=True)
        raise RuntimeError(f"training of step {step} failed 3 times")

    def streamer(self, n_traj: int, step: int) -> Any:
        """The step's ``StreamingTrainer``: lending (gradient helpers) on the torch backend only."""
        from libra.runtime.streaming import StreamingTrainer, group_samples

        cfg = self.cfg
        if cfg.trainer == "torch":
            opts: dict[str, Any] | None = {"model_dir": self.model_dir, "device": cfg.device, "clip": cfg.clip, "kl_coef": cfg.kl_coef}
            reason = ""
        else:
            opts = None
            reason = ("the deepspeed trainer streams but takes no helpers: a lent worker would have to join its ZeRO process group, "
                      "a synchronous re-shard of the optimizer state")
            if not self._said_no_lend:
                self.log(f"elastic pool: {reason}; role changes are declined")
                self._said_no_lend = True
        die = any(f["kill"] == "trainer" and f["step"] == step for f in cfg.faults)
        return StreamingTrainer(self.actors.trainers, n_traj, cfg.mini_batches, group_samples, helper_opts=opts, no_lend_reason=reason,
                                behaviour=self.actors.weights_ref, die_first=die, log=self.log)

    def finish_streamed(self, plan: Plan, streamer: Any, rollout_end_s: float, step: int) -> tuple[dict[str, float], float, Any]:
        """Train the streamed step's remaining mini-batches, then sync the weights. A trainer
        worker that died brings the group back from the last checkpoint and the step's update is
        redone on the same mini-batches (driver-held samples). Returns (stats, sync_s, result)."""
        from libra.runtime.streaming import StreamingTrainer, group_samples

        actors = self.actors
        sr = streamer.finish(rollout_end_s)
        if sr.failed:
            for attempt in range(2):
                self.restarts += 1
                self.log(f"a trainer worker died during step {step}; restarting the group from the last checkpoint and redoing the update")
                actors.shape = None
                actors.place(plan, from_checkpoint_only=True)
                redo = StreamingTrainer(actors.trainers, 0, 1, group_samples, log=self.log).redo(sr.batches)
                if not redo.failed:
                    break
            else:
                raise RuntimeError(f"training of step {step} failed 3 times")
            # the update that counts ran after the rollout: no overlap; lending figures stay
            sr.stats, sr.train_s, sr.overlap_s, sr.logprob_s = redo.stats, redo.train_s, 0.0, redo.logprob_s
        else:
            for iid in sr.dead_helpers:  # a lent instance that died: a fresh engine for the next step
                inst = actors.instances.get(iid)
                if inst is not None:
                    inst.handle = actors.respawn(inst)
        return sr.stats, actors.sync_weights(), sr
