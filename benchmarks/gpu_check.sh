#!/usr/bin/env bash
# The GPU measurements of issue 23, for a lent machine with one GPU:
#
#   bash benchmarks/gpu_check.sh wheels       # here, with PyPI: the wheels the GPU image lacks
#                                             # -> .whl/ (carry it)
#   bash benchmarks/gpu_check.sh before REV   # here: vit_jax as of git revision REV -> .before/
#                                             # (carry it), the baseline of "what each change gave"
#   bash benchmarks/gpu_check.sh core         # there: each acceptance line once: ViT-B/16 bf16
#                                             # train vs timm with its kernel breakdown and
#                                             # optimised HLO, the trainer, the test suite,
#                                             # Transformer-base vs torch
#   bash benchmarks/gpu_check.sh variants     # there: larger batches, the baseline, options
#
# BUDGET_S=N stops starting runs once N seconds have passed and cuts each run's time limit to
# what is left, so that the whole part ends inside the device call's time limit. Both parts in
# one call of at most 600 s (carry .whl and .before):
#   start=$(date +%s); BUDGET_S=490 bash benchmarks/gpu_check.sh core; \
#   left=$((555 - ($(date +%s) - start))); ((left < 1)) && left=1; \
#   BUDGET_S=$left bash benchmarks/gpu_check.sh variants
# Each part writes its logs and --json reports under runs/gpu_check/PART (packed into
# $OUT/gpu_check_PART.tgz where the device tool's $OUT is set) and prints one table of every
# run last (python -m vit_jax.benchmark.runs_table). Runs go in the order of the issue's
# acceptance lines, but the suite before Transformer-base; one that fails or runs past its
# time limit is reported and the next one runs. SMOKE=1 runs the same steps with tiny models
# and few steps, to check this script on a CPU. The optimised HLO (vit_b*.hlo) reads here
# afterwards:
# python -m vit_jax.benchmark.hlo_costs runs/gpu_check/core/vit_b128.hlo --model-tflop T
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:-}
export PYTHONUNBUFFERED=1

if [[ $part == wheels ]]; then
  # Pure-Python packages the GPU image lacks (ml_collections) or may lack (the test runner
  # with -n); everything else vit_jax needs is there.
  python3 -m pip download -q --no-deps --only-binary=:all: -d .whl 'ml_collections==1.1.0' \
    'pytest==9.1.1' 'pluggy==1.7.0' 'iniconfig==2.3.1' 'pytest-xdist==3.8.0' 'execnet==2.1.2'
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  ls -l .whl
  exit 0
fi
if [[ $part == before ]]; then
  rev=${2:?usage: bash benchmarks/gpu_check.sh before REV}
  rm -rf .before && mkdir .before && git archive "$rev" vit_jax | tar -x -C .before || exit 1
  grep -qx '/.before/' .git/info/exclude 2>/dev/null || echo '/.before/' >> .git/info/exclude
  echo "vit_jax of $(git rev-parse --short "$rev") in .before/"
  exit 0
fi
if [[ $part != core && $part != variants ]]; then
  echo "usage: bash benchmarks/gpu_check.sh wheels|before REV|core|variants (got '${part}')" >&2
  exit 2
fi

logs=$PWD/runs/gpu_check/$part
rm -rf "$logs"
mkdir -p "$logs"
if compgen -G '.whl/*.whl' > /dev/null; then
  wheels=(.whl/ml_collections-*.whl)
  # The test runner's wheels only where the image has no pytest-xdist (its own pytest stays).
  python3 -c 'import xdist' 2>/dev/null || wheels=(.whl/*.whl)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "${wheels[@]}" || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

if [[ ${SMOKE:-0} == 1 ]]; then
  vit=ViT-Ti_16; res=32; batches=(4 8 16); steps=(--steps 2 --warmup 1 --rounds 1 --num-layers 1)
  s2s=(--model Transformer-testing --num-layers 1 --batch 4 --seq-len 16 --decode-length 8)
  trainer_steps=30; log_every=10; limit=300; suite=(tests/test_data_synthetic.py)
else
  vit=ViT-B_16; res=224; batches=(128 256 512); steps=(--steps 15 --warmup 2 --rounds 3)
  s2s=(--model Transformer-base --batch 128 --seq-len 128 --decode-length 64)
  trainer_steps=150; log_every=50; limit=150; suite=(tests)
fi
budget=${BUDGET_S:-0}
failed=()
skipped=()
reports=()

run() {  # run NAME COMMAND...: the command's output to $logs/NAME.log and the screen.
  local name=$1 time_limit=$limit
  shift
  if ((budget > 0)); then
    local left=$((budget - SECONDS))
    if ((left < 30)); then
      skipped+=("$name")
      echo "=== $name: skipped, ${SECONDS}s of BUDGET_S=${budget} spent"
      return
    fi
    ((left < time_limit)) && time_limit=$left
  fi
  echo "=== $name (${SECONDS}s): $*"
  timeout "$time_limit" "$@" 2>&1 | tee "$logs/$name.log"
  local status=${PIPESTATUS[0]}
  if [[ $status != 0 ]]; then
    failed+=("$name (exit $status$([[ $status == 124 ]] && echo ", past ${time_limit}s"))")
  fi
}

bench() {  # bench NAME FLAGS...: python -m vit_jax.benchmark with a --json report.
  local name=$1
  shift
  reports+=("$logs/$name.json")
  run "$name" python3 -m vit_jax.benchmark "$@" --json "$logs/$name.json"
}

train=(--mode train --model "$vit" --dtype bfloat16 --resolution "$res" "${steps[@]}")
b=${batches[0]}
if [[ $part == core ]]; then
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit \
    --format=csv 2>/dev/null
  python3 -c 'import jax, flax, optax, orbax.checkpoint as o; print("jax", jax.__version__,
    "flax", flax.__version__, "optax", optax.__version__, "orbax", o.__version__, jax.devices())'
  # The reference (as README's table), against timm, with the kernel-time breakdown and the
  # optimised HLO of the step.
  bench "vit_b$b" "${train[@]}" --batch "$b" --compare timm --trace /tmp/vit_trace \
    --hlo-out "$logs/vit_b$b.hlo"
  find /tmp/vit_trace -name perfetto_trace.json.gz -size -12M -exec cp {} "$logs/" \;
  # The trainer on the reference's model, batch and optimizer, input made without TensorFlow.
  rm -rf /tmp/trainer_vit
  run trainer python3 -m vit_jax.main --config="configs/vit.py:$vit,synthetic" \
    --workdir=/tmp/trainer_vit --config.data.image_size="$res" --config.batch_size="$b" \
    --config.model.dtype=bfloat16 --config.optimizer.name=adamw \
    --config.optimizer.learning_rate=1e-4 --config.optimizer.weight_decay=1e-4 \
    --config.optimizer.warmup_steps=0 --config.total_steps="$trainer_steps" \
    --config.log_every="$log_every" --config.eval_every=0 --config.checkpoint_every=0 \
    --config.eval_batch_size=256 --config.data.synthetic_test_examples=256
  mkdir -p "$logs/trainer"
  cp /tmp/trainer_vit/{metrics.jsonl,config.json} "$logs/trainer/" 2>/dev/null
  # The suite before Transformer-base, which printed nothing in its 150 s on the last H200
  # (its runs now say what they are at after 20 s). GPU-only paths run, TensorFlow's are
  # skipped with the reason (-rs); an earlier version's took 2m12s there.
  vit_limit=$limit
  limit=$((vit_limit * 9 / 5))
  run suite env XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -q -n 8 -rs \
    -p no:cacheprovider "${suite[@]}"
  # Four programs to compile (train, greedy decoding with and without the cache, beam search;
  # the train step alone took 21 s compiled for the H200 on 2 cores) and a torch peer: more
  # time than a ViT run.
  limit=$((vit_limit * 8 / 5))
  bench transformer_base "${s2s[@]}" --mode seq2seq --dtype bfloat16 "${steps[@]}" \
    --compare torch --beam-size 4
else
  # The largest batch; the same flags on .before's vit_jax (what this version's changes
  # gave); the products without Triton's GEMM fusions (the H200 run's step had no bias or
  # GELU in a cuBLASLt epilogue, the compile without autotuning had, with its jaxlib too);
  # without XLA's dot merger (jaxlib 0.11.2 merges two pairs of products in each layer at
  # batch 128 and the compile-only bound rises: README, "Compiling for a GPU"); the steps
  # timed one by one (as versions before --timing did); XLA's attention instead of cuDNN's;
  # options.
  bench "vit_b${batches[2]}" "${train[@]}" --batch "${batches[2]}"
  if [[ -d .before/vit_jax ]]; then
    name="vit_b${b}_before"
    reports+=("$logs/$name.json")
    run "$name" env -C .before python3 -m vit_jax.benchmark "${train[@]}" --batch "$b" \
      --json "$logs/$name.json"
  fi
  bench "vit_b${b}_no_triton_gemm" "${train[@]}" --batch "$b" \
    --xla-option xla_gpu_enable_triton_gemm=false --hlo-out "$logs/vit_b${b}_no_triton_gemm.hlo"
  bench "vit_b${b}_no_dot_merger" "${train[@]}" --batch "$b" \
    --xla-option xla_disable_hlo_passes=dot-merger
  bench "vit_b${b}_isolated" "${train[@]}" --batch "$b" --timing isolated
  bench "vit_b${batches[1]}" "${train[@]}" --batch "${batches[1]}"
  bench "vit_b${b}_xla_attention" "${train[@]}" --batch "$b" --attention fused
  bench "vit_b${b}_state_bf16" "${train[@]}" --batch "$b" --optimizer-state-dtype bfloat16
fi

echo "=== all runs ($part, ${SECONDS}s)"
tables=()
for report in "${reports[@]}"; do [[ -e $report ]] && tables+=("$report"); done
against=()
if [[ $part == core && -e $logs/trainer/metrics.jsonl ]]; then
  tables+=("$logs/trainer/metrics.jsonl")
  [[ -e $logs/vit_b$b.json ]] && against=(--against "$logs/vit_b$b.json")
fi
((${#tables[@]})) && python3 -m vit_jax.benchmark.runs_table "${tables[@]}" "${against[@]}"
grep -h -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed)' "$logs/suite.log" 2>/dev/null | tail -1
[[ -n ${OUT:-} ]] && tar czf "$OUT/gpu_check_$part.tgz" -C runs/gpu_check "$part"
((${#skipped[@]})) && echo "skipped (BUDGET_S): ${skipped[*]}"
if ((${#failed[@]})); then
  echo "failed: ${failed[*]}"
  exit 1
fi
