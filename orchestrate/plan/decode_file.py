"""The decode file of ``orchestrate evaluate SWEEP --decode FILE``: one beam-search setting (paper 004 §2.4, §3.4),
validated before anything is submitted.

A YAML mapping (example: ``grids/decode-lm.yaml``)::

    name: beam-lm1024      # the decoder's name: metrics wer_<name>/<dataset>[/snr<DB>], tag eval.decoder.<name>
    lm: lm/checkpoint.pt   # an LM checkpoint (python -m asr_core lm train), or null: beam search without an LM
    alpha: 0.42            # LM weight (required with an LM; not allowed without one: it would weigh nothing)
    beta: 1.95             # bonus per token (required)
    beam_width: 25         # optional (default: asr_core.decoding.beam.BeamConfig's, paper 004 §3.4)
    lm_context: 1024       # optional: tokens the LM remembers (default: BeamConfig's)
    prompt: prompt.txt     # optional, with an LM only: a text the LM reads before each recording (004 §3.4)
    datasets: [dev=podcast:data/dev]   # optional NAME=FORMAT:PATH list; default: each trial's own eval.datasets
    snrs: [0, 5]           # optional: music at these SNRs (dB) on every decoded dataset; default: clean only
    stride: 0.125          # optional window stride; default: each trial's own eval.stride
    tail: tail.json        # optional: a tail set (asr_core tailset); tail_<name>/... beside (default: eval.tail)

Or a window fusion evaluation (paper 001; example: ``grids/decode-fusion.yaml``): greedy decoding with the windows
joined each way named, beside the trial's own averaging, logged as ``wer_fusion-<METHOD>/<dataset>``::

    name: fusion           # the evaluation's name (its folder, and the one setting it stands for)
    fusion: [select, blockwise, chiu, lcs, rover]   # or "all"; asr_core.contract.metrics.FUSION_METHODS
                                                    # (also blockwise-frames, chiu-seconds)
    datasets: [...]        # optional, as above; snrs and stride too

Or decoding at other windows than the model's context (the context-or-fragmentation control; example:
``grids/decode-windows.yaml``): greedy decoding, windows averaged at the stride as the trial's own decoding, but each
window W seconds long, logged as ``wer_window-<W:g>s/<dataset>`` (:func:`asr_core.contract.metrics.window_decoder`)::

    name: windows          # the evaluation's name
    window_s: [5.12, 10.24, 20.48]   # positive numbers of seconds, each once (or one number)
    datasets: [...]        # optional, as above; snrs, stride and tail too

Or a plain test set (another dataset for the models' own evaluation, into the report's main WER table): greedy
decoding exactly as each trial's own evaluation (its stride, precision and tail), logged as ``wer/<dataset>`` like the
grid's ``eval:`` datasets; no name (the evaluation is each model's own) and no decoder::

    datasets: [other=podcast:data/other]   # required
    snrs: [0]              # optional, as above

A fusion or window file gives no ``lm``, ``alpha``, ``beta``, ``beam_width``, ``lm_context`` or ``prompt`` (it decodes
greedily), and not both ``fusion`` and ``window_s`` (two evaluations: one decode file, and name, each).

Relative paths (``lm``, ``prompt``, the datasets' PATH) resolve against the decode file's folder. Every error names
the file, the key, the value and what is valid (:class:`DecodeFileError`).

One name is one setting: :meth:`DecodeSpec.setting` is what a later file under the same name must repeat (the LM
and prompt by path *and* content, alpha, beta, width, context, stride); the datasets and SNRs may grow, since each
has metrics of its own.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from asr_core.config.yaml_input import YamlInputError, load_yaml_file

KEYS = ("name", "lm", "alpha", "beta", "beam_width", "lm_context", "prompt", "datasets", "snrs", "stride", "fusion",
        "tail", "window_s")
BEAM_KEYS = ("lm", "alpha", "beta", "beam_width", "lm_context", "prompt")
SETTING_KEYS = ("lm", "lm_sha256", "alpha", "beta", "beam_width", "lm_context", "prompt", "prompt_sha256", "stride")


class DecodeFileError(ValueError):
    """The decode file is unreadable or invalid; the message names the file, key and value and what is valid."""


@dataclass(frozen=True)
class DecodeSpec:
    """A validated decode file: paths absolute, defaults filled in (alpha 0 without an LM)."""

    name: str
    lm: str | None  # absolute path of the LM checkpoint; None: beam search without an LM
    alpha: float
    beta: float
    beam_width: int
    lm_context: int
    prompt: str | None = None  # absolute path of the prompt text
    datasets: tuple[str, ...] = ()  # NAME=FORMAT:/absolute/path; (): each trial's eval.datasets
    snrs: tuple[float, ...] = ()  # music SNRs in dB on every decoded dataset; (): clean only
    stride: float | None = None  # None: each trial's eval.stride
    source: str = ""  # the decode file it was read from
    fusion: tuple[str, ...] = ()  # window fusion methods (greedy decoding; the beam fields unused); (): a beam spec
    tail: str | None = None  # absolute path of a tail set (paper 002); None: each trial's own eval.tail
    windows: tuple[float, ...] = ()  # greedy decoding at these windows (seconds; the beam fields unused)
    plain: bool = False  # a plain test set: each model's own evaluation (name "greedy", metrics wer/...)

    @property
    def decoders(self) -> list[str]:
        """The decoders whose metrics the spec's jobs write: its name for a beam, ``fusion-<METHOD>`` per method,
        ``window-<W:g>s`` per window."""
        from asr_core.contract.metrics import GREEDY, fusion_decoder, window_decoder

        if self.plain:
            return [GREEDY]
        if self.windows:
            return [window_decoder(w) for w in self.windows]
        return [fusion_decoder(m) for m in self.fusion] if self.fusion else [self.name]

    def setting(self) -> dict[str, Any]:
        """What defines the decoder ``name``: the LM and prompt (path and SHA-256 of the content), alpha, beta,
        beam width, LM context and stride; for a fusion spec, its methods and the stride; for a window spec, its
        windows and the stride. Hashing reads the LM file
        once (a few hundred MB at paper size)."""
        tail = {"tail": self.tail, "tail_sha256": _sha256(self.tail)} if self.tail else {}  # absent: as before
        if self.fusion:
            return {"fusion": list(self.fusion), "stride": self.stride, **tail}
        if self.windows:
            return {"windows": list(self.windows), "stride": self.stride, **tail}
        return {**tail, "lm": self.lm, "lm_sha256": _sha256(self.lm), "alpha": self.alpha, "beta": self.beta,
                "beam_width": self.beam_width, "lm_context": self.lm_context, "prompt": self.prompt,
                "prompt_sha256": _sha256(self.prompt), "stride": self.stride}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["datasets"], d["snrs"] = list(self.datasets), list(self.snrs)
        if self.fusion:
            d["fusion"] = list(self.fusion)
        else:  # a beam spec's record (and the decoder of its jobs) as before fusion specs existed
            d.pop("fusion")
        if self.tail is None:
            d.pop("tail")
        if self.windows:
            d["windows"] = list(self.windows)
        else:  # as before window specs existed
            d.pop("windows")
        if not self.plain:
            d.pop("plain")
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DecodeSpec":
        """A spec written by :meth:`to_dict` (the sweep's own record: trusted, not validated again)."""
        return cls(**{**d, "datasets": tuple(d.get("datasets", ())), "snrs": tuple(d.get("snrs", ())),
                      "fusion": tuple(d.get("fusion", ())), "windows": tuple(d.get("windows", ()))})

    def metric_keys(self, dataset: str) -> list[str]:
        """The metrics one decoded dataset gets: per decoder clean, then each SNR (``asr_core.evaluation.evaluate``'s
        keys)."""
        from asr_core.contract.metrics import metric_key

        return [metric_key(dataset, snr, d) for d in self.decoders for snr in (None, *self.snrs)]


def _sha256(path: str | None) -> str | None:
    if path is None:
        return None
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def load_decode_file(path: str | Path) -> DecodeSpec:
    """Read and validate the decode file at ``path`` (or the packaged one of that name: ``decode-lm``,
    ``grids/decode-lm.yaml``, as :func:`orchestrate.assets.grid_path` finds grids); raises :class:`DecodeFileError`."""
    from orchestrate.assets import grid_path, grids_dir, names

    path = grid_path(path)
    try:
        raw = load_yaml_file(path)
    except FileNotFoundError:
        packaged = [n for n in names(grids_dir()) if n.startswith("decode")]
        raise DecodeFileError(f"decode file {path} not found (packaged ones, by name: {', '.join(packaged)})") from None
    except YamlInputError as e:
        raise DecodeFileError(str(e)) from None
    except OSError as e:
        raise DecodeFileError(f"decode file {path} cannot be read: {e.strerror or e}") from None
    return parse_decode(raw, path)


def parse_decode(raw: Any, path: Path) -> DecodeSpec:
    """Validate the mapping ``raw`` read from ``path`` (relative paths resolve against ``path``'s folder). The beam
    search's defaults (and torch with them) are imported only once the file's keys are known good."""
    where = str(path)
    if not isinstance(raw, dict):
        raise DecodeFileError(f"{where}: a decode file is a mapping of {', '.join(KEYS)}; got {raw!r}")
    unknown = sorted(str(k) for k in set(raw) - set(KEYS))
    if unknown:
        raise DecodeFileError(f"{where}: unknown key {unknown[0]!r}; valid keys: {', '.join(KEYS)}")
    if "fusion" in raw and "window_s" in raw:
        raise DecodeFileError(f"{where}: 'fusion' and 'window_s' are two evaluations; valid: one of them per decode "
                              "file, each under a name of its own")
    if "fusion" in raw:
        return _parse_fusion(raw, path)
    if "window_s" in raw:
        return _parse_windows(raw, path)
    if not any(k in raw for k in BEAM_KEYS):
        return _parse_plain(raw, path)
    for k in ("name", "lm", "beta"):
        if k not in raw:
            raise DecodeFileError(f"{where}: missing key {k!r}"
                                  + ("; give an LM checkpoint's path, or null for beam search without an LM"
                                     if k == "lm" else ""))
    base = path.resolve().parent
    from orchestrate.assets import grids_dir

    if base == grids_dir().resolve():  # a packaged spec: its paths read as from ./grids/ of the folder it is run in
        base = Path.cwd() / "grids"
    name = _name(where, raw["name"])
    lm = None if raw["lm"] is None else _file(where, "lm", raw["lm"], base,
                                                "an LM checkpoint (python -m asr_core lm train), or null")
    if lm is not None:
        _loadable(where, lm)
        if "alpha" not in raw:
            raise DecodeFileError(f"{where}: missing key 'alpha' (the LM's weight; tune it with `python -m "
                                  "asr_core lm tune`)")
    elif "alpha" in raw:
        raise DecodeFileError(f"{where}: 'alpha' is {raw['alpha']!r} but lm is null: alpha weighs the LM's score "
                              "and without an LM it weighs nothing; remove it, or give an LM")
    from asr_core.decoding.beam import BeamConfig

    defaults = BeamConfig()
    alpha = _number(where, "alpha", raw.get("alpha", 0.0))
    beta = _number(where, "beta", raw["beta"])
    beam_width = _positive_int(where, "beam_width", raw.get("beam_width", defaults.beam_width))
    lm_context = _positive_int(where, "lm_context", raw.get("lm_context", defaults.lm_context))
    prompt = raw.get("prompt")
    if prompt is not None:
        if lm is None:
            raise DecodeFileError(f"{where}: 'prompt' is {prompt!r} but lm is null: the prompt is text the LM reads "
                                  "first; remove it, or give an LM")
        prompt = _file(where, "prompt", prompt, base, "a text file")
    return DecodeSpec(name=name, lm=lm, alpha=alpha, beta=beta, beam_width=beam_width, lm_context=lm_context,
                      prompt=prompt, source=str(path.resolve()), **_common(where, raw, base))


def _common(where: str, raw: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """The stride, SNRs and datasets of any decode file, validated."""
    stride = raw.get("stride")
    if stride is not None:
        stride = _number(where, "stride", stride)
        if not 0 < stride <= 1:
            raise DecodeFileError(f"{where}: invalid value for 'stride': {raw['stride']!r}; valid: a fraction of "
                                  "the window in (0, 1], or leave it out for each trial's eval.stride")
    snrs = tuple(_number(where, "snrs", v) for v in _list(where, "snrs", raw.get("snrs"), "SNRs in dB"))
    if len(set(snrs)) != len(snrs):
        raise DecodeFileError(f"{where}: 'snrs' repeats a value: {list(snrs)}; valid: distinct SNRs in dB")
    datasets = _datasets(where, _list(where, "datasets", raw.get("datasets"), "NAME=FORMAT:PATH strings"), base)
    tail = raw.get("tail")
    if tail is not None:
        from asr_core.scoring.tail import load_tail

        tail = _file(where, "tail", tail, base, "a tail set (python -m asr_core tailset TEXT --out FILE)")
        try:
            load_tail(tail, "tail")
        except ValueError as e:
            raise DecodeFileError(f"{where}: {e}") from None
    return {"stride": stride, "snrs": snrs, "datasets": datasets, "tail": tail}


def _greedy_head(raw: Mapping[str, Any], path: Path, key: str, does: str) -> tuple[str, Path]:
    """The name of a greedy decode file (``key``: ``fusion`` or ``window_s``, which ``does`` what it says) and the
    folder its relative paths resolve against; it gives no beam search setting."""
    from orchestrate.assets import grids_dir

    where = str(path)
    beam = [k for k in BEAM_KEYS if k in raw]
    if beam:
        raise DecodeFileError(f"{where}: {beam[0]!r} is a beam search setting, but {key!r} {does}; remove it, or "
                              f"{key!r} for a beam decoder")
    if "name" not in raw:
        raise DecodeFileError(f"{where}: missing key 'name' (the evaluation's name)")
    base = path.resolve().parent
    if base == grids_dir().resolve():  # a packaged spec: its paths read as from ./grids/ of the folder it is run in
        base = Path.cwd() / "grids"
    return _name(where, raw["name"]), base


def _parse_plain(raw: Mapping[str, Any], path: Path) -> DecodeSpec:
    """A plain test set: ``datasets`` (and ``snrs``) decoded as each model's own evaluation; a file with a name but
    no decoder is refused, saying both ways."""
    from asr_core.contract.evaluation import DEFAULT_EVALUATION
    from orchestrate.assets import grids_dir

    where = str(path)
    plain = ("a file of only 'datasets' (and 'snrs') adds plain test sets, decoded as each model's own evaluation "
             "(its stride and tail; metrics wer/<dataset>, the report's main WER table)")
    if "name" in raw:
        raise DecodeFileError(f"{where}: no decoder: give 'lm' (an LM checkpoint, or null: beam search), 'fusion' or "
                              f"'window_s' for an evaluation named {raw['name']!r}; or leave out 'name': {plain}")
    for k in ("stride", "tail"):
        if k in raw:
            raise DecodeFileError(f"{where}: {k!r} is given, but {plain}; remove it, or evaluate another {k} under "
                                  "a name of its own ('name' and 'window_s' or 'fusion')")
    if not raw.get("datasets"):
        raise DecodeFileError(f"{where}: missing key 'datasets' (NAME=FORMAT:PATH strings): {plain}; or give a "
                              "decoder: 'name' and 'lm', 'fusion' or 'window_s'")
    base = path.resolve().parent
    if base == grids_dir().resolve():  # a packaged spec: its paths read as from ./grids/ of the folder it is run in
        base = Path.cwd() / "grids"
    return DecodeSpec(name=DEFAULT_EVALUATION, lm=None, alpha=0.0, beta=0.0, beam_width=1, lm_context=1,
                      plain=True, source=str(path.resolve()), **_common(where, raw, base))


def _parse_fusion(raw: Mapping[str, Any], path: Path) -> DecodeSpec:
    """A window fusion file: ``name``, ``fusion`` (a list of methods, or ``all``), and the common keys."""
    from asr_core.contract.metrics import FUSION_METHODS

    where = str(path)
    name, base = _greedy_head(raw, path, "fusion", "decodes greedily with the windows joined each way named")
    v = raw["fusion"]
    methods = tuple(FUSION_METHODS) if v == "all" else v
    valid = f"valid: a list of {', '.join(FUSION_METHODS)} (each once), or 'all'"
    if not isinstance(methods, (list, tuple)) or not methods:
        raise DecodeFileError(f"{where}: invalid value for 'fusion': {v!r}; {valid}")
    for m in methods:
        if m not in FUSION_METHODS:
            why = " ('average' is the trial's own greedy decoding)" if m == "average" else ""
            raise DecodeFileError(f"{where}: invalid value in 'fusion': {m!r}{why}; {valid}")
    if len(set(methods)) != len(methods):
        raise DecodeFileError(f"{where}: 'fusion' repeats a method: {list(methods)}; {valid}")
    return DecodeSpec(name=name, lm=None, alpha=0.0, beta=0.0, beam_width=1, lm_context=1,
                      fusion=tuple(methods), source=str(path.resolve()), **_common(where, raw, base))


def _parse_windows(raw: Mapping[str, Any], path: Path) -> DecodeSpec:
    """A file of decoding windows: ``name``, ``window_s`` (seconds: a list, or one number), and the common keys."""
    from asr_core.contract.metrics import window_decoder

    where = str(path)
    name, base = _greedy_head(raw, path, "window_s", "decodes greedily with windows of those lengths")
    v = raw["window_s"]
    valid = "valid: positive numbers of seconds, each once (a list, or one number), e.g. [5.12, 10.24, 20.48]"
    windows = v if isinstance(v, list) else [v]
    if not windows:
        raise DecodeFileError(f"{where}: invalid value for 'window_s': {v!r}; {valid}")
    for w in windows:
        try:
            window_decoder(w)  # a bool, a string, 0, a negative or not finite number: refused
        except ValueError:
            raise DecodeFileError(f"{where}: invalid value in 'window_s': {w!r}; {valid}") from None
    if len({window_decoder(w) for w in windows}) != len(windows):
        raise DecodeFileError(f"{where}: 'window_s' repeats a window: {windows}; {valid}")
    return DecodeSpec(name=name, lm=None, alpha=0.0, beta=0.0, beam_width=1, lm_context=1,
                      windows=tuple(float(w) for w in windows), source=str(path.resolve()), **_common(where, raw, base))


def _name(where: str, v: Any) -> str:
    from asr_core.contract.metrics import is_decoder_name

    if not (isinstance(v, str) and v[:1].isalnum() and is_decoder_name(v)):  # the evaluation's own rule
        raise DecodeFileError(f"{where}: invalid value for 'name': {v!r}; valid: letters, digits, '-', '_' and '.', "
                              "starting with a letter or digit, not 'greedy' (it names the metrics wer_<name>/... "
                              "and a folder of the sweep)")
    return v


def _number(where: str, key: str, v: Any) -> float:
    if isinstance(v, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
        try:
            v = float(v)
        except ValueError:
            pass
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise DecodeFileError(f"{where}: invalid value for {key!r}: {v!r}; valid: a finite number")
    return float(v)


def _positive_int(where: str, key: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise DecodeFileError(f"{where}: invalid value for {key!r}: {v!r}; valid: a positive integer")
    return v


def _list(where: str, key: str, v: Any, what: str) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise DecodeFileError(f"{where}: invalid value for {key!r}: {v!r}; valid: a list of {what}")
    return v


def _file(where: str, key: str, v: Any, base: Path, what: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise DecodeFileError(f"{where}: invalid value for {key!r}: {v!r}; valid: the path of {what}")
    p = Path(v).expanduser()
    p = (p if p.is_absolute() else base / p).resolve()
    if not p.is_file():
        raise DecodeFileError(f"{where}: {key} {v!r} not found ({p}); valid: the path of {what} (relative paths "
                              "resolve against the decode file's folder)")
    return str(p)


def _loadable(where: str, lm: str) -> None:
    """The LM file is a checkpoint ``torch.load(weights_only=True)`` reads (memory-mapped: nothing is copied)."""
    from asr_core.training.checkpoint import CheckpointError, read_header

    try:
        ck = read_header(lm)
    except CheckpointError as e:  # names the file, what is wrong and what is valid
        raise DecodeFileError(f"{where}: lm: {e}") from None
    except Exception as e:  # noqa: BLE001 - torch raises many kinds for a file that is not a checkpoint
        raise DecodeFileError(f"{where}: lm {lm} is not a checkpoint torch can read with weights_only=True "
                              f"({type(e).__name__}: {e}); valid: a checkpoint of `python -m asr_core lm train`"
                              ) from None
    if not isinstance(ck, dict):
        raise DecodeFileError(f"{where}: lm {lm} holds a {type(ck).__name__}, not a checkpoint's dict; valid: a "
                              "checkpoint of `python -m asr_core lm train`")


def _datasets(where: str, items: list[Any], base: Path) -> tuple[str, ...]:
    """``NAME=FORMAT:PATH`` specs with PATH made absolute; each must exist and the names must be distinct."""
    from asr_core.contract.specs import CorpusError, parse_dataset_spec, split_spec

    out: list[str] = []
    names: list[str] = []
    for v in items:
        if not isinstance(v, str):
            raise DecodeFileError(f"{where}: invalid value in 'datasets': {v!r}; valid: NAME=FORMAT:PATH strings")
        try:
            name, corpus = parse_dataset_spec(v)
            fmt, p = split_spec(corpus)
        except CorpusError as e:
            raise DecodeFileError(f"{where}: invalid value in 'datasets': {e}") from None
        p = p.expanduser()
        p = (p if p.is_absolute() else base / p).resolve()
        # a prepared corpus is only one once its manifest is written (an unfinished preparation is not)
        if not (p / "prepared.json" if fmt == "prepared" else p).exists():
            raise DecodeFileError(f"{where}: dataset {v!r}: {p} not found (relative paths resolve against the decode "
                                  "file's folder)")
        if name in names:
            raise DecodeFileError(f"{where}: dataset name {name!r} given twice in 'datasets'; valid: distinct names "
                                  "(each names its metrics)")
        names.append(name)
        out.append(f"{name}={fmt}:{p}")
    return tuple(out)
