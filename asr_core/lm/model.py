"""The Transformer LM of paper 004 (§3.2) with a key-value cache for incremental decoding and beam search.

Pre-norm blocks (RMSNorm) of multi-query attention with QK-norm and a GEGLU feed-forward; positions enter only as a
dynamic position bias (an MLP of the query-key *distance*, added to every attention score). Nothing depends on a
token's absolute position, so keys and values computed once stay valid wherever the window of remembered tokens
starts: the cache can be cut to its last ``n`` tokens (:meth:`KVCache.trim`) without recomputing anything.

Context semantics (Transformer-XL, as the authors' beam search ran it): a cached key or value holds whatever its
token saw when it was computed. Decoding with the cache trimmed to ``n`` after every step is therefore exactly a
full forward pass in which every token attends to itself and at most ``n`` earlier tokens *at every layer*
(``forward(..., window=n)``), not a forward pass over the last ``n`` tokens alone: a deeper layer's cached keys
still carry what their tokens saw further back. The two are the same for a one-layer model.

Cache layout: keys and values of every layer, ``(L, B, S, D)`` (one head: multi-query), **right-aligned**: row ``b``
holds its ``lengths[b]`` tokens in the last columns ``S - lengths[b] .. S - 1``. One new token per row (a beam
search step) is then a plain concatenation, trimming a slice, and selecting rows by parent beam an index.

Lookup memory (paper 002, ``cfg.memory``; :mod:`asr_core.lm.memory`). The "c" the memory reads (Eq. 6: the
contextualised embedding that "will then be used to calculate the output token distribution") is the output of the
final RMSNorm, the vector the output layer scores: ``c = norm(x_L)``, ``c~ = memory.read(c, ids)``, logits =
``output(c~)``, with ``ids = bucket_ids(tokens, bos_id, cfg.memory, history)`` and ``history`` the ``N - 1`` ids
before each row's first new token, carried by the cache (:attr:`KVCache.history`; bos padding for a fresh row).
In training mode the memory is then updated (Eq. 3) with each position's next token (``targets``, or the inputs
shifted by one): the step's logits come from the memory as it was before the step. Eval mode never updates.
The output layer is tied to the input embedding when ``cfg.tie_embeddings`` (required by a memory).

Token history: a cache of a model with a memory also carries each row's last ``N - 1`` token ids (``history``,
(B, N - 1), oldest first) and the beginning-of-document id they start from (``bos_id``). Unlike keys and values, the
history is not cut by :meth:`KVCache.trim`: the memory's bucket always hashes the true preceding ids, as in a full
forward pass over the whole sequence. A model without a memory leaves ``history`` None.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from asr_core.lm.config import LMConfig
from asr_core.lm.memory import LookupMemory, bucket_ids, dictionary_elements, next_history


@dataclass(frozen=True, eq=False)
class KVCache:
    """Keys and values of the tokens a batch of sequences remembers (see the module docstring for the layout).

    keys, values: (L, B, S, D); lengths: (B,) long, the tokens row ``b`` holds (its last ``lengths[b]`` columns).
    Keys are stored after QK-norm. history: (B, N - 1) long, each row's last ``N - 1`` token ids, oldest first (a
    model with a memory; None otherwise), never trimmed; bos_id: the id a forgotten row's history restarts from
    (required with a history). Immutable: every method returns a new cache.
    """

    keys: torch.Tensor
    values: torch.Tensor
    lengths: torch.Tensor
    history: torch.Tensor | None = None
    bos_id: int | None = None

    def __post_init__(self) -> None:
        if self.keys.dim() != 4 or self.keys.shape != self.values.shape:
            raise ValueError(f"KVCache keys and values must be (L, B, S, D) of one shape, got "
                             f"{tuple(self.keys.shape)} and {tuple(self.values.shape)}")
        if self.lengths.shape != (self.keys.shape[1],):
            raise ValueError(f"KVCache lengths must be (B,) = ({self.keys.shape[1]},), got "
                             f"{tuple(self.lengths.shape)}")
        if self.history is not None:
            if self.history.dim() != 2 or self.history.shape[0] != self.keys.shape[1] or \
                    self.history.dtype != torch.long:
                raise ValueError(f"KVCache history must be (B, N - 1) long with B = {self.keys.shape[1]}, got "
                                 f"{tuple(self.history.shape)} {self.history.dtype}")
            if self.bos_id is None:
                raise ValueError("a KVCache with a history needs bos_id (what a forgotten row restarts from)")

    def _with(self, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
              history: torch.Tensor | None) -> "KVCache":
        return KVCache(keys, values, lengths, history, self.bos_id)

    @property
    def batch_size(self) -> int:
        return self.keys.shape[1]

    @property
    def size(self) -> int:
        """S: columns held (the longest row)."""
        return self.keys.shape[2]

    def select(self, index: torch.Tensor | list[int]) -> "KVCache":
        """Rows ``index`` (N,) in that order, repeats allowed: beams gathered by parent."""
        idx = torch.as_tensor(index, dtype=torch.long, device=self.keys.device)
        history = None if self.history is None else self.history.index_select(0, idx.to(self.history.device))
        return self._with(self.keys.index_select(1, idx), self.values.index_select(1, idx),
                          self.lengths.index_select(0, idx), history)._shrink()

    def trim(self, n: int) -> "KVCache":
        """Each row's last ``n`` tokens (all of a shorter row). Positions are relative, so nothing moves. The token
        history is kept whole (the memory's buckets hash the true preceding ids)."""
        if n < 0:
            raise ValueError(f"cannot trim a cache to {n} tokens; give n >= 0")
        if self.size <= n:
            return self
        return self._with(self.keys[:, :, self.size - n:], self.values[:, :, self.size - n:],
                          self.lengths.clamp(max=n), self.history)

    def concat(self, other: "KVCache") -> "KVCache":
        """The rows of ``self`` then those of ``other`` (the shorter one padded on the left)."""
        if (self.history is None) != (other.history is None) or (
                self.history is not None and (self.bos_id != other.bos_id or
                                              self.history.shape[1] != other.history.shape[1])):
            raise ValueError("cannot concatenate caches of different models (one carries a memory's token history "
                             "that the other lacks, or another history length or bos_id); build both with one LM")
        s = max(self.size, other.size)
        parts = [(c.keys, c.values) if c.size == s else
                 (F.pad(c.keys, (0, 0, s - c.size, 0)), F.pad(c.values, (0, 0, s - c.size, 0))) for c in (self, other)]
        history = None if self.history is None or other.history is None else \
            torch.cat([self.history, other.history.to(self.history.device)])
        return self._with(torch.cat([parts[0][0], parts[1][0]], 1), torch.cat([parts[0][1], parts[1][1]], 1),
                          torch.cat([self.lengths, other.lengths]), history)

    def forget(self, rows: torch.Tensor) -> "KVCache":
        """Rows where ``rows`` (B,) bool is True start afresh (hold nothing; their history back to ``bos_id``
        padding): a new document in that lane."""
        lengths = torch.where(rows.to(self.lengths.device), torch.zeros_like(self.lengths), self.lengths)
        history = self.history
        if history is not None:
            history = torch.where(rows.to(history.device)[:, None], torch.full_like(history, int(self.bos_id)),
                                  history)
        return self._with(self.keys, self.values, lengths, history)._shrink()

    def detach(self) -> "KVCache":
        """The same cache cut from the autograd graph (Transformer-XL training attends to it without gradient)."""
        return self._with(self.keys.detach(), self.values.detach(), self.lengths, self.history)

    def to(self, device: torch.device | str) -> "KVCache":
        history = None if self.history is None else self.history.to(device)
        return self._with(self.keys.to(device), self.values.to(device), self.lengths.to(device), history)

    def _shrink(self) -> "KVCache":
        """Drop leading columns that no row uses (after a selection left only shorter rows)."""
        longest = int(self.lengths.max()) if self.batch_size else 0
        return self if longest >= self.size else self.trim(longest)


class DynamicPositionBias(nn.Module):
    """An MLP from a query-key distance to one additive attention bias per head (Wang's x-transformers, as in the
    authors' code: raw distances, SiLU, ``depth`` hidden layers of ``width``)."""

    def __init__(self, width: int, heads: int, depth: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(1, width), nn.SiLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.SiLU()]
        layers.append(nn.Linear(width, heads))
        self.mlp = nn.Sequential(*layers)

    def forward(self, distances: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Biases for distances ``0 .. distances - 1``: (distances, H) in ``dtype``. Computed in the weights' own
        precision, outside autocast: bf16 cannot tell distance 1021 from 1020."""
        w = self.mlp[0].weight
        with torch.autocast(device_type=device.type, enabled=False):
            table = self.mlp(torch.arange(distances, device=device, dtype=w.dtype)[:, None])
        return table.to(dtype)


class MultiQueryAttention(nn.Module):
    """``heads`` query heads sharing one key/value head; QK-norm: unit-length queries and keys, scores scaled by a
    learned scalar."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.q = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.kv = nn.Linear(cfg.d_model, 2 * cfg.head_dim, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.scale = nn.Parameter(torch.tensor(float(cfg.qk_scale)))

    def forward(self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None, mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, d); past keys and values (B, S, D) or None; mask (B, H, T, S + T) additive (bias, -inf).
        Returns the output (B, T, d) and the keys and values of past + new tokens, (B, S + T, D) each."""
        b, t, _ = x.shape
        q = F.normalize(self.q(x).view(b, t, self.heads, self.head_dim), dim=-1).transpose(1, 2)  # (B, H, T, D)
        k, v = self.kv(x).split(self.head_dim, dim=-1)  # (B, T, D) each
        k = F.normalize(k, dim=-1)
        if past is not None:
            k, v = torch.cat([past[0], k], 1), torch.cat([past[1], v], 1)
        out = F.scaled_dot_product_attention(q * self.scale, k[:, None], v[:, None], attn_mask=mask, scale=1.0,
                                             enable_gqa=True)
        return self.out(out.transpose(1, 2).reshape(b, t, -1)), k, v


class GEGLU(nn.Module):
    """x -> W2 (a * GELU(g)), [a, g] = W1 x."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, 2 * hidden)
        self.w2 = nn.Linear(hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, g = self.w1(x).chunk(2, dim=-1)
        return self.w2(a * F.gelu(g))


class Block(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = MultiQueryAttention(cfg)
        self.norm2 = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.ff = GEGLU(cfg.d_model, cfg.ff_width)

    def forward(self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None, mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a, k, v = self.attn(self.norm1(x), past, mask)
        x = x + a
        return x + self.ff(self.norm2(x)), k, v


class TransformerLM(nn.Module):
    """Causal Transformer LM over the acoustic model's token ids (vocabulary: :mod:`asr_core.lm.config`), with
    paper 002's lookup memory when ``cfg.memory`` is set (see the module docstring)."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position_bias = DynamicPositionBias(cfg.dpb_width, cfg.heads, cfg.dpb_depth)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.pieces)
        nn.init.normal_(self.embed.weight, std=0.02)
        # last, from its own generator: the weights above are those of the same model without a memory
        self.memory = None if cfg.memory is None else LookupMemory(cfg.memory, cfg.d_model, cfg.vocab_size)

    @property
    def bos_id(self) -> int:
        return self.cfg.bos_id

    @property
    def pieces(self) -> int:
        return self.cfg.pieces

    @property
    def output_weight(self) -> torch.Tensor:
        """The output layer's weight (pieces, d): the embedding's first ``pieces`` rows (a view, the same storage)
        when tied, else the head's own."""
        return self.embed.weight[: self.pieces] if self.head is None else self.head.weight

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor, cache: KVCache | None = None, *,
                window: int | None = None, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, KVCache]:
        """Next-token logits of new tokens that continue each row's cached ones.

        tokens: (B, T) long, ids ``0 .. vocab_size - 1``, row ``b`` valid in its first ``lengths[b]`` positions
        (0 allowed: the row only keeps its cache). cache: what each row saw before (None: nothing).
        window: every token attends to itself and at most ``window`` earlier tokens (None: all it is given).
        targets: (B, T) long, the token after each position (the loss's targets; padding may hold anything): what
        a memory stores in training mode. None: the inputs shifted by one (each row's last position then stores
        nothing). Ignored without a memory or in eval mode.

        Returns logits (B, T, pieces), finite everywhere, meaningful at valid positions (position ``i`` predicts the
        token after ``tokens[:, i]``), and the cache of each row's earlier and valid new tokens.
        """
        if tokens.dim() != 2 or lengths.shape != (tokens.shape[0],):
            raise ValueError(f"tokens must be (B, T) with lengths (B,), got {tuple(tokens.shape)} and "
                             f"{tuple(lengths.shape)}")
        if cache is not None and cache.batch_size != tokens.shape[0]:
            raise ValueError(f"the cache holds {cache.batch_size} rows but {tokens.shape[0]} sequences were given")
        if window is not None and window < 0:
            raise ValueError(f"window must be None (no limit) or >= 0, got {window}")
        b, t = tokens.shape
        dev = tokens.device
        lengths = lengths.to(device=dev, dtype=torch.long)
        x = self.embed(tokens)
        s = 0 if cache is None else cache.size
        past_len = torch.zeros(b, dtype=torch.long, device=dev) if cache is None else cache.lengths.to(dev)
        mask = self._mask(past_len, lengths, s, t, window, x.dtype)
        keys, values = [], []
        for i, block in enumerate(self.blocks):
            past = None if cache is None else (cache.keys[i], cache.values[i])
            x, k, v = block(x, past, mask)
            keys.append(k)
            values.append(v)
        c = self.norm(x)  # (B, T, d): the "c" of paper 002's Eq. 6
        history = None
        if self.memory is not None:
            history = self._history(cache, b, dev)
            ids = bucket_ids(tokens, self.bos_id, self.memory.cfg, history)  # (B, T)
            c = self.memory.read(c, ids)  # the memory as it is: read before this step's update
            if self.training:
                self._store(ids, tokens, lengths, targets)
            history = next_history(history, tokens, lengths)
        logits = self.head(c) if self.head is not None else F.linear(c, self.output_weight)
        out = _right_align(torch.stack(keys), torch.stack(values), past_len, lengths, t)
        return logits, out if history is None else dataclasses.replace(out, history=history, bos_id=self.bos_id)

    def _history(self, cache: KVCache | None, b: int, dev: torch.device) -> torch.Tensor:
        """(B, N - 1) ids before each row's first new token: the cache's, or bos padding without a cache."""
        keep = self.memory.cfg.order - 1
        if cache is None:
            return torch.full((b, keep), self.bos_id, dtype=torch.long, device=dev)
        if cache.history is None or cache.history.shape[1] != keep:
            got = "none" if cache.history is None else f"{cache.history.shape[1]} ids"
            raise ValueError(f"this LM's memory hashes the {keep} ids before each token but the cache carries "
                             f"{got}: continue with a cache this model returned (or start with cache=None)")
        return cache.history.to(dev)

    def _store(self, ids: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor,
               targets: torch.Tensor | None) -> None:
        """Eq. 3 for the step (training mode): each valid position's next token, padding masked out."""
        b, t = tokens.shape
        pos = torch.arange(t, device=tokens.device)[None, :]
        if targets is None:
            nxt = torch.cat([tokens[:, 1:], tokens[:, :1]], 1)
            valid = pos < (lengths - 1)[:, None]
        else:
            if targets.shape != tokens.shape:
                raise ValueError(f"targets must be (B, T) = {tuple(tokens.shape)} like tokens (the token after each "
                                 f"position), got {tuple(targets.shape)}")
            nxt = targets.to(device=tokens.device, dtype=torch.long)
            valid = pos < lengths[:, None]
        nxt = torch.where(valid, nxt, torch.full_like(nxt, self.bos_id))  # padding may hold any value
        with torch.autocast(tokens.device.type, enabled=False):  # Eq. 3 in D's own precision, never bf16
            self.memory.update(ids, nxt, self.embed.weight, valid)

    def _mask(self, past_len: torch.Tensor, lengths: torch.Tensor, s: int, t: int, window: int | None,
              dtype: torch.dtype) -> torch.Tensor:
        """(B, H, T, S + T) additive mask: the position bias where a query may attend, -inf elsewhere.

        Column ``j`` of the keys (cached then new) lies ``S + i - j`` tokens before query ``i`` in every row (the
        cache is right-aligned), so the bias is one table lookup shared by the batch; rows differ only in which
        columns hold tokens. A padded query attends to its own column so that nothing is all -inf (no NaN)."""
        dev = past_len.device
        dist = s + torch.arange(t, device=dev)[:, None] - torch.arange(s + t, device=dev)[None, :]  # (T, S + T)
        bias = self.position_bias(s + t, dtype, dev)[dist.clamp(min=0)].permute(2, 0, 1)  # (H, T, S + T)
        col = torch.arange(s + t, device=dev)[None, :]
        key_ok = (col >= s - past_len[:, None]) & (col < s + lengths[:, None])  # (B, S + T)
        allowed = key_ok[:, None, :] & (dist >= 0)[None]
        if window is not None:
            allowed = allowed & (dist <= window)[None]
        pad_query = torch.arange(t, device=dev)[None, :] >= lengths[:, None]  # (B, T)
        allowed = allowed | (pad_query[:, :, None] & (dist == 0)[None])
        neg = torch.tensor(float("-inf"), dtype=dtype, device=dev)
        return torch.where(allowed[:, None], bias[None], neg)


def _right_align(keys: torch.Tensor, values: torch.Tensor, past_len: torch.Tensor, lengths: torch.Tensor,
                 t: int) -> KVCache:
    """The cache after a forward pass: columns (cached S, new T) with row ``b``'s padding (``T - lengths[b]`` new
    columns) moved to the left, then columns no row uses dropped."""
    total = past_len + lengths
    if t and not bool((lengths == t).all()):
        shift = (t - lengths)[:, None]  # (B, 1)
        src = (torch.arange(keys.shape[2], device=keys.device)[None, :] - shift).clamp(min=0)  # (B, S + T)
        idx = src[None, :, :, None].expand(keys.shape[0], -1, -1, keys.shape[3])
        keys, values = keys.gather(2, idx), values.gather(2, idx)
    return KVCache(keys, values, total)._shrink()


def build_lm(cfg: LMConfig) -> TransformerLM:
    return TransformerLM(cfg)


@dataclass(frozen=True)
class LMSize:
    """What an LM holds: ``parameters`` of the Transformer (the memory's dictionary excluded, even when trainable),
    ``memory`` numbers in the memory's dictionary D (U * M * d; 0 without a memory) and ``memory_bytes`` the memory's
    buffers (D in float32, the counts and the step counter)."""

    parameters: int
    memory: int
    memory_bytes: int


def lm_size(cfg: LMConfig) -> LMSize:
    """The size of the LM ``cfg`` describes: the Transformer counted on the meta device, the memory from its shape
    (nothing allocated, instant at any size)."""
    with torch.device("meta"):
        model = TransformerLM(dataclasses.replace(cfg, memory=None))
    params = sum(p.numel() for p in model.parameters())
    if cfg.memory is None:
        return LMSize(params, 0, 0)
    elements = dictionary_elements(cfg.memory, cfg.d_model)
    return LMSize(params, elements, elements * 4 + (cfg.vocab_size + 1) * 8)


def parameter_count(cfg: LMConfig) -> int:
    """Parameters of the LM ``cfg`` describes, its memory's dictionary excluded (:func:`lm_size` reports that)."""
    return lm_size(cfg).parameters
