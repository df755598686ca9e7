#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian machine: system packages (when root) and a pinned
# Python environment in .venv. Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(espeak-ng munge mariadb-server slurm-wlm slurmdbd chromium sctk)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "[setup] apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "[setup] missing system packages: ${missing[*]}" >&2
    echo "[setup] run as root, or: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$stamp" ]; then
  echo "[setup] pip install -e '.[dev]' (torch==2.11.0, torchaudio==2.11.0 pinned; first time takes a few minutes)"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
echo "[setup] ready: $(.venv/bin/python -c 'import torch, torchaudio; print("torch", torch.__version__, "torchaudio", torchaudio.__version__)')"
# the one console command (pyproject.toml [project.scripts]) and its shell completion (argcomplete)
echo "[setup] $(.venv/bin/asr-study --version); on PATH after: source .venv/bin/activate"
echo "[setup] tab completion (bash, zsh): eval \"\$(register-python-argcomplete asr-study)\""
