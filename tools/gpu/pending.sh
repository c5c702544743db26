#!/usr/bin/env bash
# GPU checks of the opt-in forms and the mining workload, batched for the H200: run from the
# repository root, logs in $OUT. Written without a GPU; every stage ran on the H200 on 2026-11-29
# (session 2: NOTES.md 9-13, BENCHMARKS.md), except the `prime-*` stages (below). The capture of
# tools/gpu/capture_qwen3_compile.py with its one-graph default (775a0fb; dynamo_graphs 1) ran on
# the H200 on 2026-11-29 and is kern-mine's fixture (one program shape for prefill and decode:
# NOTES.md 15); rerun the `capture` stage only to remake it.
# The `prime-*` stages (Runtime.load(prime_graphs=True), kern-driver 0.4.0) ran on the H200 on 2026-12-01 (session 13,
# one device call each; NOTES.md 38, BENCHMARKS.md "Session 13"): 4B -0.043 ms/token at 128 cached tokens, nothing at
# 4,096, 0.6B +0.008/+0.011, the no-PDL program +0.055; prime_graphs stays off by default.
# Note: at most 8 files come back from $OUT; tar the logs when adding stages.
#
#   OUT=/tmp/out tools/gpu/pending.sh [stage ...]        (default: every stage, in order)
#
# Stages (each fits well inside one 10-minute device call; `prep tests witness` then
# `bench uncaptured capture` is a good split):
#   prep        wheels from .whl/ (msgspec, nvmath-python, pyelftools); kernels with the opt-in
#               forms (--fused-attention; --pdl, the default since session 4); random 0.6B/4B
#               checkpoints, kern weights, default manifests (.gpu/e2e) and --pdl manifests
#               (.gpu/e2e-pdl; the same since the generator defaults to --pdl, 2026-11-29 session 4)
#   tests       GPU tests of the opt-in kernels: PDL chain (each NAME_pdl == its twin bit for
#               bit; 0.6B decode with --pdl == --no-pdl), fused decode attention, provider kernels
#   e2e-pdl     the transformers equivalence test on the --pdl manifests
#   witness     kern-capture of a kern-run decode step == the manifest's launch list (issue 7)
#   bench       kern decode ms/token: default (= --pdl since session 4) vs --pdl vs --pdl
#               --fused-attention manifests (tools/bench_decode.py, kern only) and the provider
#               kernels in a graph, fused decode attention beside the two-launch one
#               (tools/bench_kernels.py)
#   uncaptured  tools/gpu/capture_qwen3_compile.py WITHOUT the capture (tells a kern-capture bug
#               from a PyTorch one: it died twice under capture with CUBLAS_STATUS_EXECUTION_FAILED)
#   capture     the same under kern-capture, then the trimmed capture into $OUT/q3c for
#               packages/kern-mine/tests/fixtures/qwen3-0.6b-compile (issue 8)
#   prime-probe kern-driver's GPU tests (test_prime_graphs_keeps_one_graph_that_computes_the_same) and
#               graph_state_probe's alone / prime-graphs / throwaway / no-pdl-alone / no-pdl-prime presets (4B);
#               logs tarred into $OUT/prime-probe.tgz
#   prime-bench bench_decode with and without --prime-graphs, 4B and 0.6B, 128 and 4,096 cached tokens (one
#               process each); logs and the appended tables tarred into $OUT/prime-bench.tgz
#   wait-by-op  (written in session 16 without a GPU; ran the same session: BENCHMARKS.md "Session 16" calls 1-2,
#               NOTES.md 48) which GEMVs' griddepcontrol.wait make the 0.19 ms
#               per 4B token of NOTES.md 47: gemv.cu built with -DGEMV_NO_WAIT, given to one decode GEMV op at a
#               time (tools/manifest_whatif.py --op-module), then to all five, each timed beside the default by
#               program_sweep (one runtime per process, 2 rounds, 128 cached tokens); logs and the table tarred
#               into $OUT/wait-by-op.tgz. Timing only: a what-if's tokens may be wrong (the
#               sweep's tokens column says; down's and gate_up's were identical). Read it as: an op whose
#               no-wait gain is large is where finer-grained dependencies would pay (only down and o take inputs
#               without an RMS norm, which needs the whole vector first; two were built for down in session 16,
#               counters and tagged words, both slower than the wait: NOTES.md 49, 51).
#   wait-by-op-noattn  the same without the attention (--drop attn), alone and with o or down not waiting:
#               $OUT/wait-by-op-noattn.tgz. Each of the two stages is one device call (prepare ~90 s on a fresh
#               machine, then 7 or 4 manifests x 2 rounds).
#   da-merge    (owed by session 17, which made the decode attention's cluster merge st.async: NOTES.md 53; that
#               session ran, on the new default, test_rope_attention_gpu, test_da_experiments_gpu (the new merge
#               bit-identical to the barrier merge at 1-4,096 keys, GQA 1/4/8), the 4B transformers equivalence and
#               bench_decode 4B at 128 tokens, and had no device time left for the rest) the other decode-attention
#               GPU tests (test_decode_attention_gpu: float64, Triton, determinism, the PDL twins, the 0.6B programs;
#               test_pdl_chain_gpu), the 0.6B transformers equivalence, bench_decode 0.6B at 128 and 4B at 4,096
#               cached tokens for the BENCHMARKS summary, and bench_kernels' decode attention rows (issue 4's figure,
#               also in the decode program's order); logs and the tables tarred into $OUT/da-merge.tgz. About 8
#               minutes on a fresh machine. (Ran in session 18, call 1: all passed; BENCHMARKS.md "Session 18".)
#   s18-module  (owed by session 18) the committed decode_attention_pdl.cubin of f60e464 (857e2d91...: the rope-cluster
#               form with 4 pre-wait pages, the cluster and split forms with 2) as a module: session 18 ran every GPU
#               test and the e2e test on the build with 4 pages in both forms, and checked each entry's code sections
#               byte-identical to the build measured for it, but had no device time left to run the module itself.
#               The decode-attention, PDL-chain, rope and passes GPU tests, the transformers equivalence (0.6B, 4B),
#               bench_decode 4B and bench_kernels' decode attention rows (the cluster forms' figures); $OUT/s18-module.tgz.
#               About 6 minutes on a fresh machine. (Ran in session 19, call 1: all passed; BENCHMARKS.md "Session 19".)
#   s19-carveout  the rope-cluster attention's 2-page ring launched with `"carveout": 0` (NOTES.md 55) as the
#               committed kernels, kern-driver and manifests run it: prepare (both manifests == examples), the
#               rope, PDL-chain and kern-driver GPU tests (the module's other entries are byte-identical to those
#               test_decode_attention_gpu passed in session 19's call 1), the transformers equivalence (0.6B, 4B),
#               bench_decode 4B and 0.6B at 128 cached tokens; $OUT/s19-carveout.tgz. About 5 minutes. (Ran in session
#               19, call 7: all passed, 4B 2.436 ms/token; BENCHMARKS.md "Session 19, call 7".)
#   s19-configs (from NOTES.md 55) the GEMVs' shared-memory configurations around the attention's 100 KB one:
#               sync_domain_probe on the default manifest with o_proj on its own module copy, per-op carveouts that
#               put qkv and/or o in the attention's 100 KB configuration (co40; co72 on qkv, 228 KB, cost nothing
#               in call 4, perhaps because the attention's CTAs could then share its SMs), the residual GEMVs in the
#               norm GEMVs' 32 KB one (co10), at 128 and 4,096 cached tokens; then bench_kernels' decode attention
#               rows (issue 4's figures on the 2-page ring, launched with its carveout by cubin_launch); first, the
#               GPU tests edited after session 19's last device call (row-pass, DA experiments, kern-driver);
#               $OUT/s19-configs.tgz. About 9 minutes. (Ran in session 20, call 1; BENCHMARKS.md "Session 20, call 1".)
#   kv-switch   (written in session 21, NOTES.md 59) the head-major KV layout as the only one, on the committed tree:
#               prepare (both manifests == examples: the new pinned cubins), then every GPU test (tests-integration/gpu
#               but the e2e test, and kern-driver's) on its kernels dir; $OUT/kv-switch.tgz. About 7 minutes
#               on a fresh machine. (Ran in session 21, call 3: 788 passed; BENCHMARKS.md "Session 21, calls 3–4".)
#   kv-switch-e2e  after kv-switch on the same machine (/tmp/kern-e2e): the transformers equivalence (0.6B, 4B),
#               bench_decode 4B and 0.6B at 128 cached tokens and 4B at 4,096, and bench_kernels (every provider
#               kernel, issue 4's table, on the one layout); $OUT/kv-switch-e2e.tgz. About 6 minutes. (Ran in
#               session 21, call 4: 24 passed, 4B 2.416 ms/token; BENCHMARKS.md "Session 21, calls 3–4".)
#   lm-head-screen  (written in session 23 after its device time ran out; owed) the committed lm_head_screen.cubin
#               (5d564eaf…: session 23's review widened the screen's margins for underflow and made a row whose
#               dense dot may overflow a candidate; the runs of calls 3–5 were on 6f5f69fe… and 3c067af0…): its GPU
#               tests (with the new near-underflow and near-overflow cases), the kernel bench, and the 4B and 0.6B
#               program A/B of `--lm-head screened` (program_sweep, tokens identical expected, −0.058 / −0.018 ms/token
#               as in call 3); $OUT/lm-head-screen.tgz. About 5 minutes on a fresh machine. (Ran in session 24, call 1.)
#   tc-default  (owed by session 30, whose device time ran out after its sweeps) the generator's default with o_proj
#               (and 4B's down_proj) on gemv_tc.cu's tensor-core entry: the transformers equivalence (0.6B, 4B), the
#               program against `--gemv gemv-fma` (program_sweep, 3 rounds, both models), the tc GPU test and the
#               PDL chain test (default and gemv-fma pairs). Session 30 measured the same manifests as variants (4B
#               2.200 vs 2.281, 0.6B 0.566 vs 0.573, tokens identical to gemv.cu's over 256 steps; NOTES.md 72) and a
#               review ran the tc GPU test and the PDL chain test before the 0.6B rule change. $OUT/tc-default.tgz.
#               About 8 minutes on a fresh machine. (Ran in session 31, calls 1–2, as .gpu scripts with the same commands:
#               all passed; 4B 2.221 vs gemv-fma 2.295, 0.6B 0.567 vs 0.572; BENCHMARKS.md "Session 31".)
#   lm-head-long-rows  (written in session 26; owed, not urgent) the screen's row-group form `_p18` on rows of two
#               load stages (hidden 4,096 and 5,120: 8B, 14B, 32B), which gen_qwen3 keeps on one group per block
#               because only one-stage rows were timed (NOTES.md 68, review helper-72): its GPU test (the 4000x5120 case
#               covers two stages) and lm_head_screen_bench at --hidden 4096 --hidden 5120 (kernel against kernel; in
#               session 26 the 4B program gained four times what the kernel did, so a kernel gain is a lower bound);
#               if `_p18` is faster there, let lm_screen_entry take it for every k. $OUT/lm-head-long-rows.tgz. About
#               3 minutes on a fresh machine (no checkpoint needed). (Ran in session 31, call 2: the test passed; `_p18`
#               +2.1 µs at hidden 4,096, −16.6 at 5,120: the rule is unchanged; BENCHMARKS.md "Session 31, calls 2–3".)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-.gpu/out}
mkdir -p "$OUT"
export PYTHONPATH=packages/kern-schema/src:packages/kern-verify/src:packages/kern-driver/src:packages/kern-capture/src:packages/kern-mine/src:packages/kern-run/src:tools${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
# the measured commit for the benches' headers (benchinfo.commit): the GPU machine's copy of .git can be older than
# the tree it runs; write `git rev-parse --short HEAD > .gpu/commit` before a device call
[ -z "${KERN_COMMIT:-}" ] && [ -f .gpu/commit ] && export KERN_COMMIT=$(cat .gpu/commit)
W=$PWD/.gpu/e2e
P=$PWD/.gpu/e2e-pdl
F=$PWD/.gpu/e2e-pdl-fused
stages=("$@"); [ ${#stages[@]} -eq 0 ] && stages=(prep tests e2e-pdl witness bench uncaptured capture)
status=0
step() {  # name timeout_s command...: runs, logs to $OUT/name.log, prints its tail
  local name=$1 t=$2; shift 2
  echo "=== $name $(date +%T)"
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 12 "$OUT/$name.log"
  [ $rc -eq 0 ] || { echo "=== $name: exit $rc"; status=1; }
  return $rc
}
wheels() {  # log: installs the carried .whl/ wheels (msgspec, nvmath-python, pyelftools) where there are any
  compgen -G ".whl/*.whl" > /dev/null || return 0
  python3 -m pip install -q --no-index --no-deps .whl/*.whl > "$1" 2>&1
}

for stage in "${stages[@]}"; do
  case $stage in
    prep)
      wheels "$OUT/pip.log" || echo "pip install of .whl/ failed"
      step prepare 400 python3 tools/gpu/prepare.py --work "$W" --geometry 0.6b --geometry 4b
      # the opt-in kernel forms (--fused-attention) are added beside the default ones (default cubins unchanged)
      step build-optin 200 python3 tools/build_kernels.py --out "$W/kernels" --pdl --fused-attention -q
      # .gpu/e2e-pdl: --pdl manifests; .gpu/e2e-pdl-fused: --pdl --fused-attention (4B only)
      for g in 0.6b 4b; do
        for d in "$P" "$F"; do
          [ "$d" = "$F" ] && [ "$g" != 4b ] && continue
          flags=(--pdl); [ "$d" = "$F" ] && flags+=(--fused-attention)
          mkdir -p "$d/qwen3-$g"
          ln -sfn "$W/kernels" "$d/kernels"
          ln -sfn "$W/qwen3-$g/hf" "$d/qwen3-$g/hf"
          ln -sfn "$W/qwen3-$g/weights.safetensors" "$d/qwen3-$g/weights.safetensors"
          tag=$(basename "$d")-$g
          step "gen-$tag" 60 python3 tools/gen_qwen3.py --preset "$g" --kernels "$W/kernels" \
            --out "$d/qwen3-$g/manifest.json" "${flags[@]}"
          step "verify-$tag" 60 python3 -m kern_verify.cli "$d/qwen3-$g/manifest.json" --kernels "$W/kernels"
        done
      done
      ;;
    tests)
      KERN_KERNELS_DIR="$W/kernels" step gpu-tests 400 python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
        tests-integration/gpu/test_pdl_chain_gpu.py tests-integration/gpu/test_fused_attention_gpu.py \
        tests-integration/gpu/test_kernels_gpu.py tests-integration/gpu/test_gemv_gpu.py packages/kern-driver
      ;;
    e2e-pdl)
      KERN_E2E_DIR="$P" KERN_E2E_OUT="$OUT" KERN_GEN_FLAGS="--pdl" step e2e-pdl 540 python3 -m pytest -q -rs -p no:cacheprovider \
        tests-integration/gpu/test_e2e_qwen3.py
      ;;
    witness)
      KERN_MANIFEST="$W/qwen3-0.6b/manifest.json" KERN_KERNELS="$W/kernels" \
        KERN_WEIGHTS="$W/qwen3-0.6b/weights.safetensors" \
        step witness 300 python3 -m pytest -m gpu -q -rs -p no:cacheprovider packages/kern-capture \
        -k kern_run_decode_matches_manifest
      ;;
    bench)
      cp BENCHMARKS.md "$OUT/BENCHMARKS.md"
      step bench-default 120 python3 tools/bench_decode.py --work "$W" --geometry 4b \
        --skip hf-eager,hf-compile,gpt-fast --append "$OUT/BENCHMARKS.md"
      step bench-pdl 120 python3 tools/bench_decode.py --work "$P" --geometry 4b \
        --skip hf-eager,hf-compile,gpt-fast --append "$OUT/BENCHMARKS.md"
      step bench-pdl-fused 120 python3 tools/bench_decode.py --work "$F" --geometry 4b \
        --skip hf-eager,hf-compile,gpt-fast --append "$OUT/BENCHMARKS.md"
      step bench-kernels 200 python3 tools/bench_kernels.py --kernels "$W/kernels" --fused-attention \
        --md "$OUT/BENCHMARKS.md"
      ;;
    uncaptured)
      step q3c-uncaptured 300 python3 tools/gpu/capture_qwen3_compile.py
      ;;
    capture)
      rm -rf /tmp/q3c
      step q3c-capture 400 python3 -m kern_capture.cli run --out /tmp/q3c -- python3 tools/gpu/capture_qwen3_compile.py
      mkdir -p "$OUT/q3c"
      [ -f /tmp/q3c/launches.jsonl ] && gzip -9 -c /tmp/q3c/launches.jsonl > "$OUT/q3c/launches.jsonl.gz"
      cp /tmp/q3c/modules.jsonl /tmp/q3c/capture.json "$OUT/q3c/" 2>/dev/null
      cp /tmp/q3c/error.json "$OUT/q3c/" 2>/dev/null
      echo "then, here: uv run kern-mine trim <fetched>/q3c packages/kern-mine/tests/fixtures/qwen3-0.6b-compile --max-bytes 8000000"
      ;;
    prime-probe)
      K=/tmp/kern-prime
      wheels /dev/null
      step prime-prepare 300 python3 tools/gpu/prepare.py --work "$K" --geometry 4b
      KERN_KERNELS_DIR="$K/kernels" step prime-driver 300 python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
        packages/kern-driver
      step prime-probe 400 python3 tools/gpu/graph_state_probe.py --work "$K" --geometry 4b \
        --preset alone --preset prime-graphs --preset throwaway --preset no-pdl-alone --preset no-pdl-prime
      (cd "$OUT" && tar czf prime-probe.tgz prime-prepare.log prime-driver.log prime-probe.log \
        && rm -f prime-prepare.log prime-driver.log prime-probe.log)  # at most 8 files come back
      ;;
    prime-bench)
      K=/tmp/kern-prime
      wheels /dev/null
      step prime-prepare-both 400 python3 tools/gpu/prepare.py --work "$K" --geometry 0.6b --geometry 4b
      cp BENCHMARKS.md "$OUT/prime-BENCHMARKS.md"
      for g in 4b 0.6b; do
        for c in 128 4096; do
          for flag in "" --prime-graphs; do
            step "prime-bench-$g-$c${flag:+-prime}" 150 python3 tools/bench_decode.py --work "$K" --geometry "$g" \
              --context "$c" --skip hf-eager,hf-compile,gpt-fast,floors --append "$OUT/prime-BENCHMARKS.md" $flag
          done
        done
      done
      (cd "$OUT" && tar czf prime-bench.tgz prime-prepare-both.log prime-bench-*.log prime-BENCHMARKS.md \
        && rm -f prime-prepare-both.log prime-bench-*.log)  # at most 8 files come back
      ;;
    wait-by-op|wait-by-op-noattn)
      K=/tmp/kern-e2e
      M="$K/qwen3-4b/manifest.json"
      wheels /dev/null
      [ -f "$M" ] || step wbo-prepare 400 python3 tools/gpu/prepare.py --work "$K" --geometry 4b
      NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
      # o_proj and down_proj run on gemv_tc.cu's tensor-core entry since session 30: its no-wait build too
      (cd tools/kernels-src && "$NVCC" -cubin -arch=sm_90 -O3 -std=c++17 -DGEMV_NO_WAIT \
        -o "$K/kernels/gemv_nowait.cubin" gemv.cu && "$NVCC" -cubin -arch=sm_90 -O3 -std=c++17 -DGEMV_NO_WAIT \
        -o "$K/kernels/gemv_tc_nowait.cubin" gemv_tc.cu) || { echo "$stage: nvcc failed"; status=1; continue; }
      nowait() {  # the no-wait build of op $1's module (4B: o and down on gemv_tc)
        case $1 in o|down) echo gemv_tc_nowait.cubin ;; *) echo gemv_nowait.cubin ;; esac
      }
      whatif() {  # name, manifest_whatif args...: the what-if manifest $K/name.json, added to the sweep
        local name=$1; shift
        step "wbo-make-$name" 60 python3 tools/manifest_whatif.py "$M" --kernels "$K/kernels" "$@" \
          --out "$K/$name.json" && vs+=(--manifest-variant "$name=$K/$name.json")
      }
      vs=()
      if [ "$stage" = wait-by-op ]; then
        for op in qkv o gate_up down lm_head; do whatif "nowait-$op" --op-module "$op=$(nowait $op)"; done
        whatif nowait-all --module gemv=gemv_nowait.cubin --module gemv_tc=gemv_tc_nowait.cubin
      else
        whatif noattn --drop attn
        for op in o down; do whatif "noattn-nowait-$op" --drop attn --op-module "$op=$(nowait $op)"; done
      fi
      cp BENCHMARKS.md "$OUT/$stage-BENCHMARKS.md"
      step wbo-sweep 540 python3 tools/gpu/program_sweep.py --work "$K" --geometry 4b --rounds 2 "${vs[@]}" \
        --append "$OUT/$stage-BENCHMARKS.md"
      (cd "$OUT" && tar czf "$stage.tgz" wbo-*.log "$stage-BENCHMARKS.md" && rm -f wbo-*.log)  # at most 8 files back
      ;;
    da-merge)
      K=/tmp/kern-e2e
      wheels /dev/null
      step dam-prepare 400 python3 tools/gpu/prepare.py --work "$K" --geometry 0.6b --geometry 4b
      KERN_KERNELS_DIR="$K/kernels" step dam-tests 400 python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
        tests-integration/gpu/test_decode_attention_gpu.py tests-integration/gpu/test_pdl_chain_gpu.py
      KERN_E2E_DIR="$K" KERN_E2E_OUT="$OUT" step dam-e2e-0.6b 300 python3 -m pytest -q -rs -p no:cacheprovider \
        tests-integration/gpu/test_e2e_qwen3.py -k "0.6b"
      cp BENCHMARKS.md "$OUT/da-merge-BENCHMARKS.md"
      step dam-bench-0.6b 150 python3 tools/bench_decode.py --work "$K" --geometry 0.6b \
        --skip hf-eager,hf-compile,gpt-fast --append "$OUT/da-merge-BENCHMARKS.md"
      step dam-bench-4b-4096 150 python3 tools/bench_decode.py --work "$K" --geometry 4b --context 4096 \
        --skip hf-eager,hf-compile,gpt-fast,floors --append "$OUT/da-merge-BENCHMARKS.md"
      # issue 4's figure: the decode attentions at 4,096 tokens, back to back and in the decode program's order
      step dam-bench-kernels 200 python3 tools/bench_kernels.py --kernels "$K/kernels" --only decode_attention \
        --md "$OUT/da-merge-BENCHMARKS.md"
      (cd "$OUT" && tar czf da-merge.tgz dam-*.log da-merge-BENCHMARKS.md && rm -f dam-*.log)  # at most 8 files back
      ;;
    s18-module)
      K=/tmp/kern-e2e
      wheels /dev/null
      step s18-prepare 400 python3 tools/gpu/prepare.py --work "$K" --geometry 0.6b --geometry 4b
      KERN_KERNELS_DIR="$K/kernels" step s18-tests 400 python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
        tests-integration/gpu/test_decode_attention_gpu.py tests-integration/gpu/test_pdl_chain_gpu.py \
        tests-integration/gpu/test_rope_attention_gpu.py tests-integration/gpu/test_gemv_passes_gpu.py
      KERN_E2E_DIR="$K" KERN_E2E_OUT="$OUT" step s18-e2e 300 python3 -m pytest -q -rs -p no:cacheprovider \
        tests-integration/gpu/test_e2e_qwen3.py
      cp BENCHMARKS.md "$OUT/s18-BENCHMARKS.md"
      step s18-bench-4b 150 python3 tools/bench_decode.py --work "$K" --geometry 4b \
        --skip hf-eager,hf-compile,gpt-fast --append "$OUT/s18-BENCHMARKS.md"
      step s18-bench-kernels 200 python3 tools/bench_kernels.py --kernels "$K/kernels" --only decode_attention \
        --md "$OUT/s18-BENCHMARKS.md"
      (cd "$OUT" && tar czf s18-module.tgz s18-*.log s18-BENCHMARKS.md && rm -f s18-*.log)  # at most 8 files back
      ;;
    s19-carveout)
      K=/tmp/kern-e2e
      wheels /dev/null
      step s19-prepare 300 python3 tools/gpu/prepare.py --work "$K" --geometry 0.6b --geometry 4b
      KERN_KERNELS_DIR="$K/kernels" step s19-tests 400 python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
        tests-integration/gpu/test_rope_attention_gpu.py tests-integration/gpu/test_pdl_chain_gpu.py \
        packages/kern-driver/tests
      KERN_E2E_DIR="$K" KERN_E2E_OUT="$OUT" step s19-e2e 300 python3 -m pytest -q -rs -p no:cacheprovider \
        tests-integration/gpu/test_e2e_qwen3.py
      cp BENCHMARKS.md "$OUT/s19-BENCHMARKS.md"
      for g in 4b 0.6b; do
        step s19-bench-$g 150 python3 tools/bench_decode.py --work "$K" --geometry $g \
          --skip hf-eager,hf-compile,gpt-fast --append "$OUT/s19-BENCHMARKS.md"
      done
      (cd "$OUT" && tar czf s19-carveout.tgz s19-*.log s19-BENCHMARKS.md && rm -f s19-*.log)
      ;;
    s19-configs)
      K=/tmp/kern-e2e
      wheels /dev/null
      step s19c-prepare 300 python3 tools/gpu/prepare.py --work "$K" --geometry 4b
      # GPU tests edited after session 19's last device call (helper-54's merged checks; the DA experiments now
      # build the PDL rope entry with its 2-page ring): not yet run on a GPU
      KERN_KERNELS_DIR="$K/kernels" step s19c-tests 300 python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
        tests-integration/gpu/test_gemv_passes_gpu.py tests-integration/gpu/test_da_experiments_gpu.py \
        packages/kern-driver/tests
      cp "$K/kernels/gemv_tc.cubin" "$K/kernels/gemv_o.cubin"  # o's module since session 30
      step s19c-whatif 60 python3 tools/manifest_whatif.py "$K/qwen3-4b/manifest.json" --kernels "$K/kernels" \
        --op-module gemv_residual_o_proj=gemv_o.cubin --out "$K/o_copy.json"
      for ctx in 128 4096; do
        step s19c-probe-$ctx 330 python3 tools/gpu/sync_domain_probe.py --work "$K" --geometry 4b --context $ctx \
          --rounds 2 --manifest "$K/o_copy.json" --mode co40@gemv_norm_qkv --mode co40@gemv_residual_o_proj \
          --mode co40@gemv_norm_qkv,gemv_residual_o_proj --mode co10@gemv_residual_o_proj,gemv_residual_down_proj
      done
      cp BENCHMARKS.md "$OUT/s19c-BENCHMARKS.md"
      step s19c-bench-kernels 200 python3 tools/bench_kernels.py --kernels "$K/kernels" --only decode_attention \
        --md "$OUT/s19c-BENCHMARKS.md"
      (cd "$OUT" && tar czf s19-configs.tgz s19c-*.log s19c-BENCHMARKS.md && rm -f s19c-*.log)
      ;;
    kv-switch)
      K=/tmp/kern-e2e
      wheels /dev/null
      step kvw-prepare 400 python3 tools/gpu/prepare.py --work "$K" --geometry 0.6b --geometry 4b
      KERN_KERNELS_DIR="$K/kernels" step kvw-gpu-tests 480 python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
        tests-integration/gpu packages/kern-driver --ignore=tests-integration/gpu/test_e2e_qwen3.py
      (cd "$OUT" && tar czf kv-switch.tgz kvw-*.log && rm -f kvw-*.log)
      ;;
    kv-switch-e2e)
      K=/tmp/kern-e2e
      wheels /dev/null
      KERN_E2E_DIR="$K" KERN_E2E_OUT="$OUT" step kvx-e2e 300 python3 -m pytest -q -rs -p no:cacheprovider \
        tests-integration/gpu/test_e2e_qwen3.py
      cp BENCHMARKS.md "$OUT/kvx-BENCHMARKS.md"
      step kvx-bench-4b 150 python3 tools/bench_decode.py --work "$K" --geometry 4b --skip hf-eager,hf-compile,gpt-fast \
        --append "$OUT/kvx-BENCHMARKS.md"
      step kvx-bench-0.6b 150 python3 tools/bench_decode.py --work "$K" --geometry 0.6b \
        --skip hf-eager,hf-compile,gpt-fast --append "$OUT/kvx-BENCHMARKS.md"
      step kvx-bench-4b-4096 150 python3 tools/bench_decode.py --work "$K" --geometry 4b --context 4096 \
        --skip hf-eager,hf-compile,gpt-fast,floors --append "$OUT/kvx-BENCHMARKS.md"
      step kvx-bench-kernels 240 python3 tools/bench_kernels.py --kernels "$K/kernels" --md "$OUT/kvx-BENCHMARKS.md"
      (cd "$OUT" && tar czf kv-switch-e2e.tgz kvx-*.log kvx-BENCHMARKS.md && rm -f kvx-*.log)
      ;;
    lm-head-screen)
      K=/tmp/kern-e2e
      wheels /dev/null
      step lhs-prepare 400 python3 tools/gpu/prepare.py --work "$K" --geometry 0.6b --geometry 4b
      KERN_KERNELS_DIR="$K/kernels" step lhs-gpu-tests 300 python3 -m pytest -m gpu -q -s -p no:cacheprovider \
        tests-integration/gpu/test_lm_head_screen_gpu.py
      step lhs-bench 200 python3 tools/gpu/lm_head_screen_bench.py --kernels "$K/kernels"
      for g in 4b 0.6b; do
        step lhs-gen-$g 60 python3 tools/gen_qwen3.py --preset $g --kernels "$K/kernels" --lm-head screened \
          --out "$K/screened-$g.json"
        step lhs-sweep-$g 300 python3 tools/gpu/program_sweep.py --work "$K" --geometry $g --rounds 3 \
          --manifest-variant screened="$K/screened-$g.json"
      done
      (cd "$OUT" && tar czf lm-head-screen.tgz lhs-*.log && rm -f lhs-*.log)
      ;;
    lm-head-long-rows)
      K=/tmp/kern-e2e
      wheels /dev/null
      step lhl-build 300 python3 tools/build_kernels.py --out "$K/kernels" -q
      KERN_KERNELS_DIR="$K/kernels" step lhl-gpu-tests 300 python3 -m pytest -m gpu -q -s -p no:cacheprovider \
        tests-integration/gpu/test_lm_head_screen_gpu.py
      step lhl-bench 200 python3 tools/gpu/lm_head_screen_bench.py --kernels "$K/kernels" --hidden 4096 --hidden 5120
      (cd "$OUT" && tar czf lm-head-long-rows.tgz lhl-*.log && rm -f lhl-*.log)
      ;;
    tc-default)
      K=/tmp/kern-e2e
      wheels /dev/null
      step tcd-prepare 400 python3 tools/gpu/prepare.py --work "$K"
      KERN_E2E_DIR="$K" step tcd-e2e 300 python3 -m pytest -q -rs -p no:cacheprovider \
        tests-integration/gpu/test_e2e_qwen3.py
      for g in 4b 0.6b; do
        python3 tools/gen_qwen3.py --preset $g --kernels "$K/kernels" --gemv gemv-fma --out "$K/qwen3-$g/fma.json" \
          > /dev/null
        step tcd-sweep-$g 200 python3 tools/gpu/program_sweep.py --work "$K" --geometry $g --rounds 3 \
          --manifest-variant fma="$K/qwen3-$g/fma.json" --append "$OUT/tcd-sweep.md"
      done
      KERN_KERNELS_DIR="$K/kernels" step tcd-gpu-tests 300 python3 -m pytest -m gpu -q -p no:cacheprovider \
        tests-integration/gpu/test_gemv_tc_gpu.py tests-integration/gpu/test_pdl_chain_gpu.py
      (cd "$OUT" && tar czf tc-default.tgz tcd-*.log tcd-sweep.md && rm -f tcd-*.log tcd-sweep.md)
      ;;
    *) echo "pending.sh: unknown stage $stage"; exit 2 ;;
  esac
done
exit $status
