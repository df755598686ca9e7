"""How alike the attention heads of a layer are, and the auxiliary loss that pushes them apart (paper 003).

For one layer with N heads and a per-head representation R_n (T x D per recording: the queries Q, keys K, values V,
contexts Y = A V, or the attention probabilities A, one row per query frame), the head-similarity matrix is

    d(m, n) = 1/T * sum_t cos(R_m[t], R_n[t])                                                  (003 eq. 5)

over the recording's T valid frames, and the layer's scalar is 003's "diversity loss"

    L(layer) = 1/N^2 * sum_m sum_n (d(m, n) - I(m, n))^2                                         (003 eq. 6)

0 for orthogonal heads, (N - 1)/N for identical ones. 003 reports (Tables 3 and 6) and trains on (eq. 7) L summed
over the encoder's layers: :func:`head_diversity_loss` is that sum, so its value is comparable with those tables.
Both are computed per recording and averaged over recordings (each window of a step is one of 003's utterances).

Q, K, V and Y come from hooks on the model's own :class:`asr_core.model.attention.SelfAttention` modules
(:class:`HeadCapture`): the ``qkv`` projection's output (Q and K then rotated as the module rotates them) and the
input of the ``out`` projection (Y, the heads side by side). The attention kernels (flash-attn or SDPA) never
materialise A, so A is computed here for a sample of query rows only (:func:`sample_query_rows`,
:func:`attention_rows`): ``rows`` query frames per recording against all its keys, O(rows x T) memory instead of
O(T^2), affordable at one hour of context (T' = 45,000 frames). A rotary encoding turns every head's query (key) at a
frame by the same rotation, so it changes d^A but leaves d^Q and d^K as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from asr_core.model.attention import SelfAttention
from asr_core.model.posenc import PositionalEncoding
from asr_core.model.subsampling import time_mask

REPRESENTATIONS: tuple[str, ...] = ("A", "Q", "K", "V", "Y")  # 003 Table 1
NEEDS: dict[str, tuple[str, ...]] = {"A": ("Q", "K"), "Q": ("Q",), "K": ("K",), "V": ("V",), "Y": ("Y",)}
DEFAULT_SAMPLE_ROWS = 64  # query rows of A per recording: a standard error of about 1/8 of the rows' spread


# ---- pure measures ------------------------------------------------------------------------------------------
def head_similarity_matrix(r: torch.Tensor, lengths: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """003 eq. 5 per recording: r (B, H, T, D), the first ``lengths[b]`` rows of recording b valid -> (B, H, H)
    float32, entry (m, n) the mean over valid rows of the cosine between head m's and head n's row.

    Rows beyond a recording's length never count (their values do not matter); a row of zeros has cosine 0."""
    b, _, t, _ = r.shape
    _check_shape(lengths, b)
    with torch.autocast(r.device.type, enabled=False):  # cosines near 1 need more than bf16's 8 bits
        unit = F.normalize(r.float(), dim=-1, eps=eps) * time_mask(lengths.to(r.device), t)[:, None, :, None]
        flat = unit.flatten(2)  # (B, H, T*D): the sum over t of row dot products is one inner product
        return flat @ flat.transpose(1, 2) / lengths.to(r.device, torch.float32)[:, None, None]


def diversity_loss(sim: torch.Tensor) -> torch.Tensor:
    """003 eq. 6: sim (..., H, H) -> (...), the mean over (m, n) of (d(m, n) - I(m, n))^2."""
    eye = torch.eye(sim.shape[-1], device=sim.device, dtype=sim.dtype)
    return (sim - eye).pow(2).mean(dim=(-2, -1))


def offdiagonal_mean(sim: torch.Tensor) -> torch.Tensor:
    """sim (..., H, H) -> (...): the mean similarity of two different heads (0 with one head)."""
    h = sim.shape[-1]
    if h < 2:
        return sim.new_zeros(sim.shape[:-2])
    return (sim.sum(dim=(-2, -1)) - sim.diagonal(dim1=-2, dim2=-1).sum(-1)) / (h * (h - 1))


def sample_query_rows(lengths: torch.Tensor, rows: int, generator: torch.Generator) -> tuple[torch.Tensor,
                                                                                             torch.Tensor]:
    """Which query frames A is computed for: ``rows`` frames per recording drawn without replacement from its
    valid frames (all of them when it has no more), ascending.

    lengths (B,) -> (index (B, S) long, count (B,) long) on the CPU, S = min(rows, max length); index[b, :count[b]]
    are recording b's frames, the rest 0 (ignored). Draws depend only on the lengths and ``generator`` (a CPU
    generator), never on padding."""
    if rows < 1:
        raise ValueError(f"sample_rows must be a positive integer, got {rows}")
    lens = lengths.detach().cpu().long()
    _check_lengths(lens)
    s = min(rows, int(lens.max()))
    index = torch.zeros(len(lens), s, dtype=torch.long)
    for i, n in enumerate(lens.tolist()):
        pick = torch.arange(n) if n <= rows else torch.randperm(n, generator=generator)[:rows].sort().values
        index[i, : len(pick)] = pick
    return index, lens.clamp(max=rows)


def attention_rows(q: torch.Tensor, k: torch.Tensor, lengths: torch.Tensor, index: torch.Tensor,
                   scale: float | None = None) -> torch.Tensor:
    """Rows of A = softmax(Q K^T * scale) over each recording's valid keys.

    q, k (B, H, T, D) as the attention kernel sees them (after any rotation), lengths (B,), index (B, S) query frames
    (:func:`sample_query_rows`) -> (B, H, S, T) float32; columns of padded keys are 0. ``scale`` defaults to
    1/sqrt(D), the scale of SDPA and flash-attn (003 eq. 2 writes 1/H)."""
    b, h, t, d = q.shape
    _check_shape(lengths, b)
    scale = d ** -0.5 if scale is None else scale
    pick = index.to(q.device)[:, None, :, None].expand(b, h, index.shape[1], d)
    with torch.autocast(q.device.type, enabled=False):  # float32 scores and softmax whatever the caller's autocast
        scores = q.gather(2, pick).float() @ k.float().transpose(-1, -2) * scale
        keys = time_mask(lengths.to(q.device), t)[:, None, None, :]
        return scores.masked_fill(~keys, float("-inf")).softmax(dim=-1)


# ---- collecting Q, K, V, Y from a forward pass ---------------------------------------------------------------
@dataclass(frozen=True)
class LayerHeads:
    """One attention layer's per-head tensors from one forward pass, as views of what the module computed.

    ``qkv`` (B, T, 3, H, D) is its ``qkv`` projection's output, ``context`` (B, T, H, D) the input of its ``out``
    projection (the heads' contexts side by side), either None when not kept; ``lengths`` (B,) the valid frames it
    was given. :meth:`get` gives Q, K, V, Y as (B, H, T, D), Q and K rotated as the module rotates them (what its
    kernel multiplies). The rotation is applied on access, after the forward: an operation inside a layer that
    activation checkpointing recomputes would break the recomputation, so the hooks only take views."""

    index: int
    lengths: torch.Tensor
    posenc: PositionalEncoding
    qkv: torch.Tensor | None = None
    context: torch.Tensor | None = None
    _rotated: dict[str, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    def get(self, name: str) -> torch.Tensor:
        """Q, K, V or Y of this layer, (B, H, T, D)."""
        if name not in NEEDS or name == "A":
            raise ValueError(f"unknown per-head tensor {name!r}; valid: Q, K, V, Y")
        source = self.context if name == "Y" else self.qkv
        if source is None:
            raise ValueError(f"layer {self.index}: {name} was not kept; pass it in HeadCapture(keep=...)")
        if name == "Y":
            return source.transpose(1, 2)
        if name == "V":
            return source[:, :, 2].transpose(1, 2)
        if not self._rotated:
            q, k = self.posenc.rotate(source[:, :, 0], source[:, :, 1])
            self._rotated.update(Q=q.transpose(1, 2), K=k.transpose(1, 2))
        return self._rotated[name]


class HeadCapture:
    """Context manager hooking every :class:`SelfAttention` of ``model`` for the forward passes inside it.

    ``keep``: the representations needed (any of A, Q, K, V, Y; A needs Q and K). Each finished layer becomes a
    :class:`LayerHeads`, handed to ``on_layer`` when given (so a caller can reduce and drop it: the metric at one hour
    of context never holds all layers) or appended to ``layers``. Tensors keep their autograd graph, so a loss
    computed from them trains the model. Compute it before leaving the block and call ``backward`` after: the hooks
    are gone by then, and activation checkpointing's recomputation in the backward pass is not captured again (a
    layer seen twice inside the block is an error). ``on_layer`` runs inside the layer's forward, so it is refused
    where that layer is checkpointed under autograd (collect ``layers`` and compute after the forward instead)."""

    def __init__(self, model: nn.Module, keep: Iterable[str] = ("Q", "K", "V", "Y"),
                 on_layer: Callable[[LayerHeads], None] | None = None) -> None:
        keep = tuple(keep)
        bad = [r for r in keep if r not in REPRESENTATIONS]
        if bad:
            raise ValueError(f"unknown head representation(s) {bad}; valid: {', '.join(REPRESENTATIONS)}")
        self.keep = {n for r in keep for n in NEEDS[r]}
        self.attns = [m for m in model.modules() if isinstance(m, SelfAttention)]
        if not self.attns:
            raise ValueError(f"{type(model).__name__} has no asr_core.model.attention.SelfAttention module to hook")
        self.model = model
        self.on_layer = on_layer
        self.layers: list[LayerHeads] = []
        self._open: dict[int, dict[str, Any]] = {}
        self._seen: set[int] = set()
        self._handles: list[Any] = []

    def __enter__(self) -> "HeadCapture":
        for i, attn in enumerate(self.attns):
            self._handles += [
                attn.register_forward_pre_hook(self._starter(i), with_kwargs=True),
                attn.qkv.register_forward_hook(self._qkv_taker(i, attn)),
                attn.out.register_forward_pre_hook(self._context_taker(i, attn)),
                attn.register_forward_hook(self._finisher(i, attn)),
            ]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._open.clear()

    def _starter(self, i: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if i in self._seen:
                raise RuntimeError(f"attention layer {i} ran twice inside one HeadCapture (activation checkpointing "
                                   "recomputes layers during backward: leave the capture before calling backward)")
            if (self.on_layer is not None and torch.is_grad_enabled() and self.model.training
                    and getattr(self.model, "activation_checkpointing", False)):
                raise RuntimeError("HeadCapture(on_layer=...) would compute inside a checkpointed layer; under "
                                   "autograd with model.activation_checkpointing collect .layers instead")
            self._seen.add(i)
            self._open[i] = {"lengths": args[2] if len(args) > 2 else kwargs["lengths"]}
        return hook

    def _qkv_taker(self, i: int, attn: SelfAttention) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            if self.keep & {"Q", "K", "V"}:
                b, t, _ = output.shape
                self._open[i]["qkv"] = output.view(b, t, 3, attn.heads, attn.head_dim)  # as SelfAttention splits
        return hook

    def _context_taker(self, i: int, attn: SelfAttention) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple) -> None:
            if "Y" in self.keep:
                b, t, _ = args[0].shape
                self._open[i]["context"] = args[0].reshape(b, t, attn.heads, attn.head_dim)
        return hook

    def _finisher(self, i: int, attn: SelfAttention) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            got = self._open.pop(i)
            layer = LayerHeads(i, got["lengths"], attn.posenc[0], got.get("qkv"), got.get("context"))
            if self.on_layer is not None:
                self.on_layer(layer)
            else:
                self.layers.append(layer)
        return hook


# ---- per layer, per model -----------------------------------------------------------------------------------
def layer_similarity(layer: LayerHeads, representation: str, *, sample_rows: int = DEFAULT_SAMPLE_ROWS,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """The (B, H, H) head-similarity matrices of one layer for ``representation`` (A: over ``sample_rows`` sampled
    query rows per recording, drawn with ``generator``, which A needs)."""
    if representation not in REPRESENTATIONS:
        raise ValueError(f"unknown head representation {representation!r}; valid: {', '.join(REPRESENTATIONS)}")
    if representation != "A":
        return head_similarity_matrix(layer.get(representation), layer.lengths)
    if generator is None:
        raise ValueError("head similarity of A samples query rows: pass a torch.Generator (e.g. seeded by the step)")
    index, count = sample_query_rows(layer.lengths, sample_rows, generator)
    return head_similarity_matrix(attention_rows(layer.get("Q"), layer.get("K"), layer.lengths, index), count)


def head_diversity_loss(layers: Iterable[LayerHeads], representation: str, *,
                        sample_rows: int = DEFAULT_SAMPLE_ROWS, generator: torch.Generator | None = None
                        ) -> torch.Tensor:
    """003's auxiliary loss: the sum over layers of eq. 6, each the mean over the batch's recordings.

    0 when every layer's heads are orthogonal in ``representation``; its gradient moves each pair's similarity
    towards 0. A scalar float32 tensor with the layers' autograd graph."""
    total = None
    for layer in layers:
        part = diversity_loss(layer_similarity(layer, representation, sample_rows=sample_rows,
                                               generator=generator)).mean()
        total = part if total is None else total + part
    if total is None:
        raise ValueError("no attention layer was captured: run the model's forward inside HeadCapture")
    return total


def head_similarity(model: nn.Module, features: torch.Tensor, lengths: torch.Tensor, *,
                    sample_rows: int = DEFAULT_SAMPLE_ROWS, generator: torch.Generator) -> dict[str, Any]:
    """Every layer's head similarity for A, Q, K, V and Y from one forward pass without gradients.

    features (B, T, n_mels), lengths (B,) as for ``model.forward``; the model runs in eval mode (its mode is restored
    after). Each layer is reduced as soon as it has run, so memory beyond the forward is O(B x L x H^2) plus one
    layer's A rows (B, H, S, T'). Returns, for each representation ``r`` in :data:`REPRESENTATIONS`:

    - ``per_recording[r]`` (B, L, H, H): eq. 5 per recording (to average over many batches);
    - ``matrix[r]`` (L, H, H): its mean over the batch's recordings;
    - ``diversity[r]`` (L,): eq. 6 per layer, mean over recordings;
    - ``diversity_sum[r]`` float: its sum over layers, the figure of 003 Tables 3 and 6;
    - ``similarity[r]`` (L,): the mean cosine between two different heads, mean over recordings;

    and ``sample_rows``, ``recordings`` (B), ``layers`` (L), ``heads`` (H). Tensors are float32 on the CPU."""
    _check_lengths(lengths.detach().cpu())
    device = next(model.parameters()).device
    found: dict[str, list[torch.Tensor]] = {r: [] for r in REPRESENTATIONS}

    def reduce(layer: LayerHeads) -> None:
        for r in REPRESENTATIONS:
            found[r].append(layer_similarity(layer, r, sample_rows=sample_rows, generator=generator).cpu())

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), HeadCapture(model, REPRESENTATIONS, on_layer=reduce):
            model(features.to(device), lengths.to(device))
    finally:
        model.train(was_training)
    per = {r: torch.stack(found[r], dim=1) for r in REPRESENTATIONS}  # (B, L, H, H)
    div = {r: diversity_loss(per[r]).mean(0) for r in REPRESENTATIONS}
    first = per[REPRESENTATIONS[0]]
    return {
        "per_recording": per,
        "matrix": {r: per[r].mean(0) for r in REPRESENTATIONS},
        "diversity": div,
        "diversity_sum": {r: float(div[r].sum()) for r in REPRESENTATIONS},
        "similarity": {r: offdiagonal_mean(per[r]).mean(0) for r in REPRESENTATIONS},
        "sample_rows": sample_rows,
        "recordings": first.shape[0],
        "layers": first.shape[1],
        "heads": first.shape[2],
    }


def _check_shape(lengths: torch.Tensor, b: int) -> None:
    if lengths.shape != (b,):
        raise ValueError(f"lengths must have shape ({b},), one per recording; got {tuple(lengths.shape)}")


def _check_lengths(lengths: torch.Tensor) -> None:
    """A CPU tensor of lengths: one dimension, every recording at least one frame (checked where it costs no
    device synchronisation)."""
    if lengths.dim() != 1 or len(lengths) == 0 or int(lengths.min()) < 1:
        raise ValueError(f"lengths must be a non-empty (B,) tensor of positive frame counts; got {lengths.tolist()}")
