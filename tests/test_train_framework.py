"""The training-pass factors in cost_models.training are what their fit script computes from the
published stage times, and they move predictions the way the published rows do."""

from __future__ import annotations

import pytest

import cost_models.training as training
from cost_models.calibration import train_framework as tf


def test_the_fit_reproduces_the_module_constants() -> None:
    g, a = tf.fit()
    assert g == pytest.approx(training.FRAMEWORK_COMPUTE_FACTOR, abs=0.01)
    assert a == pytest.approx(training.TRAIN_ATTENTION_FACTOR, abs=0.01)


def test_kernels_alone_are_too_fast_and_the_fit_brings_every_row_within_20_percent() -> None:
    fitted = (training.FRAMEWORK_COMPUTE_FACTOR, training.TRAIN_ATTENTION_FACTOR)
    for row in tf.ROWS:
        assert row.predict((1.0, 1.0)) < 0.6 * row.seconds, row.ref  # every published row is >1.6x the kernel sum
        assert abs(row.predict(fitted) / row.seconds - 1) < 0.2, row.ref


def test_the_attention_factor_weighs_long_sequences_more() -> None:
    """Same tokens, 16K-token vs 2K-token sequences: the attention factor raises the long ones'
    time by more (attention is a larger share there)."""
    row = tf.ROWS[0]
    long_row = row
    short_row = tf.StageRow(row.run, row.ref, row.model, row.gpu, row.strategy, row.samples * 7, 2000, row.stage, 1, row.seconds, row.setup)
    def rise(r: tf.StageRow) -> float:
        return r.predict((1.0, 2.0)) / r.predict((1.0, 1.0))
    assert rise(long_row) > rise(short_row) > 1.0
