#!/usr/bin/env bash
# The miniature study, end to end on one machine with no GPU and no cluster:
#   1. a synthetic long-form corpus spoken by espeak-ng (in-domain and shifted-domain test sets); with --homophones,
#      a planted long-range cue: homophones spelt by the recording's topic, given away 20-60 s before each (synth
#      --cue); with --cued, the copy control: a one-piece identity token said clearly, then asked for with its audio
#      masked 1-3 s (near band) or 20-60 s later (far band; synth --copy near,far),
#   2. small FastConformer-CTC models at four context lengths x two seeds, trained and evaluated (clean and with
#      music at three SNRs) through the `local` backend (Ray Tune), every run recorded in MLflow (sqlite),
#   3. the analysis report: WER/WERR per context length with seed spread, significance tests, SNR curves, and where
#      the corpus has a cue, the cue-word error rate (the planted words) beside the WER;
#   4. with --homophones, how far back each model's decoded output reaches (python -m asr_core reach); with --cued,
#      the slots scored one window per slot (forced choice among the tokens), and the causal check: the keys
#      re-rendered as other tokens, and silenced (python -m asr_core recall --key as-is,swap,silence).
# Re-running reuses what is finished (the corpus, finished trials); only the report is written again.
# Times are on 2 cores from a fresh clone (docs/results/2026-11-29-demo-long-tests.md and
# 2026-11-29-context-or-fragmentation.md).
#
#   ./scripts/demo.sh            the full demo (about 18 minutes: 68 s for the corpus, 17 minutes for the models)
#   ./scripts/demo.sh --quick    the first taste (about 5 minutes): 5 and 10 s of context, two seeds, 600 steps on a
#                                quarter-hour corpus with a short-range cue; the models transcribe (about 80% WER);
#                                its test set alone holds a near-band recall control (1-4 s), never trained on
#   ./scripts/demo.sh --cued     the positive control (under 30 minutes): 10 and 82 s of context and 82 s windows
#                                with banded attention, two seeds, on a corpus with the copy plant (synth --copy
#                                near,far; its own sweep demo-copy; grids/demo-copy.yaml)
#   ./scripts/demo.sh --homophones  the full demo on a corpus with the homophone cue (its own sweep demo-homophones)
#   ./scripts/demo.sh --fragmentation  context or fragmentation (about 22 minutes alone): on the full
#                                demo's corpus (made if absent), the demo's 5.12 and 81.92 s models beside 81.92 s
#                                models with banded attention and 5.12 s models cut at pauses, three seeds
#                                (grids/demo-fragmentation.yaml, in the full demo's sweep demo: its models are
#                                reused, not trained again), the dense 81.92 s models decoded at 5.12-20.48 s windows
#                                too (grids/decode-windows.yaml), and the report (demo-out/demo/report-fragmentation)
#   DEMO_OUT=/tmp/demo ./scripts/demo.sh   write somewhere other than ./demo-out
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0; cued=0; homophones=0; fragmentation=0; train_len=()
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    --cued) cued=1 ;;
    --homophones) homophones=1 ;;
    --fragmentation) fragmentation=1 ;;
    # the header above, from line 2 to the first line that is not a comment
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown argument '$arg'; valid: --quick, --cued, --homophones, --fragmentation, --help" >&2
       exit 2 ;;
  esac
done
if [ $(( quick + cued + homophones + fragmentation )) -gt 1 ]; then
  echo "demo.sh: --quick, --cued, --homophones and --fragmentation are different demos; give one of them" >&2; exit 2
fi

bash scripts/setup.sh
PY=.venv/bin/python
OUT=${DEMO_OUT:-demo-out}
# cue: none, or RATE[,NEAR-FAR] of synth --cue. test_min/test_minutes: the shortest and longest test recording
# (--eval-min-minutes, --eval-max-minutes; test_min empty: synth's default). The recording-level paired tests need
# recordings, and window edges need recordings longer than the windows (--quick and --cued keep theirs as they were)
if [ "$quick" -eq 1 ]; then
  name=demo-quick; grid=grids/demo-quick.yaml; hours=0.25
  test_hours=0.04; test_minutes=0.5; shifted_hours=0.04; shifted_minutes=0.5
  cue=6,3-10  # a short band that 30 s recordings hold: checks the cue's way through the pipeline, not its range
  # training recordings of 24-33 s: a step takes one window from each of B recordings (interleaved batches: 8 at
  # 5.12 s, 4 at 10.24 s), so some 31 recordings fill every step; a quarter of an hour in recordings of 1-5 minutes
  # gave steps of 1 to 5 windows, too few to learn in minutes
  train_len=(--min-minutes 0.4 --max-minutes 0.55)
  # the recall control in the test set only (its own folder, corpus-recall): the models never hear a code word, so it
  # exercises the slots' way through evaluation and the report, not recall (recordings under 45 s: near slots only)
  recall=5
elif [ "$cued" -eq 1 ]; then
  # the copy control (synth --copy near,far): recordings of 3-5 minutes (train) and 3-4 minutes (test), so that
  # every recording holds a far block (its second 81.92 s) as well as near ones; 0.6 h of test speech (about 10
  # recordings, every 5th without keys: the guess rate) for recording-level tests; no shifted set (the control is
  # read in-domain). The old recall plant (synth --recall, grids/demo-cued.yaml) is still made by hand.
  name=demo-copy; grid=grids/demo-copy.yaml; hours=1.0
  test_hours=0.6; test_min=3; test_minutes=4; shifted_hours=0; shifted_minutes=0
  train_len=(--min-minutes 3 --max-minutes 5)
  cue=0
else
  # the full demo, --homophones and --fragmentation: both test sets in recordings of 3-4 minutes, so that every
  # model meets window edges, the 81.92 s one included (a recording is 2.2-2.9 of its windows), and 0.5 h each,
  # which synth deals into 9 in-domain and 8 shifted recordings (seed 0) for the paired tests. The shifted set is
  # made as long as the in-domain one, at a cost (its decoding is about half of each model's evaluation: some 3
  # minutes of the full demo, by estimate): in recordings under a minute, as before, the 81.92 s models decoded each
  # one whole, without an edge. The training split is unchanged (the same hours, lengths and seed), so the models'
  # keys are the demo's.
  name=demo; grid=grids/demo.yaml; hours=1.0
  test_hours=0.5; test_min=3; test_minutes=4; shifted_hours=0.5; shifted_minutes=4
  cue=0
  if [ "$homophones" -eq 1 ]; then
    name=demo-homophones
    cue=6  # 6 cue words a minute asked (about 5.6 reached), band 20-60 s: a 3-4 minute recording holds many
  fi
fi
root="$OUT/$name"
corpus="$root/corpus"
report="$root/report"
if [ "$fragmentation" -eq 1 ]; then
  # the full demo's corpus (made here with its synth arguments if it is not there yet) and its sweep: the dense
  # models have the demo's keys, so those the full demo trained (5.12 and 81.92 s, seeds 1 and 2) are reused, not
  # trained again, and a full demo run later reuses the ones trained here (its other trials keep their evaluation)
  grid=grids/demo-fragmentation.yaml; report="$root/report-fragmentation"
fi
shifted="$root/corpus-shifted"
tests="$corpus"  # the folder of the in-domain test set
mkdir -p "$root"
export PYTHONUNBUFFERED=1
# one thread per process: the local backend runs one trial per core, and a trial's floating-point sums then do not
# depend on how many cores the machine has (Ray sets the same for its trials; this covers the corpus and the report)
export OMP_NUM_THREADS=1
start=$(date +%s)
stamp() { echo; echo "== [$(( $(date +%s) - start ))s] $*"; }
steps=3
if [ "$cued" -eq 1 ] || [ "$homophones" -eq 1 ] || [ "$fragmentation" -eq 1 ]; then steps=4; fi
eval_min=()
if [ -n "${test_min:-}" ]; then
  eval_min=(--eval-min-minutes "$test_min")
  # a corpus of an earlier demo (test recordings under a minute; synth would refuse the new arguments) and the runs
  # beside it, whose models were evaluated on those test sets under the same names (test, test-shifted)
  if [ -f "$corpus/synth.json" ] && ! grep -q '"eval_min_minutes"' "$corpus/synth.json"; then
    echo "demo.sh: $corpus was made by an earlier demo (test recordings under a minute); delete $(dirname "$corpus")" \
      "(its corpus, and its runs evaluated on those test sets) and run again, or keep it and write elsewhere:" \
      "DEMO_OUT=another-folder $0 $*" >&2; exit 2
  fi
fi

cue_args=(--cue "$cue")
if [ "$cue" != 0 ]; then cue_args+=(--cue-report); fi
if [ "$cued" -eq 1 ]; then
  stamp "1/$steps synthetic corpus with the copy plant -> $corpus ($(espeak-ng --version 2>/dev/null | head -1))"
  $PY -m asr_core synth --out "$corpus" --hours "$hours" --eval-hours "$test_hours" --eval-max-minutes "$test_minutes" \
    "${eval_min[@]}" "${train_len[@]}" --voices 3 --splits train,test --seed 0 --copy near,far
  shifted="$corpus"
elif [ "$quick" -eq 1 ]; then
  shifted="$corpus"; tests="$root/corpus-recall"
  stamp "1/$steps synthetic corpus -> $corpus, $tests ($(espeak-ng --version 2>/dev/null | head -1))"
  # train and test-shifted as without the recall control; the test set with it, in its own folder (a corpus folder
  # holds one set of synth arguments). Its recordings depend only on the seed, the split, the recording lengths and
  # the evaluation settings: the same voices, rooms, topics and lengths, with the plant's sentences among the rest
  $PY -m asr_core synth --out "$corpus" --hours "$hours" --eval-hours "$test_hours" --eval-max-minutes "$test_minutes" \
    "${train_len[@]}" --voices 3 --shift near --splits train,test-shifted --seed 0 "${cue_args[@]}"
  $PY -m asr_core synth --out "$tests" --hours "$hours" --eval-hours "$test_hours" --eval-max-minutes "$test_minutes" \
    "${train_len[@]}" --voices 3 --shift near --splits test --seed 0 "${cue_args[@]}" --recall "$recall"
elif [ "$test_hours" = "$shifted_hours" ] && [ "$test_minutes" = "$shifted_minutes" ]; then
  shifted="$corpus"
  stamp "1/$steps synthetic corpus -> $corpus ($(espeak-ng --version 2>/dev/null | head -1))"
  # three voices (a domain small models learn in minutes); test-shifted: those voices at other rates and pitches,
  # in other rooms
  $PY -m asr_core synth --out "$corpus" --hours "$hours" --eval-hours "$test_hours" --eval-max-minutes "$test_minutes" \
    "${eval_min[@]}" "${train_len[@]}" --voices 3 --shift near --splits train,test,test-shifted --seed 0 \
    "${cue_args[@]}"
else
  stamp "1/$steps synthetic corpus -> $corpus, $shifted ($(espeak-ng --version 2>/dev/null | head -1))"
  # as above, the two test sets at their own lengths: the same seed and cue in both folders (test-shifted's
  # recordings depend only on the seed, the split and the evaluation settings)
  $PY -m asr_core synth --out "$corpus" --hours "$hours" --eval-hours "$test_hours" --eval-max-minutes "$test_minutes" \
    "${train_len[@]}" --voices 3 --shift near --splits train,test --seed 0 "${cue_args[@]}"
  $PY -m asr_core synth --out "$shifted" --hours "$hours" --eval-hours "$shifted_hours" \
    --eval-max-minutes "$shifted_minutes" --voices 3 --shift near --splits test-shifted --seed 0 --cue "$cue"
fi
eval_sets="test=podcast:$tests/test, test-shifted=podcast:$shifted/test-shifted"
# --cued and --fragmentation read their question in-domain (grids/demo-fragmentation.yaml: clean only)
if [ "$cued" -eq 1 ] || [ "$fragmentation" -eq 1 ]; then eval_sets="test=podcast:$corpus/test"; fi
# what a demo run on another machine must match to reproduce these numbers: the audio itself (another espeak-ng
# build speaks other samples, while the transcripts and word times, all that the corpus fingerprint covers, may agree)
echo "corpus audio sha256 (train, test, test-shifted): $($PY -c 'import hashlib, pathlib, sys
h = hashlib.sha256()
for d in sys.argv[1:]:
    for p in sorted(pathlib.Path(d).glob("*.wav")):
        h.update(p.read_bytes())
print(h.hexdigest()[:16])' "$corpus/train" "$tests/test" "$shifted/test-shifted" 2>/dev/null)"
# and the CPU kernels the models train with: PyTorch picks them by instruction set (ATEN_CPU_CAPABILITY sets them),
# and kernels of another level sum in another order, so a model's figures hold for the level named here
caps="ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-unset}"
for v in MKL_ENABLE_INSTRUCTIONS ONEDNN_MAX_CPU_ISA; do if [ -n "${!v:-}" ]; then caps+=" $v=${!v}"; fi; done
echo "kernels: $($PY -c 'import torch; print(torch.backends.cpu.get_cpu_capability().lower())') ($caps; CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1))"

stamp "2/$steps training and evaluating the grid $grid (local backend, Ray Tune)"
$PY -m orchestrate plan "$grid"
$PY -m orchestrate submit "$grid" --backend local --sweep "$name" --sweep-root "$root/runs" \
  --set "data.train=podcast:$corpus/train" \
  --set "eval.datasets=[$eval_sets]"
$PY -m orchestrate status "$name" --sweep-root "$root/runs"

report_step=3
if [ "$fragmentation" -eq 1 ]; then
  stamp "3/$steps the dense 81.92 s models decoded at 5.12, 10.24 and 20.48 s windows (grids/decode-windows.yaml)"
  # the same weights at shorter windows: the decoding edges of a short model without its training, as evaluation
  # jobs of the sweep (the local backend, as the trials); the report reads them as decoder window-<W>s
  $PY -m orchestrate evaluate "$name" --spec grids/decode-windows.yaml --where subgrid=dense \
    --where data.context_s=81.92 --sweep-root "$root/runs"
  $PY -m orchestrate status "$name" --sweep-root "$root/runs"
  report_step=4
fi

stamp "$report_step/$steps analysis report"
uri="sqlite:///$(cd "$root/runs" && pwd)/mlflow.db"
# the fragmentation grid has no 10.24 s model: its dense models are compared against 5.12 s, the short context
baseline=()
if [ "$fragmentation" -eq 1 ]; then baseline=(--baseline-context-s 5.12); fi
$PY -m analysis report "$name" --tracking-uri "$uri" --out "$report" "${baseline[@]}"

if [ "$homophones" -eq 1 ]; then
  stamp "4/$steps how far back each model's decoded output reaches (python -m asr_core reach)"
  # every model: a second silenced 1-60 s before another, and each planted word's deciding word silenced
  $PY -m asr_core reach "$root"/runs/"$name"/trials/*/checkpoint.pt --data "test=podcast:$corpus/test" \
    --targets 2 --distances 1,5,10,20,40,60 --out "$root/reach"
fi

if [ "$cued" -eq 1 ]; then
  stamp "4/$steps the slots one window each, with the key as it is, swapped and silenced (python -m asr_core recall)"
  # the causal check: every key re-rendered as its partner token (does the slot's output follow it?) and silenced
  # (does it fall to the guess rate?); the keys' edits are rendered once for all the models
  $PY -m asr_core recall "$root"/runs/"$name"/trials/*/checkpoint.pt --data "test=podcast:$corpus/test" \
    --key as-is,swap,silence --out "$root/recall"
fi

stamp "done"
echo "Report:          $(cd "$report" && pwd)/index.html   (also report.md, figures and CSV tables beside it)"
if [ "$cued" -eq 1 ]; then echo "Recall:          $(cd "$root/recall" && pwd)/summary.csv   (per model, edit and band)"; fi
if [ "$homophones" -eq 1 ]; then echo "Reach:           $(cd "$root/reach" && pwd)/reach.png   (tables in its folders)"; fi
echo "MLflow dashboard: .venv/bin/mlflow ui --backend-store-uri $uri --host 127.0.0.1 --port 5000"
echo "                  then open http://127.0.0.1:5000 and choose the experiment '$name'"
