"""BM25 retrieval over a small document collection, in NumPy/SciPy (no search server).

Why BM25 and not embeddings: it needs no model download, is exact and deterministic, and is the
usual first-stage retriever of search-agent RL setups (Search-R1 uses BM25 or E5 over Wikipedia).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

import numpy as np
from scipy import sparse

from libra.runtime.tasks import Doc
from libra.runtime.tools.base import ToolResult

_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Lower-cased alphanumeric words."""
    return _TOKEN.findall(text.lower())


class BM25:
    """Okapi BM25 (``k1``, ``b``) over ``docs``; ``search`` returns the top-k document texts."""

    def __init__(self, docs: Sequence[Doc], k1: float = 1.2, b: float = 0.75) -> None:
        if not docs:
            raise ValueError("BM25 needs at least one document")
        self.docs = list(docs)
        vocab: dict[str, int] = {}
        rows, cols = [], []
        for i, d in enumerate(self.docs):
            for w in tokenize(d.text):
                rows.append(i)
                cols.append(vocab.setdefault(w, len(vocab)))
        self.vocab = vocab
        tf = sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(self.docs), len(vocab)))
        tf.sum_duplicates()
        n = len(self.docs)
        df = np.asarray((tf > 0).sum(axis=0)).ravel()
        self.idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
        dl = np.asarray(tf.sum(axis=1)).ravel()
        norm = k1 * (1 - b + b * dl / max(dl.mean(), 1e-9))
        tf = tf.tocoo()
        w = tf.data * (k1 + 1) / (tf.data + norm[tf.row])
        self.weights = sparse.csc_matrix((w, (tf.row, tf.col)), shape=tf.shape)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query``."""
        ids = [self.vocab[w] for w in tokenize(query) if w in self.vocab]
        if not ids:
            return np.zeros(len(self.docs))
        cols = self.weights[:, ids]
        return np.asarray(cols @ self.idf[ids]).ravel()

    def search(self, query: str, k: int = 1) -> list[Doc]:
        """The ``k`` best documents (stable order on ties), none when no query word is known."""
        s = self.scores(query)
        if not s.any():
            return []
        order = np.lexsort((np.arange(len(s)), -s))[:k]
        return [self.docs[i] for i in order if s[i] > 0]


class SearchTool:
    """The ``search`` tool: the top-k documents for a free-text query, one per line."""

    def __init__(self, docs: Sequence[Doc], k: int = 1, max_query_chars: int = 256) -> None:
        self.index = BM25(docs)
        self.k = k
        self.max_query_chars = max_query_chars

    def run(self, query: str) -> ToolResult:
        """Search; an empty or oversized query is an ``error``, no hit an ``ok`` "no results"."""
        t0 = time.perf_counter()
        q = query.strip()
        if not q or len(q) > self.max_query_chars:
            return ToolResult(f"error: query must have 1..{self.max_query_chars} characters", "error", time.perf_counter() - t0)
        hits = self.index.search(q, self.k)
        out = "\n".join(d.text for d in hits) if hits else "no results"
        return ToolResult(out, "ok", time.perf_counter() - t0)
