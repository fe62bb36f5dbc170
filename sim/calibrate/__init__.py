"""``libra-calibrate from-logs``: a run's own step metrics (verl, AReaL, NeMo RL) against the
simulator's replay of that run, and the stage overheads fitted on them.

Why in ``sim``: the replay runs the simulator, and ``cost_models`` (where the rest of
``libra-calibrate`` lives) imports nothing of ours. The fitted overheads are a
``cost_models.calibration.stages.StageOverheads`` in a calibration file that ``--calibration``
reads, so the planner and the simulator both use them. Parts: ``logs.py`` (console lines, JSONL,
W&B CSV), ``run_config.py`` (the run's layout from its config), ``replay.py`` (the run replayed),
``fit.py`` (per-stage least squares), ``cli.py`` (the subcommand and the ``libra-calibrate`` entry
point that adds it to ``cost_models.cli``'s).
"""
