"""Prepared corpora: a corpus read once and stored as memory-mapped arrays, so that a trial opens it in seconds and
holds almost nothing of it in memory (the ``prepared`` format; ``python -m asr_core prepare`` writes one).

A reader's :class:`~asr_core.data.corpora.base.Recording` costs about 206 bytes per word (one frozen dataclass each):
110 GB for the paper's half a billion podcast words, in every trial, after re-parsing tens of GB of JSON. A
prepared corpus keeps each word as three 4-byte numbers in files that are mapped, not read: its start and end in
integer milliseconds (when every time of the corpus is a whole millisecond, which the speech-API transcripts are;
else float64 seconds, 20 bytes a word) and its index in the corpus's lexicon of distinct words. A
:class:`PreparedCorpus` is a ``Sequence[Recording]`` in id order that builds each recording when it is asked for;
what a trial reads once per recording (durations, whether it is timed) comes from arrays, without building one.

Storage: NumPy ``.npy`` files opened with ``numpy.load(mmap_mode="r")``. The format is NumPy's own, documented and
stable (NEP 1), zero-copy, and needs no library beyond NumPy (Arrow or HDF5 would add one for the same three flat
arrays). Every process of a machine (trials, loader workers) shares the pages the kernel caches.

Layout of ``OUT/``::

    prepared.json        what it is: name, source spec, fingerprint, counts, time unit, format version
    recordings.json      ids and audio paths, in id order
    durations.npy        float64 (R,)            seconds
    timed.npy            uint8   (R,)            1: the recording has words and every one has both times
    word_offsets.npy     int64   (R + 1,)        recording r's words are [offsets[r], offsets[r + 1])
    word_start.npy       int32 ms or float64 s   (W,), missing time: INT32_MIN / NaN
    word_end.npy         the same                (W,)
    word_type.npy        uint32  (W,)            index into the lexicon
    lexicon.bin          UTF-8 of every distinct word, concatenated
    tokenizer-V.model    the SentencePiece tokenizer of V outputs on all transcripts (``prepare --vocab-size V``)
    lexicon_offsets.npy  int64   (T + 1,)
    ignore.npy           float64 (I, 2)          regions to zero (TED-LIUM), seconds
    ignore_offsets.npy   int64   (R + 1,)

The arrays are written first and ``prepared.json`` last (atomically): a folder without it is an unfinished
preparation, never a corpus. The content fingerprint (:mod:`asr_core.data.corpora.fingerprint`) is computed from the
source recordings and stored, so a trial checks its data's identity without reading every word.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, overload

import numpy as np

from asr_core.contract.specs import CorpusError
from asr_core.data.corpora.base import Problems, Recording, Word
from asr_core.data.corpora.fingerprint import fingerprint, fingerprint_in_order

FORMAT = "asr_core.prepared"
VERSION = 1
MANIFEST = "prepared.json"
NO_MS = np.iinfo(np.int32).min  # a missing time, in millisecond arrays
WORD_CACHE = 65536
_ARRAYS = ("durations", "timed", "word_offsets", "word_start", "word_end", "word_type", "lexicon_offsets", "ignore",
           "ignore_offsets")


def _whole_ms(times: Iterable[float | None]) -> bool:
    """Whether every time is a whole number of milliseconds that ``ms / 1000`` gives back bit for bit, within int32."""
    for t in times:
        if t is None:
            continue
        ms = round(t * 1000)
        if ms / 1000 != t or not (NO_MS < ms <= np.iinfo(np.int32).max):
            return False
    return True


def write_prepared(recordings: Sequence[Recording], out: str | Path, *, name: str, source: str,
                   progress: Any = None, vocab_sizes: Sequence[int] = ()) -> Path:
    """Store ``recordings`` as a prepared corpus in ``out`` (created; an existing corpus there is refused).
    ``progress``: an object with ``update(n)`` called once per recording (e.g. a tqdm bar). ``vocab_sizes``: train
    the tokenizer of each size (``model.vocab_size``, blank included) on all transcripts, once, exactly as a trial
    would, and keep it in ``out``. Returns ``out``."""
    out = Path(out)
    if (out / MANIFEST).exists():
        raise CorpusError(f"{out} already holds a prepared corpus ({out / MANIFEST}); remove it or choose another OUT")
    out.mkdir(parents=True, exist_ok=True)
    recs = sorted(recordings, key=lambda r: r.id)
    n_words = sum(len(r.words) for r in recs)
    ms = _whole_ms(t for r in recs for w in r.words for t in (w.start, w.end))
    times = np.empty((2, n_words), dtype=np.int32 if ms else np.float64)
    types = np.empty(n_words, dtype=np.uint32)
    offsets = np.zeros(len(recs) + 1, dtype=np.int64)
    ignore_offsets = np.zeros(len(recs) + 1, dtype=np.int64)
    ignore: list[tuple[float, float]] = []
    lexicon: dict[str, int] = {}
    missing = NO_MS if ms else np.nan
    i = 0
    for r_idx, rec in enumerate(recs):
        for w in rec.words:
            types[i] = lexicon.setdefault(w.text, len(lexicon))
            for row, t in enumerate((w.start, w.end)):
                times[row, i] = missing if t is None else (round(t * 1000) if ms else t)
            i += 1
        offsets[r_idx + 1] = i
        ignore.extend(rec.ignore)
        ignore_offsets[r_idx + 1] = len(ignore)
        if progress is not None:
            progress.update(1)
    arrays = {"durations": np.array([r.duration for r in recs], dtype=np.float64),
              "timed": np.array([r.timed for r in recs], dtype=np.uint8), "word_offsets": offsets,
              "word_start": times[0], "word_end": times[1], "word_type": types,
              "ignore": np.array(ignore, dtype=np.float64).reshape(-1, 2), "ignore_offsets": ignore_offsets}
    tokenizers = _train_tokenizers(lambda: (r.text for r in recs), out, vocab_sizes)
    return write_arrays(out, arrays, ids=[r.id for r in recs], audio=[str(r.audio) for r in recs],
                        lexicon=list(lexicon), name=name, source=source, content=fingerprint(recs),
                        tokenizers=tokenizers)


def _train_tokenizers(texts: Callable[[], Iterable[str]], out: Path, vocab_sizes: Sequence[int]) -> dict[str, str]:
    """Train and keep in ``out`` the tokenizer of each vocabulary size on ``texts()`` (all transcripts, id order,
    as a trial trains its own); {size: file}."""
    from asr_core.data.tokenizer import Tokenizer

    files = {}
    for size in sorted(set(vocab_sizes)):
        files[str(size)] = f"tokenizer-{size}.model"
        Tokenizer.train(texts(), size, out / files[str(size)])
    return files


def write_arrays(out: Path, arrays: dict[str, np.ndarray], *, ids: list[str], audio: list[str], lexicon: list[str],
                 name: str, source: str, content: str, tokenizers: dict[str, str] | None = None) -> Path:
    """Write a prepared corpus from its arrays (the layout in the module docstring, less the lexicon's, which are
    made from ``lexicon``: the distinct words, index = type id); ``prepared.json`` last. Recordings in id order;
    ``content``: their fingerprint (:func:`asr_core.data.corpora.fingerprint.fingerprint`); ``tokenizers``: vocabulary
    size -> tokenizer file in ``out``."""
    blob = [w.encode("utf-8") for w in lexicon]
    lex_offsets = np.zeros(len(blob) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in blob], out=lex_offsets[1:])
    arrays = {**arrays, "lexicon_offsets": lex_offsets}
    missing = sorted(set(_ARRAYS) - set(arrays))
    if missing:
        raise ValueError(f"write_arrays: arrays {missing} missing")
    for key in _ARRAYS:
        arr, path = arrays[key], out / f"{key}.npy"
        if isinstance(arr, np.memmap) and arr.filename and Path(arr.filename).resolve() == path.resolve():
            arr.flush()  # written in place (numpy.lib.format.open_memmap) by merge_prepared
            continue
        np.save(path, np.ascontiguousarray(arr))
    (out / "lexicon.bin").write_bytes(b"".join(blob))
    (out / "recordings.json").write_text(json.dumps({"ids": ids, "audio": audio}))
    ms = arrays["word_start"].dtype == np.int32
    manifest = {"format": FORMAT, "version": VERSION, "name": name, "source": source,
                "fingerprint": content, "recordings": len(ids), "words": int(len(arrays["word_type"])),
                "lexicon": len(blob), "hours": round(float(arrays["durations"].sum()) / 3600, 3),
                "time_unit": "ms" if ms else "s", "tokenizers": tokenizers or {}, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    tmp = out / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, out / MANIFEST)
    return out


def merge_prepared(parts: Sequence[Path], out: Path, *, name: str, source: str, vocab_sizes: Sequence[int] = (),
                   progress: Any = None) -> Path:
    """One prepared corpus in ``out`` from prepared ``parts`` (the shards of ``python -m asr_core prepare``),
    recordings in id order; a recording id in two parts is refused. The word arrays are written in place, so memory
    holds one part at a time, not the corpus; the fingerprint streams over the result. ``progress``: ``update(n)``
    per recording copied, then per recording fingerprinted."""
    corpora = [PreparedCorpus(p) for p in parts]
    owner: dict[str, int] = {}
    for k, c in enumerate(corpora):
        for rid in c.ids:
            if rid in owner:
                raise CorpusError(f"recording {rid!r} is in two shards ({parts[owner[rid]]} and {parts[k]})")
            owner[rid] = k
    order = sorted(owner)
    local = {rid: (k, i) for k, c in enumerate(corpora) for i, rid in enumerate(c.ids)}
    ms = all(c.manifest["time_unit"] == "ms" for c in corpora)
    n_words = sum(c.manifest["words"] for c in corpora)
    out.mkdir(parents=True, exist_ok=True)
    dtype = np.int32 if ms else np.float64
    big = {key: np.lib.format.open_memmap(out / f"{key}.npy", mode="w+", dtype=dt, shape=(n_words,))
           for key, dt in (("word_start", dtype), ("word_end", dtype), ("word_type", np.uint32))}
    lexicon: dict[str, int] = {}
    remaps = []
    for c in corpora:
        lo = c._a["lexicon_offsets"]
        words = [bytes(c._lex[int(lo[t]):int(lo[t + 1])]).decode("utf-8") for t in range(len(lo) - 1)]
        remaps.append(np.array([lexicon.setdefault(w, len(lexicon)) for w in words], dtype=np.uint32))
    n = len(order)
    offsets, ignore_offsets = np.zeros(n + 1, dtype=np.int64), np.zeros(n + 1, dtype=np.int64)
    durations, timed = np.empty(n, dtype=np.float64), np.empty(n, dtype=np.uint8)
    ignore: list[np.ndarray] = []
    ids, audio, w = [], [], 0
    for j, rid in enumerate(order):
        k, r = local[rid]
        c = corpora[k]
        a, b = int(c._a["word_offsets"][r]), int(c._a["word_offsets"][r + 1])
        for key in ("word_start", "word_end"):
            src = c._a[key][a:b]
            if not ms and c.manifest["time_unit"] == "ms":  # exact: every ms time came from a float that ms/1000 gives
                src = np.where(src == NO_MS, np.nan, src / 1000)
            big[key][w:w + b - a] = src
        big["word_type"][w:w + b - a] = remaps[k][c._a["word_type"][a:b]]
        w += b - a
        offsets[j + 1] = w
        i0, i1 = int(c._a["ignore_offsets"][r]), int(c._a["ignore_offsets"][r + 1])
        ignore.append(np.asarray(c._a["ignore"][i0:i1]))
        ignore_offsets[j + 1] = ignore_offsets[j] + (i1 - i0)
        durations[j], timed[j] = c._a["durations"][r], c._a["timed"][r]
        ids.append(rid)
        audio.append(c._audio[r])
        if progress is not None:
            progress.update(1)
    arrays = {"durations": durations, "timed": timed, "word_offsets": offsets, **big,
              "ignore": np.concatenate(ignore).reshape(-1, 2) if ignore else np.zeros((0, 2)),
              "ignore_offsets": ignore_offsets}

    def in_id_order() -> Iterator[Recording]:
        for rid in order:
            k, i = local[rid]
            rec = corpora[k][i]
            if progress is not None:
                progress.update(1)
            yield rec

    content = fingerprint_in_order(in_id_order())
    tokenizers = _train_tokenizers(lambda: (corpora[local[rid][0]][local[rid][1]].text for rid in order), out,
                                   vocab_sizes)
    return write_arrays(out, arrays, ids=ids, audio=audio, lexicon=list(lexicon), name=name, source=source,
                        content=content, tokenizers=tokenizers)


class PreparedCorpus(Sequence[Recording]):
    """The recordings of a prepared corpus, in id order, built on access from memory-mapped arrays.

    ``corpus[i]`` is a :class:`Recording` equal to the one the source reader gave; ``corpus[a:b]`` is a view.
    :meth:`duration_timed` answers what the batch planner needs without building a recording."""

    def __init__(self, path: str | Path, *, _parent: "PreparedCorpus | None" = None,
                 _range: tuple[int, int] | None = None) -> None:
        self.path = Path(path)
        if _parent is not None:
            self.manifest, self._a, self._ids, self._audio = _parent.manifest, _parent._a, _parent._ids, _parent._audio
            self._lex = _parent._lex
        else:
            mpath = self.path / MANIFEST
            try:
                self.manifest = json.loads(mpath.read_text())
            except FileNotFoundError:
                raise CorpusError(f"{self.path} is not a prepared corpus (no {MANIFEST}; an unfinished "
                                  "preparation? run `python -m asr_core prepare` again)") from None
            except (OSError, ValueError) as e:
                raise CorpusError(f"{mpath}: unreadable ({e})") from None
            if self.manifest.get("format") != FORMAT or self.manifest.get("version") != VERSION:
                raise CorpusError(f"{mpath}: format {self.manifest.get('format')!r} version "
                                  f"{self.manifest.get('version')!r}; this code reads {FORMAT!r} version {VERSION}")
            try:
                self._a = {k: np.load(self.path / f"{k}.npy", mmap_mode="r", allow_pickle=False) for k in _ARRAYS}
                table = json.loads((self.path / "recordings.json").read_text())
                self._lex = np.memmap(self.path / "lexicon.bin", dtype=np.uint8, mode="r") \
                    if (self.path / "lexicon.bin").stat().st_size else np.zeros(0, dtype=np.uint8)
            except (OSError, ValueError) as e:
                raise CorpusError(f"prepared corpus {self.path}: {e}") from None
            self._ids, self._audio = table["ids"], table["audio"]
            if len(self._ids) != self.manifest["recordings"] or len(self._a["durations"]) != len(self._ids):
                raise CorpusError(f"prepared corpus {self.path}: {len(self._ids)} ids and "
                                  f"{len(self._a['durations'])} durations, but {MANIFEST} says "
                                  f"{self.manifest['recordings']} recordings; prepare it again")
        self._lo, self._hi = _range if _range is not None else (0, len(self._ids))
        self._ms = self.manifest["time_unit"] == "ms"
        self._last: tuple[int, Recording] | None = None
        self._words: dict[int, str] = {}

    # ---- what a trial asks of the whole corpus ------------------------------------------------------------------
    @property
    def whole(self) -> bool:
        return (self._lo, self._hi) == (0, len(self._ids))

    @property
    def ids(self) -> list[str]:
        return self._ids[self._lo:self._hi]

    @property
    def fingerprint(self) -> str:
        """The source's content fingerprint (stored at preparation; computed for a part of the corpus)."""
        return self.manifest["fingerprint"] if self.whole else fingerprint_in_order(self)

    def duration_timed(self, i: int) -> tuple[float, bool]:
        """(duration, every word timed) of recording ``i``, from the arrays."""
        r = self._index(i)
        return float(self._a["durations"][r]), bool(self._a["timed"][r])

    def tokenizer(self, vocab_size: int) -> Path | None:
        """The tokenizer of ``vocab_size`` outputs trained on all of this corpus at preparation, if there is one and
        this is the whole corpus (a part's tokenizer would be trained on fewer transcripts)."""
        file = self.manifest.get("tokenizers", {}).get(str(vocab_size))
        return self.path / file if file and self.whole else None

    # ---- Sequence ---------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._hi - self._lo

    @overload
    def __getitem__(self, i: int) -> Recording: ...

    @overload
    def __getitem__(self, i: slice) -> "PreparedCorpus": ...

    def __getitem__(self, i: int | slice) -> "Recording | PreparedCorpus":
        if isinstance(i, slice):
            lo, hi, step = i.indices(len(self))
            if step != 1:
                raise ValueError("a prepared corpus slices with step 1 only")
            return PreparedCorpus(self.path, _parent=self, _range=(self._lo + lo, self._lo + max(lo, hi)))
        r = self._index(i)
        if self._last is not None and self._last[0] == r:
            return self._last[1]
        rec = self._build(r)
        self._last = (r, rec)
        return rec

    def __iter__(self) -> Iterator[Recording]:
        for i in range(len(self)):
            yield self[i]

    def _index(self, i: int) -> int:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"recording {i} of a prepared corpus of {n}")
        return self._lo + i

    def _time(self, v: Any) -> float | None:
        if self._ms:
            return None if v == NO_MS else v / 1000
        return None if v != v else v  # NaN: no time

    def _word(self, t: int) -> str:
        """Lexicon entry ``t``; the most recent 65,536 are kept decoded (words repeat: a few thousand are most of
        any transcript)."""
        w = self._words.get(t)
        if w is None:
            if len(self._words) >= WORD_CACHE:
                self._words.clear()
            lo = self._a["lexicon_offsets"]
            w = self._words[t] = bytes(self._lex[int(lo[t]):int(lo[t + 1])]).decode("utf-8")
        return w

    def _build(self, r: int) -> Recording:
        a, b = int(self._a["word_offsets"][r]), int(self._a["word_offsets"][r + 1])
        types = self._a["word_type"][a:b].tolist()
        starts, ends = self._a["word_start"][a:b].tolist(), self._a["word_end"][a:b].tolist()
        words = tuple(Word(self._word(t), self._time(s), self._time(e)) for t, s, e in zip(types, starts, ends))
        i0, i1 = int(self._a["ignore_offsets"][r]), int(self._a["ignore_offsets"][r + 1])
        ignore = tuple((float(x), float(y)) for x, y in self._a["ignore"][i0:i1].tolist())
        return Recording(id=self._ids[r], audio=Path(self._audio[r]), duration=float(self._a["durations"][r]),
                         words=words, ignore=ignore)


def read(path: Path, problems: Problems) -> PreparedCorpus:
    """The ``prepared`` format's reader (``prepared:OUT``)."""
    return PreparedCorpus(path)
