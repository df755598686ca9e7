"""The memory-augmented lookup dictionary of paper 002 (§2): a hashed table of vectors the LM's last layer reads.

Indexing (§2.1). Position ``k`` of a token sequence is mapped to one of ``U`` buckets by the ids of its last ``N``
tokens (itself included): ``hash="sum"`` is the paper's Eq. 2, ``i = (sum of the N ids) mod U``, which cannot tell
"a b" from "b a" and, on a vocabulary of ``V`` ids, reaches at most ``N (V - 1) + 1`` buckets whatever ``U`` is.
``hash="ordered"`` (a deviation from the paper, for comparison) is a polynomial rolling hash: the ids are the digits
of a number in base :data:`ORDERED_MULTIPLIER` (odd) taken mod the prime :data:`ORDERED_MODULUS`, scrambled by
:func:`ordered_finalizer`, then taken mod ``U``; on a small vocabulary it reaches about as many buckets as a random
function of the n-gram would.
The first ``N - 1`` positions of a sequence see ``pad_id`` (the beginning-of-document id) before them; incremental
decoding passes the ids before its first position as ``history`` (:func:`next_history` carries it from call to call).

Memory and update (§2.2). ``D`` is ``(U, M, d)``. After a training step's read, for every position ``(b, k)`` with a
next token ``t`` and every slot ``m`` of its bucket ``i``, with probability ``P(t) = min(1, 1 / ln count(t))``
(``count(t) <= 1``: ``P = 1``; the clamp also covers ``1 < count < e``, where ``1 / ln`` exceeds 1) the slot becomes
``alpha * D[i, m] + (1 - alpha) * e(t)`` (Eq. 3, ``alpha = 0.5``), ``e`` the LM's embedding weight, ``count`` the
next-token counts of the LM's training text (:meth:`LookupMemory.set_counts`). ``draw="vector"`` draws each of the
``M`` slots independently (the paper: "decides how many vectors will be updated"); ``draw="bucket"`` draws once for
all ``M``. Uniforms are drawn up front, one ``(B, T, M)`` (or ``(B, T, 1)``) tensor per step from the module's own
generator, at every position, padding included, so the random stream depends only on the batch shape. Several hits
on one slot in one step apply in token order, batch row first then position (``b``-major, then ``k``);
:meth:`LookupMemory.update` does this in one vectorised pass (closed form of the repeated Eq. 3) and equals the
reference loop :meth:`LookupMemory.update_loop` up to float rounding. No update in eval mode (§2.4: "disabled to
avoid any information leakage") nor before ``warmup_steps`` training calls (§2.4: 1000 steps).

Reading (§2.3). ``c~ = softmax(c D_i^T / sqrt(d)) D_i`` (Eq. 5-6) for the last layer's output ``c``. The paper
can be read two ways, and both are named readings here, neither "the paper's":

* ``combine="replace"`` returns ``c~`` (Eq. 6 taken literally: ``c~`` "will then be used to calculate the output
  token distribution"); ``combine="add"`` returns ``c + c~``: the LM keeps its own path, as §2.4's 1000 steps to
  "warmup the newly initialized embedding", §3.3's larger LM that "would take over part of the functionalities the
  memory block provides" and the method it is "inspired by" (Taking Notes on the Fly, which adds notes) suggest.
  The default is ``replace``, the literal one, so a setting made before the readings were named means what it did.
* ``trainable=False`` (default): ``D`` is written only by Eq. 3, a buffer without gradient; ``trainable=True`` makes
  it a parameter that also receives gradients (and is still overwritten by Eq. 3 in place), as §4's "a larger
  memory would receive more gradients" and "a well-trained one" suggest. A choice the paper does not state.

Turning it off: there is no ``enabled`` flag. A model holds ``LookupMemory | None`` (its config ``MemoryConfig |
None``); ``None`` is the plain LM.

Size. ``D`` holds ``U * M * d`` numbers: 327M at the paper's U=5000, M=64, d=1024, several times the 72M-parameter
LM, and tens of times a small one (:func:`dictionary_elements`, :meth:`LookupMemory.memory_bytes`). Any gain of the
memory is confounded with that extra capacity; results must say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from asr_core.config.parse import ConfigError

HASHES = ("sum", "ordered")
COMBINES = ("replace", "add")
DRAWS = ("vector", "bucket")
ORDERED_MULTIPLIER = 2654435761  # odd (Knuth's multiplicative-hash constant), the base of the ordered hash
ORDERED_MODULUS = 2**31 - 1  # prime: distinct n-grams of ids below it differ before the final mod U
MAX_BUCKETS = ORDERED_MODULUS


def _require(cond: bool, key: str, value: Any, valid: str) -> None:
    if not cond:
        raise ConfigError(f"invalid value for '{key}': {value!r}; valid: {valid}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class MemoryConfig:
    """The lookup dictionary. ``MemoryConfig()`` is the paper's LibriSpeech setting (U=5k, M=64, 2-gram sum hash);
    its Chinese setting is ``MemoryConfig(buckets=10000)``."""

    buckets: int = 5000  # U (§3.2: 5k LibriSpeech, 10k Chinese)
    slots: int = 64  # M, vectors per bucket (§3.2, §4)
    order: int = 2  # N, ids hashed per position (Eq. 2)
    hash: str = "sum"  # "sum": Eq. 2; "ordered": polynomial rolling hash (deviation, see the module docstring)
    combine: str = "replace"  # a reading: "replace": c~ replaces c (Eq. 6 literally); "add": c + c~ (the LM's own path)
    trainable: bool = False  # a reading: False: D written only by Eq. 3, no gradient; True: D also learns
    draw: str = "vector"  # "vector": one Bernoulli draw per slot; "bucket": one per position for all M slots
    warmup_steps: int = 1000  # training calls before the first update (§2.4)
    alpha: float = 0.5  # Eq. 3 smoothing: new = alpha * old + (1 - alpha) * e (§2.2: 0.5)
    init_std: float = 0.02  # D starts as N(0, init_std^2) (the paper does not say; the LM's embedding init)
    seed: int = 0  # D's initial values (seed) and the update draws (seed + 1)

    def __post_init__(self) -> None:
        _require(_is_int(self.buckets) and 1 <= self.buckets <= MAX_BUCKETS, "lm.memory.buckets", self.buckets,
                 f"an integer in [1, {MAX_BUCKETS}] (the paper: 5000 or 10000)")
        _require(_is_int(self.slots) and self.slots >= 1, "lm.memory.slots", self.slots,
                 "a positive integer (the paper: 64)")
        _require(_is_int(self.order) and 1 <= self.order <= 16, "lm.memory.order", self.order,
                 "an integer in [1, 16] (the paper: 2)")
        _require(self.hash in HASHES, "lm.memory.hash", self.hash, ", ".join(HASHES))
        _require(self.combine in COMBINES, "lm.memory.combine", self.combine, ", ".join(COMBINES))
        _require(isinstance(self.trainable, bool), "lm.memory.trainable", self.trainable, "true or false")
        _require(self.draw in DRAWS, "lm.memory.draw", self.draw, ", ".join(DRAWS))
        _require(_is_int(self.warmup_steps) and self.warmup_steps >= 0, "lm.memory.warmup_steps", self.warmup_steps,
                 "an integer >= 0 (the paper: 1000)")
        _require(isinstance(self.alpha, (int, float)) and 0.0 <= self.alpha < 1.0, "lm.memory.alpha", self.alpha,
                 "a number in [0, 1) (the paper: 0.5)")
        _require(isinstance(self.init_std, (int, float)) and self.init_std > 0, "lm.memory.init_std", self.init_std,
                 "a positive number")
        _require(_is_int(self.seed) and self.seed >= 0, "lm.memory.seed", self.seed, "an integer >= 0")


# ---- indexing ---------------------------------------------------------------------------------------------------
def bucket_ids(tokens: torch.Tensor, pad_id: int, cfg: MemoryConfig, history: torch.Tensor | None = None
               ) -> torch.Tensor:
    """The bucket of every position: tokens (B, T) long ids >= 0 -> (B, T) long in ``[0, cfg.buckets)``.

    Position ``k`` hashes the ids ``k - N + 1 .. k``; ids before the first position come from ``history`` (B, N - 1)
    (oldest first: what a decoder carries between calls, :func:`next_history`), or are ``pad_id`` when it is None.
    """
    n = cfg.order
    if tokens.dim() != 2 or tokens.dtype != torch.long:
        raise ValueError(f"tokens must be (B, T) long, got {tuple(tokens.shape)} {tokens.dtype}")
    b = tokens.shape[0]
    if history is None:
        history = torch.full((b, n - 1), int(pad_id), dtype=torch.long, device=tokens.device)
    elif history.shape != (b, n - 1):
        raise ValueError(f"history must be (B, N - 1) = ({b}, {n - 1}): the {n - 1} ids before the first position "
                         f"of each row; got {tuple(history.shape)}")
    ext = torch.cat([history.to(device=tokens.device, dtype=torch.long), tokens], 1)  # (B, N - 1 + T)
    if ext.numel() and int(ext.min()) < 0:
        raise ValueError("token ids (and history, pad_id) must be >= 0; mask padding with a real id such as pad_id")
    windows = ext.unfold(1, n, 1)  # (B, T, N), oldest id first
    if cfg.hash == "sum":
        return windows.sum(-1) % cfg.buckets
    h = torch.zeros(windows.shape[:2], dtype=torch.long, device=tokens.device)
    mult = ORDERED_MULTIPLIER % ORDERED_MODULUS
    for j in range(n):  # Horner: h < 2^31 and mult < 2^31, so h * mult fits in int64
        h = (h * mult + windows[..., j] % ORDERED_MODULUS) % ORDERED_MODULUS
    return ordered_finalizer(h) % cfg.buckets


def ordered_finalizer(h: torch.Tensor) -> torch.Tensor:
    """Scramble the polynomial value h (...) long in ``[0, 2^31)`` before the final mod U: xor-shift, multiply mod
    the prime, xor-shift. Without it the ids of a window's last token, consecutive numbers, land in consecutive
    buckets and the hash reaches far fewer buckets than a random one would."""
    h = h ^ (h >> 16)
    h = h * (ORDERED_MULTIPLIER % ORDERED_MODULUS) % ORDERED_MODULUS
    return h ^ (h >> 16)


def next_history(history: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """The ``N - 1`` ids before the next call's first position: the last ``N - 1`` of ``history`` then each row's
    valid tokens. history (B, N - 1), tokens (B, T), lengths (B,) valid tokens per row (None: all T) -> (B, N - 1)."""
    b, keep = history.shape
    if tokens.dim() != 2 or tokens.shape[0] != b:
        raise ValueError(f"tokens must be (B, T) with B = {b}, got {tuple(tokens.shape)}")
    ext = torch.cat([history.to(tokens.device), tokens], 1)
    if lengths is None:
        return ext[:, ext.shape[1] - keep:]
    idx = lengths.to(device=tokens.device, dtype=torch.long)[:, None] + torch.arange(keep, device=tokens.device)
    return ext.gather(1, idx)


def occupancy(ids: torch.Tensor, buckets: int, valid: torch.Tensor | None = None) -> float:
    """Share of the ``buckets`` that the positions ``ids`` (any shape, ``valid`` of the same shape) reach."""
    reached = ids if valid is None else ids[valid.to(torch.bool)]
    return torch.unique(reached).numel() / buckets


def update_probabilities(counts: torch.Tensor) -> torch.Tensor:
    """Eq. 4 with its clamp: ``P = min(1, 1 / ln count)``, and 1 for ``count <= 1``. counts (...) -> float64 (...)."""
    c = counts.to(torch.float64)
    safe = torch.where(c > 1, c, torch.full_like(c, math.e))
    return torch.where(c > 1, (1.0 / torch.log(safe)).clamp(max=1.0), torch.ones_like(c))


def dictionary_elements(cfg: MemoryConfig, d_model: int) -> int:
    """Numbers held by ``D``: ``U * M * d`` (327,680,000 at the paper's U=5000, M=64, d=1024)."""
    return cfg.buckets * cfg.slots * d_model


# ---- the module -------------------------------------------------------------------------------------------------
class LookupMemory(nn.Module):
    """The dictionary ``D`` (U, M, d), the next-token counts (V,) that set the update probabilities, a step counter
    and the generator of the update draws (saved apart from ``state_dict``: :meth:`generator_state`)."""

    def __init__(self, cfg: MemoryConfig, d_model: int, vocab_size: int) -> None:
        super().__init__()
        if not (_is_int(d_model) and d_model > 0 and _is_int(vocab_size) and vocab_size > 0):
            raise ValueError(f"d_model and vocab_size must be positive integers, got {d_model!r}, {vocab_size!r}")
        self.cfg, self.d_model, self.vocab_size = cfg, d_model, vocab_size
        g = torch.Generator().manual_seed(cfg.seed)
        init = torch.randn((cfg.buckets, cfg.slots, d_model), generator=g) * cfg.init_std
        if cfg.trainable:
            self.D = nn.Parameter(init)
        else:
            self.register_buffer("D", init)
        self.register_buffer("counts", torch.zeros(vocab_size, dtype=torch.long))
        self.register_buffer("step", torch.zeros((), dtype=torch.long))
        self._gen: torch.Generator | None = None

    # ---- counts and generator ---------------------------------------------------------------------------------
    def set_counts(self, counts: torch.Tensor) -> None:
        """counts (V,) integer occurrences of each id as a next token in the LM's training text, e.g.
        ``torch.bincount(targets.flatten(), minlength=V)``."""
        counts = torch.as_tensor(counts)
        if counts.shape != (self.vocab_size,) or counts.is_floating_point() or counts.dtype == torch.bool:
            raise ValueError(f"counts must be integer (V,) = ({self.vocab_size},), got {tuple(counts.shape)} "
                             f"{counts.dtype}; use torch.bincount(next_tokens, minlength={self.vocab_size})")
        if bool((counts < 0).any()) or not bool((counts > 0).any()):
            raise ValueError("counts must be >= 0 with at least one token seen: count the training text's tokens")
        with torch.no_grad():
            self.counts.copy_(counts.to(self.counts.device, torch.long))

    def _generator(self) -> torch.Generator:
        """The update generator on D's device; made on first use (or after a move to another device) from
        ``cfg.seed + 1``: restore a saved state after moving the module."""
        dev = self.D.device
        if self._gen is None or self._gen.device != dev:
            self._gen = torch.Generator(device=dev).manual_seed(self.cfg.seed + 1)
        return self._gen

    def generator_state(self) -> torch.Tensor:
        """The update generator's state (a CPU byte tensor), to save beside ``state_dict()``."""
        return self._generator().get_state().clone()

    def load_generator_state(self, state: torch.Tensor) -> None:
        """Restore :meth:`generator_state`; the module must be on the device type the state was saved from."""
        try:
            self._generator().set_state(state.detach().cpu())
        except RuntimeError as e:
            raise ValueError(f"cannot load this generator state on {self.D.device}: it was saved on another kind "
                             f"of device; move the memory there first ({e})") from None

    # ---- reading ----------------------------------------------------------------------------------------------
    def read(self, c: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """c (B, T, d) the last layer's output, ids (B, T) long buckets -> (B, T, d): ``c~ = softmax(c D_i^T /
        sqrt(d)) D_i`` (``combine="replace"``) or ``c + c~`` (``"add"``), ``D_i`` (M, d) the bucket's slots.
        Gathers ``D_i`` for every position: (B, T, M, d) in ``c``'s dtype, kept for the backward pass."""
        if c.dim() != 3 or c.shape[-1] != self.d_model:
            raise ValueError(f"c must be (B, T, d) with d = {self.d_model}, got {tuple(c.shape)}")
        if ids.shape != c.shape[:2]:
            raise ValueError(f"ids must be (B, T) = {tuple(c.shape[:2])} (one bucket per position), got "
                             f"{tuple(ids.shape)}; make them with bucket_ids(...)")
        d_i = self.D[ids.to(self.D.device)].to(c.dtype)  # (B, T, M, d)
        scores = torch.matmul(d_i, c.unsqueeze(-1)).squeeze(-1) / math.sqrt(self.d_model)  # (B, T, M)
        weights = torch.softmax(scores, dim=-1)
        c_tilde = torch.matmul(weights.unsqueeze(-2), d_i).squeeze(-2)  # (B, T, d)
        return c_tilde if self.cfg.combine == "replace" else c + c_tilde

    def forward(self, c: torch.Tensor, ids: torch.Tensor, next_tokens: torch.Tensor | None = None,
                embedding: torch.Tensor | None = None, valid: torch.Tensor | None = None) -> torch.Tensor:
        """One training (or eval) step's use: :meth:`read` with the memory as it is, then, given ``next_tokens``
        and ``embedding``, :meth:`update` (which does nothing in eval mode). Returns the read (B, T, d)."""
        out = self.read(c, ids)
        if next_tokens is not None:
            if embedding is None:
                raise ValueError("next_tokens given without embedding: pass the LM's embedding weight (V, d)")
            self.update(ids, next_tokens, embedding, valid)
        return out

    # ---- updating ---------------------------------------------------------------------------------------------
    def update_probability(self, next_tokens: torch.Tensor) -> torch.Tensor:
        """P of Eq. 4 for every next token: (B, T) long -> (B, T) float64."""
        return update_probabilities(self.counts)[next_tokens.to(self.counts.device)]

    def _hits(self, ids: torch.Tensor, next_tokens: torch.Tensor, embedding: torch.Tensor,
              valid: torch.Tensor | None) -> torch.Tensor | None:
        """Check the inputs, count the step, draw: (B, T, M) bool, True where slot ``m`` of position ``(b, k)``'s
        bucket takes the next token; None when this call updates nothing (eval mode, warm-up)."""
        if ids.dim() != 2 or next_tokens.shape != ids.shape:
            raise ValueError(f"ids and next_tokens must both be (B, T), got {tuple(ids.shape)} and "
                             f"{tuple(next_tokens.shape)}")
        if valid is not None and valid.shape != ids.shape:
            raise ValueError(f"valid must be (B, T) = {tuple(ids.shape)}, got {tuple(valid.shape)}")
        if embedding.shape != (self.vocab_size, self.d_model):
            raise ValueError(f"embedding must be the LM's embedding weight (V, d) = ({self.vocab_size}, "
                             f"{self.d_model}), got {tuple(embedding.shape)}")
        if not self.training:
            return None
        step = int(self.step)
        self.step.add_(1)
        if step < self.cfg.warmup_steps:
            return None
        if not bool((self.counts > 0).any()):
            raise RuntimeError("the memory's token counts are unset: call set_counts(...) with the training text's "
                               "next-token counts before training past warmup_steps")
        dev = self.D.device
        b, t = ids.shape
        width = self.cfg.slots if self.cfg.draw == "vector" else 1
        u = torch.rand((b, t, width), generator=self._generator(), device=dev)
        p = self.update_probability(next_tokens).to(dev)  # (B, T) float64
        hit = u.to(torch.float64) < p[..., None]
        if valid is not None:
            hit = hit & valid.to(device=dev, dtype=torch.bool)[..., None]
        return hit.expand(b, t, self.cfg.slots)

    @torch.no_grad()
    def update(self, ids: torch.Tensor, next_tokens: torch.Tensor, embedding: torch.Tensor,
               valid: torch.Tensor | None = None) -> None:
        """Eq. 3 for every position at once (training mode, from ``warmup_steps`` on; call it after the step's
        :meth:`read`). ids, next_tokens (B, T) long; embedding (V, d); valid (B, T) bool, False: no next token.

        A slot hit by ``n`` positions in order (``b``-major, then ``k``) with embeddings ``e_1 .. e_n`` becomes
        ``alpha^n d + (1 - alpha) sum_r alpha^(n - r) e_r``: the loop of :meth:`update_loop` in closed form."""
        hit = self._hits(ids, next_tokens, embedding, valid)
        if hit is None:
            return
        dev, m, alpha = self.D.device, self.cfg.slots, float(self.cfg.alpha)
        n_pos = ids.numel()
        pos, slot = hit.reshape(n_pos, m).nonzero(as_tuple=True)  # position-major, hence token order
        if pos.numel() == 0:
            return
        key = ids.to(dev).reshape(-1)[pos] * m + slot  # flat slot index into D viewed as (U * M, d)
        groups, inverse, sizes = torch.unique(key, return_inverse=True, return_counts=True)
        order = torch.sort(inverse, stable=True).indices  # slots grouped, token order kept inside each
        inv_sorted, pos_sorted = inverse[order], pos[order]
        starts = torch.cumsum(sizes, 0) - sizes
        rank = torch.arange(order.numel(), device=dev) - starts[inv_sorted]
        later = (sizes[inv_sorted] - 1 - rank).to(self.D.dtype)  # hits after this one on the same slot
        w = (1.0 - alpha) * torch.pow(torch.tensor(alpha, dtype=self.D.dtype, device=dev), later)
        e = embedding.detach().to(device=dev, dtype=self.D.dtype)[next_tokens.to(dev).reshape(-1)]  # (B * T, d)
        with torch.sparse.check_sparse_tensor_invariants(enable=True):
            # (G, B * T) weights, sorted without duplicates: never materialises one d-vector per hit
            mix = torch.sparse_coo_tensor(torch.stack([inv_sorted, pos_sorted]), w, (groups.numel(), n_pos),
                                          is_coalesced=True)
            added = torch.sparse.mm(mix, e)  # (G, d)
        scale = torch.pow(torch.tensor(alpha, dtype=self.D.dtype, device=dev), sizes.to(self.D.dtype))
        flat = self.D.data.view(-1, self.d_model)
        flat[groups] = flat[groups] * scale[:, None] + added

    @torch.no_grad()
    def update_loop(self, ids: torch.Tensor, next_tokens: torch.Tensor, embedding: torch.Tensor,
                    valid: torch.Tensor | None = None) -> None:
        """The reference for :meth:`update`: the same gating and draws, Eq. 3 applied one position and slot at a
        time, ``b``-major then ``k``. Slow; for tests."""
        hit = self._hits(ids, next_tokens, embedding, valid)
        if hit is None:
            return
        alpha = float(self.cfg.alpha)
        emb = embedding.detach().to(device=self.D.device, dtype=self.D.dtype)
        d = self.D.data
        for b in range(ids.shape[0]):
            for k in range(ids.shape[1]):
                i, e = int(ids[b, k]), emb[int(next_tokens[b, k])]
                for m in range(self.cfg.slots):
                    if bool(hit[b, k, m]):
                        d[i, m] = d[i, m] * alpha + e * (1.0 - alpha)

    # ---- size -------------------------------------------------------------------------------------------------
    def memory_bytes(self) -> dict[str, int]:
        """Bytes held: ``dictionary`` (D), ``parameters`` (D when trainable, else 0), ``buffers`` (D when not
        trainable, counts, step), ``total``. Compare with the LM's parameters: D alone is many times a small LM."""
        params = sum(p.numel() * p.element_size() for p in self.parameters())
        buffers = sum(b.numel() * b.element_size() for b in self.buffers())
        return {"dictionary": self.D.numel() * self.D.element_size(), "parameters": params, "buffers": buffers,
                "total": params + buffers}

    def extra_repr(self) -> str:
        c = self.cfg
        return (f"U={c.buckets}, M={c.slots}, N={c.order}, d={self.d_model}, hash={c.hash}, combine={c.combine}, "
                f"draw={c.draw}, trainable={c.trainable}")
