"""``libra-run``'s one line on the elastic pool (pure: no Ray). The synchronous loop consults the
pool after rollout events but never with training running, so it never lends; the line must say
how often it was asked and why nothing was lent, from the counts, not assert it blindly."""

from __future__ import annotations

from libra.runtime.policyglue import pool_summary


def test_consulted_but_never_with_training_running_says_why() -> None:
    line = pool_summary(steps=3, steps_with_pool=3, consulted=41, consulted_training=0, lent=0)
    assert line.startswith("elastic pool: consulted 41 times in 3 of 3 step(s), lent 0 worker(s): ")
    assert "only while training runs" in line and "synchronous loop" in line and "\n" not in line


def test_other_counts_do_not_claim_that_reason() -> None:
    assert pool_summary(2, 0, 0, 0, 0) == "elastic pool: the policy has none in 2 step(s); no worker lent"
    assert pool_summary(2, 2, 0, 0, 0).endswith("no rollout event consulted it")
    # were training ever running (an asynchronous loop), the synchronous-loop reason would be false
    assert "synchronous" not in pool_summary(2, 2, 9, 4, 0)
    assert pool_summary(2, 2, 9, 4, 1) == "elastic pool: consulted 9 times in 2 of 2 step(s), lent 1 worker(s)"
