#!/usr/bin/env bash
# The miniature study, end to end on one machine with no GPU and no cluster:
#   1. a synthetic long-form corpus spoken by espeak-ng (in-domain and shifted-domain test sets),
#   2. small FastConformer-CTC models at four context lengths x two seeds, trained and evaluated (clean and with
#      music at three SNRs) through the `local` backend (Ray Tune), every run recorded in MLflow (sqlite),
#   3. the analysis report: WER/WERR per context length with seed spread, significance tests, SNR curves.
# Re-running reuses what is finished (the corpus, finished trials); only the report is written again.
#
#   ./scripts/demo.sh            the full demo (about 19 minutes on 2 cores)
#   ./scripts/demo.sh --quick    a smaller corpus and 50 training steps: a pipeline check (about 3 minutes)
#   DEMO_OUT=/tmp/demo ./scripts/demo.sh   write somewhere other than ./demo-out
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo.sh: unknown argument '$arg'; valid: --quick, --help" >&2; exit 2 ;;
  esac
done

bash scripts/setup.sh
PY=.venv/bin/python
OUT=${DEMO_OUT:-demo-out}
if [ "$quick" -eq 1 ]; then
  name=demo-quick; grid=grids/demo-quick.yaml; hours=0.25; eval_hours=0.04; eval_minutes=0.5
else
  name=demo; grid=grids/demo.yaml; hours=1.0; eval_hours=0.15; eval_minutes=0.75
fi
root="$OUT/$name"
corpus="$root/corpus"
mkdir -p "$root"
export PYTHONUNBUFFERED=1
start=$(date +%s)
stamp() { echo; echo "== [$(( $(date +%s) - start ))s] $*"; }

stamp "1/3 synthetic corpus -> $corpus"
# three voices (a domain small models learn in minutes); test-shifted: those voices at other rates and pitches, in
# other rooms; evaluation recordings under a minute, so each test set has enough of them for the paired tests
$PY -m asr_core synth "$corpus" --hours "$hours" --eval-hours "$eval_hours" --eval-max-minutes "$eval_minutes" \
  --voices 3 --shift near --splits train,test,test-shifted --seed 0

stamp "2/3 training and evaluating the grid $grid (local backend, Ray Tune)"
$PY -m orchestrate plan "$grid"
$PY -m orchestrate submit "$grid" --backend local --sweep "$name" --sweep-root "$root/runs" \
  --set "data.train=podcast:$corpus/train" \
  --set "eval.datasets=[test=podcast:$corpus/test, test-shifted=podcast:$corpus/test-shifted]"
$PY -m orchestrate status "$name" --sweep-root "$root/runs"

stamp "3/3 analysis report"
uri="sqlite:///$(cd "$root/runs" && pwd)/mlflow.db"
$PY -m analysis report --experiment "$name" --tracking-uri "$uri" --out "$root/report"

stamp "done"
echo "Report:          $(cd "$root/report" && pwd)/index.html   (also report.md, figures and CSV tables beside it)"
echo "MLflow dashboard: .venv/bin/mlflow ui --backend-store-uri $uri --host 127.0.0.1 --port 5000"
echo "                  then open http://127.0.0.1:5000 and choose the experiment '$name'"
