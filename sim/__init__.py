"""The SimPy cluster simulator behind ``libra-sim replay`` (docs/simulator.md).

``sim.replay.replay_policy`` replays a trace's steps under a named policy on a simulated cluster
and returns a ``sim.metrics.RunResult``; every policy, the baselines included, is the
policy core's (``libra.policies``, one registry); ``sim.hindsight`` is the what-if replay the
simulator offers the hindsight baseline. Importing ``sim`` is cheap: the
submodules load simpy, the cost evaluator and matplotlib only when used.
"""
