"""How alike a trained model's attention heads are (paper 003), measured on test recordings and logged to its run.

``python -m asr_core heads CKPT [--data NAME=FORMAT:PATH ...] [--rows 64] [--max-windows 32] [--batch-windows N]
[--precision auto|bf16|fp32] [--tracking-uri U --run-id R] [--out DIR]``

The model sees what it was trained on: windows of its trained context (``data.context_s``, as evaluation uses),
here non-overlapping, so each frame is measured once. Up to ``max_windows`` windows per dataset are taken in turn
from the recordings in their corpus order: the first window of every recording, then the second of every recording
long enough, and so on (:func:`plan_head_windows`); a recording shorter than the context is one window, as in
evaluation; a tail shorter than the context is left out. Each window is one of 003's utterances:
:func:`asr_core.model.heads.head_similarity` gives its per-layer N x N matrices for A (``rows`` sampled query rows), Q,
K, V and Y, and everything is averaged over the windows.

Logged into the checkpoint's MLflow run (or ``--run-id``), step 0, for each dataset ``NAME`` and representation
``R`` in A, Q, K, V, Y:

* ``heads/<NAME>/<R>/sum``: 003 eq. 6 summed over layers, mean over windows (the figure of 003 Tables 3 and 6);
* ``heads/<NAME>/<R>/layer<i>``: eq. 6 of layer ``i`` (0-based), mean over windows;
* ``heads/<NAME>/<R>/similarity``: the mean cosine between two different heads, over layers and windows;
* ``heads/<NAME>/windows``: how many windows were measured;

and artifacts under ``heads/``: ``<NAME>.npz`` (per representation ``matrix_<R>`` (L, H, H), ``diversity_<R>``
(L,), ``similarity_<R>`` (L,); ``windows``, ``rows``, ``context_s``) and ``<NAME>-<R>.png`` (each layer's matrix).
A dataset name stands for one content in a run, as in evaluation: its fingerprint is checked against, or recorded
as, the run's ``eval.<NAME>.fingerprint`` tag. Logging goes through an outbox like ``evaluate``'s: the trial job's
own (``eval.head_diversity``, :mod:`asr_core.trial`), or one in ``DIR/outbox`` that the command waits for at most
``ASR_CORE_FINAL_FLUSH_S`` seconds. The command line is :mod:`asr_core.probes.heads_args`'s.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asr_core.contract.specs import parse_dataset_spec
from asr_core.data.corpora import Recording, load_corpus
from asr_core.data.corpora.fingerprint import fingerprint
from asr_core.decoding.decode import WindowBatch, auto_batch_windows, prepare_features, window_frames
from asr_core.device import resolve_device, use_bf16
from asr_core.model.heads import DEFAULT_SAMPLE_ROWS, REPRESENTATIONS, diversity_loss, head_similarity, offdiagonal_mean
from asr_core.runtime.outbox import Outbox
from asr_core.contract.metrics import heads_key, heads_windows_key
from asr_core.contract.trial import HEADS_DIR  # the folder beside the checkpoint (or in the trial's), and the run's
from asr_core.evaluation.stage_run import check_fingerprints, known_tags, log_stage, stage_run
from asr_core.training.checkpoint import load_for_eval

DEFAULT_WINDOWS = 32  # eval.head_windows' default
Progress = Callable[[int, int], None]  # (windows done, windows total)


# ---- which windows -----------------------------------------------------------------------------------------------
def plan_head_windows(frames: Sequence[int], window: int, most: int) -> list[tuple[int, int, int]]:
    """Non-overlapping windows of ``window`` frames, at most ``most``: ``(recording index, start, end)`` in the
    order they are measured (by recording, then start).

    ``frames[i]`` is recording i's length. Windows are chosen in turn: window 0 of every recording, then window 1
    of every recording that has a second whole window, and so on, so a few long recordings do not fill the sample.
    A recording shorter than ``window`` is one window of its own length (as evaluation decodes it); the tail of a
    longer one, shorter than ``window``, is not used."""
    if window < 1 or most < 1:
        raise ValueError(f"window ({window}) and most ({most}) must be positive")
    whole = [max(1, n // window) if n > 0 else 0 for n in frames]
    chosen: list[tuple[int, int, int]] = []
    k = 0
    while len(chosen) < most and any(c > k for c in whole):
        for i, c in enumerate(whole):
            if c > k and len(chosen) < most:
                chosen.append((i, k * window, min((k + 1) * window, frames[i])))
        k += 1
    return sorted(chosen)


# ---- the measure over many windows ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeadsSummary:
    """Head similarity of one dataset, means over its ``windows`` measured windows: per representation ``matrix``
    (L, H, H) (003 eq. 5), ``diversity`` (L,) (eq. 6 of each window, averaged), ``similarity`` (L,) (mean cosine of
    two different heads)."""

    dataset: str
    windows: int
    rows: int
    context_s: float
    matrix: dict[str, np.ndarray]
    diversity: dict[str, np.ndarray]
    similarity: dict[str, np.ndarray]

    def metrics(self) -> dict[str, float]:
        """The run's metrics (see the module docstring)."""
        out: dict[str, float] = {heads_windows_key(self.dataset): float(self.windows)}
        for r in REPRESENTATIONS:
            out[heads_key(self.dataset, r, "sum")] = float(self.diversity[r].sum())
            out[heads_key(self.dataset, r, "similarity")] = float(self.similarity[r].mean())
            out.update({heads_key(self.dataset, r, "layer", i): float(v) for i, v in enumerate(self.diversity[r])})
        return out

    def save(self, out_dir: Path) -> list[Path]:
        """``<NAME>.npz`` and one ``<NAME>-<R>.png`` per representation in ``out_dir``; returns their paths."""
        out_dir.mkdir(parents=True, exist_ok=True)
        npz = out_dir / f"{self.dataset}.npz"
        arrays: dict[str, Any] = {"windows": np.int64(self.windows), "rows": np.int64(self.rows),
                                  "context_s": np.float64(self.context_s)}
        for r in REPRESENTATIONS:
            arrays.update({f"matrix_{r}": self.matrix[r], f"diversity_{r}": self.diversity[r],
                           f"similarity_{r}": self.similarity[r]})
        with open(npz, "wb") as f:  # an open file: np.savez would add .npz to a name lacking it
            np.savez(f, **arrays)
        return [npz, *(self._plot(r, out_dir / f"{self.dataset}-{r}.png") for r in REPRESENTATIONS)]

    def _plot(self, r: str, path: Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        layers = self.matrix[r].shape[0]
        cols = min(layers, 6)
        rows = math.ceil(layers / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(2.2 * cols + 0.8, 2.3 * rows + 0.6), squeeze=False)
        image = None
        for i, ax in enumerate(axes.flat):
            if i >= layers:
                ax.axis("off")
                continue
            image = ax.imshow(self.matrix[r][i], vmin=-1, vmax=1, cmap="RdBu_r")
            ax.set_title(f"layer {i}: {self.diversity[r][i]:.3f}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
        fig.suptitle(f"{self.dataset}, {r}: cosine between heads ({self.windows} windows of {self.context_s:g} s); "
                     f"sum of eq. 6 {self.diversity[r].sum():.3f}", fontsize=10)
        if image is not None:
            fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path


def measure_dataset(model: torch.nn.Module, recordings: Sequence[Recording], extractor: Any, *, dataset: str,
                    context_s: float, window: int, subsampling: int, frames_per_second: float,
                    rows: int = DEFAULT_SAMPLE_ROWS, max_windows: int = DEFAULT_WINDOWS,
                    batch: WindowBatch | None = None, device: torch.device | str = "cpu", bf16: bool = False,
                    seed: int = 0, progress: Progress | None = None) -> HeadsSummary:
    """:class:`HeadsSummary` of ``recordings`` (windows from :func:`plan_head_windows`, features as evaluation
    computes them). ``batch``: windows per forward pass (halved for good after running out of memory); ``bf16``:
    the model runs under CUDA bf16 autocast (the similarities are float32 either way); A's rows are drawn by a
    generator seeded with ``seed``."""
    from asr_core.data.audio import load_audio

    batch = batch or WindowBatch(8)
    estimate = [int(r.duration * frames_per_second) + 1 for r in recordings]  # the features' length, +-1 frame
    plan = plan_head_windows(estimate, window, max_windows)
    if not plan:
        raise ValueError(f"dataset {dataset!r} has no audio to measure")
    generator = torch.Generator().manual_seed(seed)
    sums: dict[str, dict[str, torch.Tensor]] = {}
    done = 0

    def run(items: list[torch.Tensor]) -> None:
        nonlocal done
        start = 0
        while start < len(items):
            chunk = items[start: start + batch.size]
            lengths = torch.tensor([len(x) for x in chunk])
            feats = torch.zeros(len(chunk), int(lengths.max()), chunk[0].shape[1])
            for i, x in enumerate(chunk):
                feats[i, : len(x)] = x
            state = generator.get_state()
            try:
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                    got = head_similarity(model, feats, lengths, sample_rows=rows, generator=generator)
            except torch.OutOfMemoryError:
                generator.set_state(state)  # the retry draws what this attempt drew
                if not batch.shrink(len(chunk)):
                    raise
                if torch.device(device).type == "cuda":
                    torch.cuda.empty_cache()
                print(f"[heads] out of memory with {len(chunk)} windows; {batch.size} at a time from now on",
                      file=sys.stderr, flush=True)
                continue
            for r in REPRESENTATIONS:
                per = got["per_recording"][r].double()  # (B, L, H, H)
                parts = {"matrix": per.sum(0), "diversity": diversity_loss(per).sum(0),
                         "similarity": offdiagonal_mean(per).sum(0)}
                if r not in sums:
                    sums[r] = parts
                else:
                    sums[r] = {k: sums[r][k] + v for k, v in parts.items()}
            start += len(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, len(plan))

    if progress is not None:
        progress(0, len(plan))
    pending: list[torch.Tensor] = []
    for index in sorted({i for i, _, _ in plan}):
        rec = recordings[index]
        feats = prepare_features(extractor, load_audio(rec.audio), rec.ignore, frames_per_second)
        for _, s, e in (p for p in plan if p[0] == index):
            piece = feats[s: min(e, feats.shape[0])]
            if len(piece) >= subsampling:  # (a window planned from the duration may end a frame early)
                pending.append(piece)
        while len(pending) >= batch.size:
            take, pending = pending[: batch.size], pending[batch.size:]
            run(take)
    if pending:
        run(pending)
    n = done
    if n == 0:
        raise ValueError(f"dataset {dataset!r}: no window of at least {subsampling} frames to measure")
    return HeadsSummary(dataset, n, rows, context_s,
                        matrix={r: (sums[r]["matrix"] / n).float().numpy() for r in REPRESENTATIONS},
                        diversity={r: (sums[r]["diversity"] / n).float().numpy() for r in REPRESENTATIONS},
                        similarity={r: (sums[r]["similarity"] / n).float().numpy() for r in REPRESENTATIONS})


# ---- the command's work --------------------------------------------------------------------------------------------
def measure(checkpoint: str | Path, datasets: Sequence[str], *, rows: int = DEFAULT_SAMPLE_ROWS,
            max_windows: int = DEFAULT_WINDOWS, batch_windows: int = 0, precision: str = "auto",
            device: str = "auto", tracking_uri: str | None = None, run_id: str | None = None,
            out_dir: str | Path | None = None, log: bool = True, strict: bool = False,
            progress: Callable[[str, int, int], None] | None = None, outbox: Outbox | None = None
            ) -> dict[str, HeadsSummary]:
    """Head similarity of ``checkpoint`` on each ``NAME=FORMAT:PATH`` dataset (see the module docstring); the
    matrices and figures go to ``out_dir`` (default: ``heads/`` beside the checkpoint) and, with a run known
    (``run_id``, ``outbox``'s, or the checkpoint's) and ``log``, into the run. ``progress(dataset, done, total)``
    follows the windows. Returns the summaries by dataset name."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} not found")
    if rows < 1 or max_windows < 1 or batch_windows < 0:
        raise ValueError(f"rows ({rows}) and max_windows ({max_windows}) must be positive, batch_windows "
                         f"({batch_windows}) 0 (sized from free GPU memory) or positive")
    if not datasets:
        raise ValueError("no datasets to measure: give at least one NAME=FORMAT:PATH")
    parsed = [parse_dataset_spec(d) for d in datasets]
    names = [n for n, _ in parsed]
    if len(set(names)) != len(names):
        raise ValueError(f"dataset names must be unique, got {names}")
    dev = resolve_device(device)
    bf16 = use_bf16(precision, dev, setting="eval.precision")
    corpora = {name: load_corpus(spec, strict=strict) for name, spec in parsed}
    run: tuple[str, str | None] | None = None
    tags: dict[str, str] = {}
    if log:
        run = stage_run(checkpoint, run_id, tracking_uri, outbox, "heads")
        if run is not None:
            tags = check_fingerprints(run[0], known_tags(run, outbox),
                                      {n: fingerprint(recs) for n, recs in corpora.items()})

    from asr_core.data.features import FeatureExtractor

    model, cfg, _ = load_for_eval(checkpoint, dev)
    fps = cfg.data.features.frames_per_second
    sub = cfg.model.subsampling_factor
    window = window_frames(cfg.data.context_s, fps, sub)
    m = cfg.model
    batch = WindowBatch(batch_windows or auto_batch_windows(
        window, dev, bf16=bf16, n_mels=cfg.data.features.n_mels, subsampling_channels=m.subsampling_channels,
        d_model=m.d_model, vocab_size=m.vocab_size, subsampling=sub))
    extractor = FeatureExtractor(cfg.data.features)
    out = Path(out_dir) if out_dir is not None else checkpoint.parent / HEADS_DIR
    print(f"[heads] {checkpoint}: context {cfg.data.context_s:g} s = {window} frames, {m.layers} layers x "
          f"{m.heads} heads, up to {max_windows} windows per dataset, {rows} rows of A per window, "
          f"{'bf16' if bf16 else 'fp32'}, {batch.size} windows at a time", file=sys.stderr, flush=True)
    results: dict[str, HeadsSummary] = {}
    files: list[Path] = []
    for name, recordings in corpora.items():
        step = (lambda done, total, name=name: progress(name, done, total)) if progress is not None else None
        summary = measure_dataset(model, recordings, extractor, dataset=name, context_s=cfg.data.context_s,
                                  window=window, subsampling=sub, frames_per_second=fps, rows=rows,
                                  max_windows=max_windows, batch=batch, device=dev, bf16=bf16, progress=step)
        results[name] = summary
        files += summary.save(out)
        for r in REPRESENTATIONS:
            print(f"[heads] {name} {r}: sum of eq. 6 {summary.diversity[r].sum():.4f}, similarity "
                  f"{summary.similarity[r].mean():.4f} ({summary.windows} windows)", file=sys.stderr, flush=True)
    if run is not None:
        metrics = {k: v for s in results.values() for k, v in s.metrics().items()}
        log_stage(outbox, out, run, tags, metrics, files, HEADS_DIR, "heads")
    return results
