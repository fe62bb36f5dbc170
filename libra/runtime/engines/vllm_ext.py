"""A vLLM worker extension: mixed into every vLLM worker (``worker_extension_cls``) so weight
sync is a named ``collective_rpc`` method, which vLLM serializes safely (no pickled code).

The weights travel as a safetensors file path, not as tensors in the RPC: vLLM's message
encoder turns nested tensors into lists (slow, and the dtype is lost); a file is exact and is
read by every TP rank at memory speed."""

from __future__ import annotations

from typing import Any


class WeightSyncExtension:
    """Methods added to vLLM's worker class."""

    model_runner: Any

    def libra_load_weights(self, path: str) -> int:
        """Load the trainer's weights (HF names, a safetensors file) into this worker's shard."""
        from safetensors.torch import load_file

        state = load_file(path)
        # the worker's in-place reload: checkpoint-format weights go through the same
        # post-load processing (CPU kernels repack linear weights) as at start-up
        self.reload_weights(weights_iterator=iter(state.items()), is_checkpoint_format=True)  # type: ignore[attr-defined]
        return len(state)
