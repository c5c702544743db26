#!/usr/bin/env bash
# Qwen3 end to end on the GPU machine: prepare, kern-run on prompts, the HF equivalence test, the benchmark.
#
#   OUT=/path/for/logs tools/gpu/e2e.sh [prepare] [run] [test] [bench]     (default: all four, in order)
#
# Run from the repository root. Work files (kernels, random checkpoints, kern weights, manifests) go to
# $KERN_E2E_DIR (default .gpu/e2e, git-ignored, kept between calls on a warm machine); logs to $OUT.
# Needs python3 with torch, transformers, triton, cuda-bindings, safetensors, tokenizers, numpy, and
# msgspec, nvmath-python, pyelftools, pytest: wheels in .whl/ are installed first when present.
# Each stage fits one 10-minute device call; `prepare run test` then `bench` is the usual split.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-.gpu/out}
export KERN_E2E_DIR=${KERN_E2E_DIR:-.gpu/e2e}
export KERN_E2E_OUT=$OUT
export PYTHONPATH=packages/kern-schema/src:packages/kern-verify/src:packages/kern-driver/src:packages/kern-run/src:tools${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT" "$KERN_E2E_DIR"
W=$KERN_E2E_DIR
stages=("$@"); [ ${#stages[@]} -eq 0 ] && stages=(prepare run test bench)
status=0

if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps .whl/*.whl > "$OUT/pip.log" 2>&1 || echo "e2e: pip install of .whl/ failed, see $OUT/pip.log"
fi

kern_run() {  # geometry, log name, extra args...
  local g=$1 name=$2; shift 2
  echo "== kern-run $g $*" | tee "$OUT/$name.txt"
  timeout 300 python3 -m kern_run.cli --manifest "$W/qwen3-$g/manifest.json" --kernels "$W/kernels" \
    --weights "$W/qwen3-$g/weights.safetensors" --weights "$W/qwen3-$g/lm_head_screen.safetensors" "$@" \
    >> "$OUT/$name.txt" 2>&1  # (the default manifest's screened lm_head: prepare.py keeps its tensors apart)
  local rc=$?
  echo "   exit $rc" | tee -a "$OUT/$name.txt"; tail -n 4 "$OUT/$name.txt"
  return $rc
}

for stage in "${stages[@]}"; do
  t0=$(date +%s)
  echo "=== stage $stage"
  case $stage in
    prepare)
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
      python3 tools/gpu/prepare.py --work "$W" 2>&1 | tee "$OUT/prepare.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || { cp "$W"/logs/*.log "$OUT/" 2>/dev/null; echo "e2e: prepare failed"; exit 1; }
      cp "$W"/logs/*.log "$OUT/" 2>/dev/null
      ;;
    run)
      kern_run 0.6b kern-run-0.6b --prompt "The capital of France is" --steps 48 || status=1
      kern_run 4b kern-run-4b --prompt "多字节 streaming: 東京タワー 🎉 and" --steps 128 --chunk 512 || status=1
      kern_run 4b kern-run-4b-eager -q --prompt-ids 785,6722,315,9625,374 --steps 32 --eager || status=1
      # the errors a user sees: one line each (these must fail)
      kern_run 0.6b kern-run-err-capacity -q --prompt "The capital of France is" --steps 100 --capacity 64 && status=1
      kern_run 0.6b kern-run-err-weights -q --prompt-ids 1,2,3 --weights "$W/qwen3-4b/weights.safetensors" && status=1
      # the default (screened) manifest without the screen's file: the two missing tensors named
      timeout 300 python3 -m kern_run.cli --manifest "$W/qwen3-0.6b/manifest.json" --kernels "$W/kernels" -q \
        --weights "$W/qwen3-0.6b/weights.safetensors" --prompt-ids 1,2,3 > "$OUT/kern-run-err-screen.txt" 2>&1 && status=1
      grep -q 'lm_head.screen.q8' "$OUT/kern-run-err-screen.txt" || { echo "e2e: the missing screen tensors are not named"; status=1; }
      ;;
    test)
      timeout 540 python3 -m pytest tests-integration/gpu/test_e2e_qwen3.py -v -s -p no:cacheprovider \
        --junitxml="$OUT/test_e2e.xml" 2>&1 | tee "$OUT/test_e2e.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    bench)
      cp BENCHMARKS.md "$OUT/BENCHMARKS.md" 2>/dev/null || : > "$OUT/BENCHMARKS.md"
      timeout 560 python3 tools/bench_decode.py --work "$W" --geometry 4b --append "$OUT/BENCHMARKS.md" 2>&1 \
        | tee "$OUT/bench_decode.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    *) echo "e2e: unknown stage $stage (prepare run test bench)"; exit 2 ;;
  esac
  echo "=== stage $stage: $(( $(date +%s) - t0 )) s"
done
exit $status
