"""The SimPy cluster simulator behind ``libra-sim replay`` (docs/simulator.md).

``sim.replay.replay_policy`` replays a trace's steps under a named policy on a simulated cluster
and returns a ``sim.metrics.RunResult``; ``sim.policies`` resolves names over the baselines
(``sim.baselines``) and the policy core's ``libra.policies``. Importing ``sim`` is cheap: the
submodules load simpy, the cost evaluator and matplotlib only when used.
"""
