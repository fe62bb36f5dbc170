"""Libra's plans written as other RL frameworks' own configurations (``libra-sim plan --emit``).

One file per framework (``verl.py``, ``areal.py``, ``slime.py``, ``nemo_rl.py``) behind one
registry (``registry.py``); ``target.py`` holds the types they share (what a framework can
express, the emitted configuration); ``fit.py`` re-plans a plan a framework cannot express into
the nearest one it can, priced by the same planner; ``schema.py`` validates emitted keys against
the key lists in ``schemas/``, derived from each framework's own example configs
(``scripts/build_export_schemas.py``). Pure: no imports beyond the planner and the standard library.
"""
