"""Training data: a synthetic Markov corpus, token files and byte-level text files.

Every source hands out ``(batch_size, seq_len + 1)`` int64 token arrays. A train batch is
a pure function of (data config, run seed, step), so a resumed run sees exactly the
batches it would have seen uninterrupted; the validation set is fixed per data config.

Token file format: a flat little-endian array of uint16 or uint32 token ids with no header
(what nanoGPT's ``.bin`` and OLMo's memmap ``.npy`` pipelines write); documents are simply
concatenated. Each file is cut into non-overlapping windows of seq_len + 1 tokens; one
epoch visits every train window once in a seeded random order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Protocol

import numpy as np

from models.config import RunSpec, SyntheticData, TextFileData, TokenFileData

MAX_EXACT_CONTEXTS = 2**20  # above this, contexts are hashed into this many buckets
BURN_IN = 64  # tokens discarded at the start of each synthetic sequence (mixing)
CHUNK_STEPS = 16  # synthetic batches are generated this many steps at a time
_VAL_STREAM, _TRAIN_STREAM, _ESTIMATE_STREAM = 1, 2, 3
_UNIGRAM_CAP = 1 << 24  # tokens per file read to estimate file unigram entropy


class DataSource(Protocol):
    """What the training loop needs from a corpus."""

    entropy_rate: float | None

    def train_batch(self, step: int) -> np.ndarray:
        """The (batch, seq_len + 1) token batch of 0-based optimizer step ``step``."""

    def val_batches(self) -> list[np.ndarray]:
        """The fixed validation batches."""

    def unigram_entropy(self) -> float:
        """Entropy (nats) of the training data's token frequencies."""


def entropy(p: np.ndarray, axis: int = -1) -> np.ndarray:
    """Shannon entropy in nats along ``axis`` (0 log 0 = 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(p), 0.0)
    return terms.sum(axis=axis)


class MarkovSource:
    """Sparse order-k Markov source over ``vocab`` tokens.

    Each context (the last ``order`` tokens) has ``branching`` distinct successor tokens
    with Dirichlet(concentration) probabilities, all drawn from ``source_seed``. When
    vocab**order exceeds MAX_EXACT_CONTEXTS, contexts share parameters through a
    multiplicative hash into that many buckets (still an order-k source).
    """

    def __init__(
        self, vocab: int, order: int, branching: int, concentration: float, source_seed: int
    ) -> None:
        if branching > vocab:
            raise ValueError(f"branching={branching} exceeds vocab_size={vocab}")
        n_full = vocab**order
        if n_full >= 2**62:
            raise ValueError(f"vocab_size**order = {vocab}**{order} is too large; lower order")
        self.vocab, self.order, self.seed = vocab, order, source_seed
        self.hashed = n_full > MAX_EXACT_CONTEXTS
        self.n_contexts = MAX_EXACT_CONTEXTS if self.hashed else n_full
        rng = np.random.default_rng([source_seed, 0])
        if self.hashed:
            self._weights = rng.integers(0, 2**63, order, dtype=np.uint64) * 2 + 1
            self._shift = np.uint64(64 - int(math.log2(self.n_contexts)))
        else:
            self._weights = np.array([vocab ** (order - 1 - i) for i in range(order)], np.uint64)
        # Cumulative gaps of at least 1 spanning at most vocab give distinct successors.
        gaps = rng.integers(1, vocab // branching + 1, (self.n_contexts, branching))
        offset = rng.integers(0, vocab, (self.n_contexts, 1))
        self.successors = ((np.cumsum(gaps, axis=1) + offset) % vocab).astype(np.int64)
        gamma = rng.standard_gamma(concentration, (self.n_contexts, branching)) + 1e-30
        self.probs = gamma / gamma.sum(axis=1, keepdims=True)
        self._cum = np.cumsum(self.probs, axis=1)
        self.context_entropy = entropy(self.probs)

    def bucket(self, window: np.ndarray) -> np.ndarray:
        """Parameter row of each context given its last ``order`` tokens, shape (R, order)."""
        code = (window.astype(np.uint64) * self._weights).sum(axis=1, dtype=np.uint64)
        return (code >> self._shift if self.hashed else code).astype(np.int64)

    def sample(
        self, rng: np.random.Generator, rows: int, length: int, keep_buckets: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """``rows`` sequences of ``length`` tokens after a uniform start and BURN_IN tokens."""
        total = BURN_IN + length
        out = np.empty((rows, total), dtype=np.int64)
        out[:, : self.order] = rng.integers(0, self.vocab, (rows, self.order))
        buckets = np.empty((rows, total), dtype=np.int64) if keep_buckets else None
        uniforms = rng.random((total, rows))
        for t in range(self.order, total):
            b = self.bucket(out[:, t - self.order : t])
            pick = (uniforms[t, :, None] >= self._cum[b]).sum(axis=1)
            out[:, t] = self.successors[b, np.minimum(pick, self.successors.shape[1] - 1)]
            if buckets is not None:
                buckets[:, t] = b
        kept = buckets[:, BURN_IN:] if buckets is not None else None
        return out[:, BURN_IN:], kept

    def stationary(self, tol: float = 1e-13, max_iter: int = 20000) -> np.ndarray:
        """Limit distribution over contexts reached from a uniform start (exact case only).

        Iterates the lazy chain (π + πP)/2, which has the same fixed point but cannot
        oscillate on a periodic chain.
        """
        if self.hashed:
            raise ValueError("the stationary distribution is only computed for exact contexts")
        nxt = np.arange(self.n_contexts)[:, None] * self.vocab + self.successors
        nxt = (nxt % self.n_contexts).ravel()
        pi = np.full(self.n_contexts, 1.0 / self.n_contexts)
        for _ in range(max_iter):
            step = np.bincount(
                nxt, weights=(pi[:, None] * self.probs).ravel(), minlength=self.n_contexts
            )
            new = 0.5 * (pi + step)
            if np.abs(new - pi).sum() < tol:
                return new
            pi = new
        raise RuntimeError(f"stationary distribution did not converge in {max_iter} iterations")

    def exact_rates(self) -> tuple[float, float]:
        """(entropy rate, unigram entropy) in nats from the stationary distribution."""
        pi = self.stationary()
        unigram = np.bincount(
            self.successors.ravel(),
            weights=(pi[:, None] * self.probs).ravel(),
            minlength=self.vocab,
        )
        return float(pi @ self.context_entropy), float(entropy(unigram))

    def estimated_rates(self, rows: int = 256, length: int = 4096) -> tuple[float, float]:
        """(entropy rate, unigram entropy) averaged along sampled paths (ergodic estimate).

        The rate is the mean successor entropy of the visited contexts; the unigram
        distribution is the mean successor distribution of the visited contexts, which
        estimates the token frequencies without the plug-in bias of counting tokens.
        """
        rng = np.random.default_rng([self.seed, _ESTIMATE_STREAM])
        _, buckets = self.sample(rng, rows, length, keep_buckets=True)
        flat = buckets.ravel()
        unigram = np.bincount(
            self.successors[flat].ravel(), weights=self.probs[flat].ravel(), minlength=self.vocab
        )
        return float(self.context_entropy[flat].mean()), float(entropy(unigram / flat.size))

    def rates(self) -> tuple[float, float]:
        """Exact rates when contexts are not hashed, else the ergodic estimate."""
        return self.estimated_rates() if self.hashed else self.exact_rates()


class SyntheticCorpus:
    """Endless batches from a MarkovSource: fresh tokens every step, fixed validation set."""

    def __init__(
        self,
        cfg: SyntheticData,
        vocab: int,
        seq_len: int,
        batch_size: int,
        eval_batches: int,
        seed: int,
    ) -> None:
        self.source = MarkovSource(
            vocab, cfg.order, cfg.branching, cfg.concentration, cfg.source_seed
        )
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.eval_batches = eval_batches
        self.entropy_rate, self._unigram = self.source.rates()
        self._chunk: tuple[int, np.ndarray] | None = None

    def train_batch(self, step: int) -> np.ndarray:
        chunk, index = divmod(step, CHUNK_STEPS)
        if self._chunk is None or self._chunk[0] != chunk:
            rng = np.random.default_rng([self.source.seed, _TRAIN_STREAM, self.seed, chunk])
            tokens, _ = self.source.sample(rng, CHUNK_STEPS * self.batch_size, self.seq_len + 1)
            self._chunk = (chunk, tokens)
        rows = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return self._chunk[1][rows]

    def val_batches(self) -> list[np.ndarray]:
        rng = np.random.default_rng([self.source.seed, _VAL_STREAM])
        tokens, _ = self.source.sample(rng, self.eval_batches * self.batch_size, self.seq_len + 1)
        return list(tokens.reshape(self.eval_batches, self.batch_size, -1))

    def unigram_entropy(self) -> float:
        return self._unigram


def _load_token_file(path: str, dtype: str, min_tokens: int) -> np.ndarray:
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"token file {path} does not exist")
    itemsize = np.dtype(dtype).itemsize
    size = file.stat().st_size
    if size % itemsize:
        raise ValueError(
            f"token file {path}: size {size} bytes is not a multiple of the "
            f"{dtype} item size {itemsize}; corrupt or wrong dtype"
        )
    if size // itemsize < min_tokens:
        raise ValueError(
            f"token file {path} holds {size // itemsize} tokens; at least "
            f"{min_tokens} (seq_len + 1) are needed"
        )
    return np.memmap(file, dtype=dtype, mode="r")


def _load_text_file(path: str, min_tokens: int) -> np.ndarray:
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"text file {path} does not exist")
    raw = file.read_bytes()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"text file {path} is not valid UTF-8 ({err})") from None
    if len(raw) < min_tokens:
        raise ValueError(
            f"text file {path} holds {len(raw)} bytes; at least {min_tokens} "
            "(seq_len + 1) are needed"
        )
    return np.frombuffer(raw, dtype=np.uint8)


class WindowCorpus:
    """Non-overlapping (seq_len + 1)-token windows of files, shuffled per epoch by seed."""

    def __init__(
        self,
        train: Sequence[np.ndarray],
        validation: Sequence[np.ndarray],
        names: tuple[Sequence[str], Sequence[str]],
        vocab: int,
        seq_len: int,
        batch_size: int,
        eval_batches: int,
        seed: int,
    ) -> None:
        self.width, self.vocab, self.seed = seq_len + 1, vocab, seed
        self.batch_size, self.eval_batches = batch_size, eval_batches
        self.train, self.validation = list(train), list(validation)
        self.names = names
        self.entropy_rate = None
        self._starts = np.cumsum([0] + [len(a) // self.width for a in self.train])
        self._perms: dict[int, np.ndarray] = {}

    def _window(
        self, arrays: list[np.ndarray], names: Sequence[str], starts: np.ndarray, index: int
    ) -> np.ndarray:
        file = int(np.searchsorted(starts, index, side="right") - 1)
        offset = (index - starts[file]) * self.width
        window = np.asarray(arrays[file][offset : offset + self.width], dtype=np.int64)
        if window.max() >= self.vocab:
            raise ValueError(
                f"{names[file]}: token id {int(window.max())} at offset "
                f"{offset + int(window.argmax())} is >= vocab_size={self.vocab}"
            )
        return window

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            rng = np.random.default_rng([self.seed, _TRAIN_STREAM, epoch])
            self._perms = {epoch: rng.permutation(int(self._starts[-1]))}  # keep one epoch
        return self._perms[epoch]

    def train_batch(self, step: int) -> np.ndarray:
        n_windows = int(self._starts[-1])
        rows = []
        for g in range(step * self.batch_size, (step + 1) * self.batch_size):
            epoch, position = divmod(g, n_windows)
            index = int(self._permutation(epoch)[position])
            rows.append(self._window(self.train, self.names[0], self._starts, index))
        return np.stack(rows)

    def val_batches(self) -> list[np.ndarray]:
        starts = np.cumsum([0] + [len(a) // self.width for a in self.validation])
        needed = self.eval_batches * self.batch_size
        # Small validation sets are cycled rather than refused.
        rows = [
            self._window(self.validation, self.names[1], starts, i % int(starts[-1]))
            for i in range(needed)
        ]
        return list(np.stack(rows).reshape(self.eval_batches, self.batch_size, -1))

    def unigram_entropy(self) -> float:
        counts = np.zeros(self.vocab, dtype=np.float64)
        for array in self.train:
            # Leading _UNIGRAM_CAP tokens per file: enough for a frequency estimate.
            counts += np.bincount(np.asarray(array[:_UNIGRAM_CAP]), minlength=self.vocab)
        return float(entropy(counts / counts.sum()))


def build_data(spec: RunSpec) -> DataSource:
    """The data source a run trains on."""
    data, model, train = spec.data, spec.model, spec.train
    common = dict(
        seq_len=model.seq_len,
        batch_size=train.batch_size,
        eval_batches=train.eval_batches,
        seed=spec.seed,
    )
    if isinstance(data, SyntheticData):
        return SyntheticCorpus(data, model.vocab_size, **common)
    width = model.seq_len + 1
    if isinstance(data, TokenFileData):
        load = partial(_load_token_file, dtype=data.dtype, min_tokens=width)
    elif isinstance(data, TextFileData):
        if model.vocab_size < 256:
            raise ValueError(f"byte-level text needs vocab_size >= 256, got {model.vocab_size}")
        load = partial(_load_text_file, min_tokens=width)
    else:
        raise TypeError(f"unknown data config {type(data).__name__}")
    if not data.train or not data.validation:
        raise ValueError("data config needs at least one train and one validation file")
    train_arrays = [load(p) for p in data.train]
    val_arrays = [load(p) for p in data.validation]
    return WindowCorpus(
        train_arrays, val_arrays, (data.train, data.validation), model.vocab_size, **common
    )
