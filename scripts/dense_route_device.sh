#!/usr/bin/env bash
# The dense route's speed on the GPU machine in one call (docs/dense_prefill_cudnn.md, issue 13
# item 5): builds only what it needs, runs the dense/cuDNN GPU tests and the CUDA worker tests
# (DCP_REQUIRE_GPU=1) and the row-copy kernels' tests, then dcp_bench routes (the dense route at
# 128 and 16 heads through cudnn, with its phases), kernels (dense MHA through native, cudnn and
# auto on the table's shapes, the up-projection GEMMs, the copy ceiling) and the torch peers of
# both, packed into $OUT; summary.txt carries the per-shape ratios and phases.
#   DCP_ROUTE_STEPS="tests routes kernels peers engine" (default all), DCP_ROUTE_BACKENDS (routes,
#   default "cudnn"), DCP_ROUTE_OUTPUT_DTYPES (the layer's out dtype in routes, default
#   "f32 bf16"), DCP_ATTENTION_FILTER / DCP_WORKER_FILTER (gtest filters), DCP_WORKER_NP
#   (default "1 2"), DCP_BUILD_DIR (default /tmp/build-dense-route). Every step has its own
#   timeout.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# Everything goes to a work folder, packed into $OUT/dense_route.tar.gz at the end with the
# summary beside it (the device tool returns 8 files).
final="${OUT:-/tmp/dense-route-out}"
out=/tmp/dense-route-work
rm -rf "$out" && mkdir -p "$out" "$final"
pack() { tar czf "$final/dense_route.tar.gz" -C "$out" . ; cp "$out/summary.txt" "$final/"; }
trap pack EXIT
started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started ))s"; }
steps="${DCP_ROUTE_STEPS:-tests routes kernels peers engine}"
has_step() { [[ " $steps " == *" $1 "* ]]; }
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

# shellcheck source=scripts/gpu_env.sh
. scripts/gpu_env.sh
dcp_gpu_env
prefix=/tmp/dcp-prefix
dcp_unpack_debs .debs "$prefix" || exit 2
dcp_cudnn_from_torch  # the system's libcudnn.so.9 first, torch's as a fallback

build="${DCP_BUILD_DIR:-/tmp/build-dense-route}"  # another script's build is reused when given
echo "== configure + build ($(elapsed))"
dcp_configure_gpu . "$build" "$prefix" >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
grep -E "prefill_backend cudnn" "$out/build.log" | tee -a "$summary"
ninja -C "$build" -k 0 attention_cuda_test worker_multirank_test workspace_cuda_test cuda_device_test \
    dcp_bench \
    >>"$out/build.log" 2>&1 \
    || { grep -E "error|FAILED" "$out/build.log" | head -30 | tee -a "$summary"; note "build: FAILED"; }
note "build done ($(elapsed))"

if has_step tests; then
  echo "== tests ($(elapsed))"
  DCP_REQUIRE_GPU=1 timeout 60 "$build/tests/attention/cuda/attention_cuda_test" \
      --gtest_filter="${DCP_ATTENTION_FILTER:-*DensePrefill*:*DenseMha*:*CudnnSdpa*}" \
      >"$out/test_attention.log" 2>&1
  note "attention_cuda_test (dense + cudnn): exit $? | $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_attention.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|Failure|error' "$out/test_attention.log" | head -20 | tee -a "$summary"
  DCP_REQUIRE_GPU=1 timeout 60 "$build/tests/workspace/cuda/workspace_cuda_test" \
      >"$out/test_workspace.log" 2>&1
  note "workspace_cuda_test (rows, CopyRows): exit $? | $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_workspace.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$out/test_workspace.log" | head -10 | tee -a "$summary"
  DCP_REQUIRE_GPU=1 timeout 60 "$build/tests/runtime/cuda/cuda_device_test" \
      --gtest_filter="${DCP_DEVICE_FILTER:-*Topk*}" >"$out/test_device.log" 2>&1
  note "cuda_device_test (${DCP_DEVICE_FILTER:-*Topk*}): exit $? | $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_device.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|Failure' "$out/test_device.log" | head -10 | tee -a "$summary"
  for np in ${DCP_WORKER_NP:-1 2}; do
    DCP_REQUIRE_GPU=1 DCP_TEST_DEVICE=cuda timeout 150 mpirun --allow-run-as-root \
        --oversubscribe --bind-to none -np $np --mca pml ob1 --mca btl self,vader,tcp \
        "$build/tests/multirank/worker_multirank_test" --gtest_color=no --gtest_filter="${DCP_WORKER_FILTER:-*}" \
        >"$out/test_worker_np$np.log" 2>&1
    note "worker cuda np $np: exit $? | $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_worker_np$np.log" | head -2 | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]' "$out/test_worker_np$np.log" | head -10 | tee -a "$summary"
  done
fi

bench="$build/launch/bench/dcp_bench"
if has_step routes; then
  echo "== routes ($(elapsed))"
  for backend in ${DCP_ROUTE_BACKENDS:-cudnn}; do
    for dtype in ${DCP_ROUTE_OUTPUT_DTYPES:-f32 bf16}; do
      timeout 40 "$bench" --mode routes --device cuda --model deepseek_v32 --heads 128 \
          --prefill_backend $backend --output_dtype $dtype \
          --batches 2q2k,4q1k,8q512,q1k,4q512s2k -w 2 -n 5 --check 0 \
          --csv "$out/routes_128_${backend}_$dtype.csv" >"$out/routes_128_${backend}_$dtype.log" 2>&1
      note "routes 128 $backend $dtype: exit $? ($(elapsed))"
      timeout 20 "$bench" --mode routes --device cuda --model deepseek_v32 --heads 16 \
          --prefill_backend $backend --output_dtype $dtype --batches 4q2k,q2k -w 2 -n 5 --check 0 \
          --csv "$out/routes_16_${backend}_$dtype.csv" >"$out/routes_16_${backend}_$dtype.log" 2>&1
      note "routes 16 $backend $dtype: exit $? ($(elapsed))"
    done
  done
fi
if has_step kernels; then
  echo "== kernels ($(elapsed))"
  # The auto table's shapes (attention/cuda/cudnn/dense_backend_table.cc) through every
  # implementation, and the up-projection GEMMs against the copy and GEMM ceilings.
  kernel_batches="${DCP_KERNEL_BATCHES:-q16,q64,q256,q512,q1k,q2k,q8k,2q2k,4q1k,4q2k,8q512,16q64,16q1k,64q512,16q64s128,64q64s128,4q512s2k}"
  timeout 90 "$bench" --mode kernels --device cuda --model deepseek_v32 --heads 16,128 \
      --prefill_backend native,cudnn,auto --only dense_mha,gemm_up,copy \
      --batches "$kernel_batches" -b 64M -e 64M -w 2 -n 5 \
      --csv "$out/kernels.csv" >"$out/kernels.log" 2>&1
  note "kernels: exit $? ($(elapsed))"
fi
if has_step peers; then
  echo "== torch peers ($(elapsed))"
  [ -f "$out/kernels.csv" ] && timeout 60 python3 scripts/peer_torch.py --dense-peers sdpa_cudnn \
      --kernels "$out/kernels.csv" -w 2 -n 5 --out "$out/peers_kernels.csv" >"$out/peers.log" 2>&1
  note "peers kernels: exit $? ($(elapsed))"
  for f in "$out"/routes_128_cudnn_*.csv "$out"/routes_16_cudnn_*.csv; do
    [[ "$f" == *_peers.csv || "$f" == *_crossover.csv ]] && continue
    [ -f "$f" ] || continue
    timeout 30 python3 scripts/peer_torch.py --dense-peers sdpa_cudnn --routes "$f" -w 2 -n 5 \
        --out "${f%.csv}_peers.csv" >>"$out/peers.log" 2>&1
    note "peers routes $(basename "$f"): exit $? ($(elapsed))"
  done
fi
if has_step engine; then
  # The same batches the way an engine runs them (DcpEngine: the step planned once, then Run per
  # layer, eager and replayed from a graph; vLLM's kv_b_proj bound), for the ratio against the
  # torch composition of the routes step: no per-call top-k check, plan or synchronisation.
  echo "== engine ($(elapsed))"
  for heads in 128 16; do
    batches="2q2k,4q1k,8q512,q1k,4q512s2k"
    [ "$heads" = 16 ] && batches="4q2k,q2k"
    timeout 60 mpirun --allow-run-as-root --bind-to none -np 1 "$bench" --mode engine \
        --device cuda --comm nccl --model deepseek_v32 --heads $heads --prefill_backend cudnn \
        --output_dtype bf16 --batches "$batches" -w 2 -n 10 \
        --csv "$out/engine_$heads.csv" >"$out/engine_$heads.log" 2>&1
    note "engine $heads: exit $? ($(elapsed))"
  done
fi
# Per shape into the summary (the only file sure to come back): the routes' phases and ratios,
# the kernels' dense rows against torch SDPA.
python3 - "$out" >>"$summary" 2>&1 <<'PY'
import csv, glob, os, sys
out = sys.argv[1]
def rows(path):
    return list(csv.DictReader(open(path))) if os.path.exists(path) else []
phases = ["plan", "cache_write", "gather", "up_proj", "attention", "other"]
for f in sorted(f for f in glob.glob(f"{out}/routes_*_cudnn_*.csv")
                if "_peers" not in f and "_crossover" not in f):
    peers = {(r["batch"], r["heads"], r["op"]): r for r in rows(f[:-4] + "_peers.csv")}
    print(f"== {os.path.basename(f)}: batch heads route auto_us | torch_route ratio | "
          f"attn ours/sdpa | " + " ".join(phases))
    for r in rows(f):
        t = peers.get((r["batch"], r["heads"], "dense_route"), {})
        a = peers.get((r["batch"], r["heads"], "dense_mha"), {})
        ratio = (float(r["auto_us"]) / float(t["peer_us"])) if t.get("peer_us") else float("nan")
        print(f"{r['batch']} {r['heads']} {r['route_auto']} {r['auto_us']} | "
              f"{t.get('peer_us', '-')} {ratio:.3f} | {r['auto_attn_us']}/{a.get('peer_us', '-')} | "
              + " ".join(r.get(f"auto_{p}_us", "-") for p in phases))
torch = {}
for f in glob.glob(f"{out}/routes_*_cudnn_bf16_peers.csv"):
    for r in rows(f):
        if r["op"] == "dense_route":
            torch[(r["batch"], r["heads"])] = float(r["peer_us"])
for f in sorted(glob.glob(f"{out}/engine_*.csv")):
    print(f"== {os.path.basename(f)}: batch heads route plan_us eager_us graph_us | torch_route "
          "| eager/torch graph/torch")
    for r in rows(f):
        t = torch.get((r["batch"], r["heads_per_rank"]))
        def ratio(v):
            return f"{float(v) / t:.3f}" if t and v else "-"
        print(f"{r['batch']} {r['heads_per_rank']} {r['route']} {r['plan_us']} {r['eager_us']} "
              f"{r['graph_us'] or '-'} | {t if t else '-'} | {ratio(r['eager_us'])} "
              f"{ratio(r['graph_us'])}")
k = rows(f"{out}/kernels.csv")
peers = {(r["batch"], r["heads"]): r for r in rows(f"{out}/peers_kernels.csv")}
dense = {}
for r in k:
    if r["kernel"].startswith("dense_mha"):
        dense.setdefault((r["batch"], r["heads"]), {})[r["kernel"]] = r["time_us"]
if dense:
    print("== kernels dense_mha: batch heads native cudnn auto | torch sdpa_cudnn | auto/torch")
for (b, h), d in dense.items():
    p = peers.get((b, h), {}).get("peer_us", "")
    auto = d.get("dense_mha", "")
    ratio = f"{float(auto) / float(p):.3f}" if auto and p else "-"
    print(f"{b} {h} {d.get('dense_mha_native', '-')} {d.get('dense_mha_cudnn', '-')} {auto or '-'}"
          f" | {p or '-'} | {ratio}")
for r in k:
    if not r["kernel"].startswith("dense_mha"):
        print(f"{r['kernel']} {r['batch']} {r['heads']} {r['time_us']} us {r['tflops']} TF "
              f"{r['gbps']} GB/s {r['ceiling_pct']}%")
PY
note "done ($(elapsed))"
