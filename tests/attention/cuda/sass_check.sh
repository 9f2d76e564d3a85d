#!/usr/bin/env bash
# What the compiler made of the sm_90a sparse MQA kernels, read from their SASS (no GPU needed):
# every wgmma the source issues is there, none is serialised, and the registers hold.
#   - 36 HGMMA.64x64x16 per kernel: S = Q K^T of a 64 x 64 block, K = 576 in 16-wide steps
#     (9 tiles x 4);
#   - 8 HGMMA.64x256x16: P V, a warpgroup's 256 value columns over 64 keys (4 steps), twice (the
#     pairs schedule: the own and the cross P; roles: the scorer's and the P V warpgroup's);
#   - at most 8 WARPGROUP.DEPBAR: waits where the source waits (a few a block); ptxas serialising
#     the wgmmas (warnings C7514-C7518) puts one behind every HGMMA;
#   - local memory (spills): none in the roles schedule, at most 8 instructions elsewhere (the
#     pairs schedule spills a few bytes by design).
# A measurement build that lets ptxas drop the P V (a dead O) fails the second rule.
# Usage: sass_check.sh CUOBJDUMP_DIR OBJECT...   (the objects of dcp_attention; the others are
# ignored). CUOBJDUMP_DIR holds cuobjdump and nvdisasm (scripts/setup.sh: .deps/cuda_sass/bin).
set -euo pipefail
tools=$1
shift
export PATH="$tools:$PATH"
command -v cuobjdump >/dev/null && command -v nvdisasm >/dev/null || {
  echo "sass_check: cuobjdump and nvdisasm not found in $tools (run scripts/setup.sh)" >&2
  exit 1
}
checked=0
failed=0
for object in "$@"; do
  case "$(basename "$object")" in
    sparse_mqa_sm90*) ;;
    *) continue ;;
  esac
  # One line per kernel: name, HGMMA.64x64, HGMMA.64x256, DEPBAR, local loads + stores.
  report=$(cuobjdump -sass "$object" | awk '
    /Function :/ { kernel = $3; kernels[kernel] = 1 }
    /HGMMA\.64x64x16\./ { s[kernel]++ }
    /HGMMA\.64x256x16\./ { pv[kernel]++ }
    /WARPGROUP\.DEPBAR/ { wait[kernel]++ }
    /[^A-Z](LDL|STL)[. ]/ { local_ops[kernel]++ }
    END { for (k in kernels) printf "%s %d %d %d %d\n", k, s[k], pv[k], wait[k], local_ops[k] }')
  if [ -z "$report" ]; then
    echo "sass_check: no kernel in $object" >&2
    failed=$((failed + 1))
    continue
  fi
  while read -r kernel s pv wait local_ops; do
    checked=$((checked + 1))
    # SparseMqaSm90Kernel<576, 512, format, epilogue, roles>: the last template argument.
    roles=0
    [[ "$kernel" == *ELb1EEEv* ]] && roles=1
    max_local=8
    [ "$roles" -eq 1 ] && max_local=0
    problems=""
    [ "$s" -eq 36 ] || problems+=" S wgmma $s (36 expected)"
    [ "$pv" -eq 8 ] || problems+=" P V wgmma $pv (8 expected)"
    [ "$wait" -le 8 ] || problems+=" $wait wgmma waits (serialised: at most 8 expected)"
    [ "$local_ops" -le "$max_local" ] || problems+=" $local_ops local memory ops (at most $max_local)"
    printf 'sass_check: %s: %s S %d, P V %d, waits %d, local %d%s\n' "$(basename "$object")" \
        "$([ "$roles" -eq 1 ] && echo roles || echo pairs)" "$s" "$pv" "$wait" "$local_ops" \
        "${problems:+ FAILED:$problems}"
    [ -z "$problems" ] || failed=$((failed + 1))
  done <<<"$report"
done
if [ "$checked" -eq 0 ]; then
  echo "sass_check: no sparse_mqa_sm90 kernel among the objects" >&2
  exit 1
fi
echo "sass_check: $checked kernels, $failed failed"
[ "$failed" -eq 0 ]
