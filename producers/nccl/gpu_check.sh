#!/usr/bin/env bash
# GPU check of Mycroft's NCCL profiler plugin (producers/nccl/README.md, "GPU check").
#
#   producers/nccl/gpu_check.sh            from the repository root, after ./dev setup
#
# 1. builds the plugin (make) into a temporary directory;
# 2. runs NCCL's own nccl-tests all_reduce_perf (on PATH or in $NCCL_TESTS_DIR/build) when
#    present, else a PyTorch NCCL job (producers/nccl/tests/gpu_torch_job.py, one process per
#    GPU; with 2+ GPUs a second run with NCCL_P2P_DISABLE/NCCL_SHM_DISABLE forces the network
#    transport, the only one with proxy events), each with and without
#    NCCL_PROFILER_PLUGIN pointing at the .so;
# 3. checks the rings hold sane records with the Python reader (tests/gpu_ring_check.py);
# 4. prints the job's time with and without the plugin per message size, and the
#    per-callback cost on this machine's CPU (the harness benchmark).
# Exit status: 0 all sane, 1 a check failed, 2 no GPU (nothing was run).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
ngpus=${GPUS:-}

die() { echo "gpu_check: $1" >&2; exit "${2:-1}"; }

if ! command -v nvidia-smi >/dev/null 2>&1; then
  die "no nvidia-smi: this check needs an NVIDIA GPU and its driver; nothing was run" 2
fi
if [[ -z "$ngpus" ]]; then
  ngpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
[[ "$ngpus" -ge 1 ]] || die "nvidia-smi lists no GPU; nothing was run" 2
[[ -x "$py" ]] || die "no Python at $py (run ./dev setup, or set PYTHON)"
echo "gpu_check: $ngpus GPU(s): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"

work=$(mktemp -d "${TMPDIR:-/tmp}/mycroft-gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
make -s -C "$here" BUILD="$work/build" || die "the plugin does not build"
so="$work/build/libnccl-profiler-mycroft.so"
status=0

# run NAME CMD...: the command twice, without and with the plugin; its output in $work/NAME.{off,on}
run() {
  local name=$1
  shift
  env -u NCCL_PROFILER_PLUGIN timeout 600 "$@" >"$work/$name.off" 2>&1 ||
    { tail -20 "$work/$name.off"; die "$name failed without the plugin"; }
  mkdir -p "$work/rings-$name"
  NCCL_PROFILER_PLUGIN="$so" MYCROFT_NCCL_RING_DIR="$work/rings-$name" NCCL_DEBUG=INFO \
    NCCL_DEBUG_SUBSYS=INIT,ENV timeout 600 "$@" >"$work/$name.on" 2>&1 ||
    { tail -20 "$work/$name.on"; die "$name failed with the plugin"; }
  if grep -qi 'profiler.*mycroft\|mycroft.*disabled' "$work/$name.on"; then
    grep -i 'profiler.*mycroft\|mycroft.*disabled' "$work/$name.on" | head -3
  fi
  ls "$work/rings-$name"/*.ring >/dev/null 2>&1 ||
    die "$name: NCCL did not load the plugin (no ring written; NCCL older than 2.27 knows no v4+ ABI)"
}

# check NAME ARGS...: the ring check of one run
check() {
  local name=$1
  shift
  echo "--- rings of $name"
  PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$py" "$here/tests/gpu_ring_check.py" \
    "$work/rings-$name" "$@" || { echo "gpu_check: $name: rings not sane"; status=1; }
}

# compare NAME: time per size without / with the plugin
compare() {
  "$py" - "$work/$1.off" "$work/$1.on" "$1" <<'EOF'
import json, re, sys
def times(path):
    text = open(path).read()
    for line in text.splitlines():
        if line.startswith("{") and '"us"' in line:
            return {int(k): v for k, v in json.loads(line)["us"].items()}
    out = {}  # all_reduce_perf: size count type redop root time algbw busbw ...
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 13 and f[0].isdigit() and re.match(r"^[0-9.]+$", f[5]):
            out[int(f[0])] = float(f[5])
    return out
off, on = times(sys.argv[1]), times(sys.argv[2])
print(f"--- {sys.argv[3]}: AllReduce time, without -> with the plugin")
for size in sorted(set(off) & set(on)):
    print(f"  {size:>9} B  {off[size]:9.2f} us -> {on[size]:9.2f} us  "
          f"({100 * (on[size] / off[size] - 1):+.1f} %)")
if not off or not on:
    print("  (no timings parsed)")
EOF
}

tests_bin=$(command -v all_reduce_perf || true)
[[ -z "$tests_bin" && -x "${NCCL_TESTS_DIR:-/nonexistent}/build/all_reduce_perf" ]] &&
  tests_bin="$NCCL_TESTS_DIR/build/all_reduce_perf"
if [[ -n "$tests_bin" ]]; then
  echo "gpu_check: nccl-tests $tests_bin on $ngpus GPU(s), one process"
  run nccl_tests "$tests_bin" -b 128K -e 4M -f 2 -g "$ngpus" -n 200 -w 20
  check nccl_tests --ranks "$ngpus" --rings 1 --ops "$([[ $ngpus -gt 1 ]] && echo 100 || echo 0)"
  compare nccl_tests
else
  "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' ||
    die "no nccl-tests and torch sees no CUDA device"
  job=("$py" -m torch.distributed.run --standalone --nproc_per_node "$ngpus" "$here/tests/gpu_torch_job.py")
  echo "gpu_check: PyTorch NCCL job on $ngpus GPU(s) (no all_reduce_perf found)"
  run torch "${job[@]}"
  grep -h '^{' "$work/torch.on" || true
  if [[ "$ngpus" -gt 1 ]]; then
    check torch --ranks "$ngpus" --ops 100
    NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 run torch_net "${job[@]}"
    check torch_net --ranks "$ngpus" --ops 100 --net
    compare torch_net
  else
    # a world of 1: NCCL copies locally, so there is no collective traffic to profile;
    # the check is that NCCL loads the plugin and it writes a sane ring
    check torch --ranks 1 --ops 0
  fi
  compare torch
fi

echo "--- per-callback cost on this CPU (fake-NCCL harness, ns)"
"$py" - "$work/build" <<'EOF'
import json, os, subprocess, sys, tempfile
build = sys.argv[1]
with tempfile.TemporaryDirectory() as ring:
    env = dict(os.environ, MYCROFT_NCCL_TICK_MS="0", MYCROFT_NCCL_RING_DIR=ring)
    env.pop("NCCL_PROFILER_PLUGIN", None)
    out = subprocess.run([f"{build}/fake_nccl", f"{build}/libnccl-profiler-mycroft.so", "6",
                          "--bench", "20000", "16"], capture_output=True, text=True,
                         env=env, check=True).stdout
r = json.loads(out.splitlines()[-1])
for name, v in r["callbacks"].items():
    print(f"  {name:32} median {v['median_ns']:7.1f}  p99 {v['p99_ns']:7.1f}")
EOF

[[ $status -eq 0 ]] && echo "gpu_check: OK" || echo "gpu_check: FAILED"
exit $status
