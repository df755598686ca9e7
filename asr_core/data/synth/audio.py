"""The voices and rooms of the synthetic corpus (:mod:`asr_core.data.synth.generate`): a :class:`Speaker` is an
espeak-ng voice, rate and pitch (:func:`espeak` speaks one word with it, its silence trimmed), a :class:`Room` an
acoustic condition held for a whole recording (:func:`apply_room`: reverberation, channel colouring and stationary
background noise of a given colour and level).
"""

from __future__ import annotations

import io
import subprocess
from dataclasses import dataclass

import numpy as np
import soundfile as sf

from asr_core.data.audio import SAMPLE_RATE


@dataclass(frozen=True)
class Speaker:
    voice: str  # e.g. "en-us+m3"
    rate: int
    pitch: int


@dataclass(frozen=True)
class Room:
    highpass_hz: float
    lowpass_hz: float
    peak_hz: float
    peak_db: float
    reverb_s: float
    reverb_mix: float
    noise_snr_db: float
    noise_slope: float  # 0 white, 1 pink, 2 brown
    word_gap_s: float  # mean pause between words: part of a speaker's style, held for the recording


def espeak(text: str, speaker: Speaker) -> np.ndarray:
    """``text`` spoken by ``speaker`` as float32 at 16 kHz, leading/trailing silence trimmed. Shape (N,)."""
    cmd = ["espeak-ng", "-v", speaker.voice, "-s", str(speaker.rate), "-p", str(speaker.pitch), "--stdout", text]
    try:
        out = subprocess.run(cmd, capture_output=True, check=True, timeout=60).stdout
    except FileNotFoundError:
        raise RuntimeError("espeak-ng is not installed (Debian package espeak-ng); the synthetic corpus needs it") \
            from None
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"espeak-ng failed for voice {speaker.voice!r}: {e.stderr.decode(errors='replace')}") \
            from None
    data, sr = sf.read(io.BytesIO(out), dtype="float32")
    if sr != SAMPLE_RATE:
        from scipy import signal  # here, not at the top: 0.3-0.4 s every trainer would pay (it imports this module)

        g = np.gcd(sr, SAMPLE_RATE)
        data = signal.resample_poly(data, SAMPLE_RATE // g, sr // g).astype(np.float32)
    return trim(data)


def trim(x: np.ndarray, rel_db: float = -45.0, margin_s: float = 0.01) -> np.ndarray:
    """Cut leading and trailing samples quieter than ``rel_db`` below the loudest 5 ms frame."""
    hop = int(0.005 * SAMPLE_RATE)
    n = len(x) // hop
    if n == 0:
        return x
    energy = (x[: n * hop].reshape(n, hop) ** 2).mean(axis=1)
    loud = np.nonzero(energy > energy.max() * 10 ** (rel_db / 10))[0]
    margin = int(margin_s * SAMPLE_RATE)
    start = max(0, loud[0] * hop - margin)
    end = min(len(x), (loud[-1] + 1) * hop + margin)
    return x[start:end]


def apply_room(x: np.ndarray, room: Room, rng: np.random.Generator, levels_of: np.ndarray | None = None
               ) -> np.ndarray:
    """Reverberation, channel colouring and stationary background noise, then a fixed peak level. (N,) -> (N,)

    ``levels_of`` (shape (N,), default ``x``): the signal whose speech power sets the noise level and whose peak sets
    the output gain, so that an edited ``x`` gets exactly the room, noise and gain of the unedited one."""
    from scipy import signal  # here, not at the top (see espeak)

    sr = SAMPLE_RATE
    # a room: exponentially decaying noise (decay reaches -60 dB at reverb_s), mixed behind the direct sound
    n_ir = max(1, int(room.reverb_s * sr))
    ir = rng.standard_normal(n_ir) * np.exp(-6.9 * np.arange(n_ir) / n_ir)
    ir /= np.sqrt((ir ** 2).sum())
    sos = np.concatenate([signal.butter(2, room.highpass_hz, "highpass", fs=sr, output="sos"),
                          signal.butter(4, min(room.lowpass_hz, 0.45 * sr), "lowpass", fs=sr, output="sos"),
                          _peaking(room.peak_hz, room.peak_db, q=1.2)])

    def channel(v: np.ndarray) -> np.ndarray:
        return signal.sosfilt(sos, v + room.reverb_mix * signal.fftconvolve(v, ir)[: len(v)])

    ref = x if levels_of is None else levels_of
    y_ref = channel(ref)
    y = y_ref if levels_of is None else channel(x)
    speech_power = float(np.mean(y_ref[np.abs(ref) > 1e-4] ** 2)) if np.any(np.abs(ref) > 1e-4) else 1e-6
    noise = coloured_noise(len(y), room.noise_slope, rng) * np.sqrt(speech_power / 10 ** (room.noise_snr_db / 10))
    gain = 0.7 / max(1e-6, float(np.abs(y_ref + noise).max()))
    return ((y + noise) * gain).astype(np.float32)


def _peaking(f0: float, gain_db: float, q: float) -> np.ndarray:
    """RBJ peaking-EQ biquad as one second-order section."""
    a = 10 ** (gain_db / 40)
    w0 = 2 * np.pi * f0 / SAMPLE_RATE
    alpha = np.sin(w0) / (2 * q)
    b = np.array([1 + alpha * a, -2 * np.cos(w0), 1 - alpha * a])
    den = np.array([1 + alpha / a, -2 * np.cos(w0), 1 - alpha / a])
    return np.concatenate([b / den[0], den / den[0]])[None, :]


def coloured_noise(n: int, slope: float, rng: np.random.Generator) -> np.ndarray:
    """Unit-power noise with a 1/f^slope power spectrum. Shape (n,)."""
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.fft.rfftfreq(n, 1 / SAMPLE_RATE)
    spec *= 1.0 / np.maximum(f, 20.0) ** (slope / 2)
    out = np.fft.irfft(spec, n)
    return out / max(1e-12, float(np.sqrt(np.mean(out ** 2))))
