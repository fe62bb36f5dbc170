"""``libra-sim sweep``: many replays from one grid file, cached, in parallel, summarized.

One concept per module: ``grid`` (the YAML schema, its validation and its expansion into
configurations), ``staleness`` (which loop mode a staleness class runs and which policies take
part in it), ``cache`` (the configuration hash and the one-JSON-per-hash result store),
``run`` (local processes or Ray tasks, one configuration per task) and ``summary`` (the results
table and Libra against the best baseline of its staleness class). ``sim.commands.sweep`` is the
CLI over them. Nothing here imports ray unless ``--ray`` is given.
"""
