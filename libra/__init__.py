"""Libra: resource management for agentic RL post-training.

The policy core (trace I/O, planner, rollout scheduling, elastic pool) lives here and is pure:
it imports neither simpy nor torch/ray/vllm/deepspeed. The SimPy cluster is in ``sim``; the
cost evaluator in ``cost_models``; the real executor in ``libra.runtime`` (optional extra).
"""

__version__ = "0.1.0"
