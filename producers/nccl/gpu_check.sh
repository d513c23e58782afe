#!/usr/bin/env bash
# The GPU check of Mycroft's NCCL profiler plugin (producers/nccl/README.md, "GPU check").
#
#   producers/nccl/gpu_check.sh [--out DIR] [--job auto|nccl|torch] [--churn N] [--iters N]
#                               [--no-graph] [--timeout SECONDS]
#
# Needs no network and no virtual environment: a C compiler, make, python3 (standard library
# only), and either
#   (a) NCCL >= 2.27 (libnccl.so.2) and the CUDA runtime (libcudart.so.13/.12): the job is
#       tests/gpu_nccl_job.c, built here, which dlopens both; MYCROFT_NCCL_LIB and MYCROFT_CUDART
#       name the files when the loader cannot find them; or
#   (b) PyTorch with CUDA in some python ($PYTHON, python3, python, .venv/bin/python; or
#       MYCROFT_TORCH_PYTHON alone): the job is tests/gpu_torch_job.py.
# (a) is taken when both are there (--job picks one). The job's two ranks run on one GPU (two
# GPUs when there are more) as two "hosts" for NCCL (NCCL_HOSTID), so that they talk through
# the network transport over loopback, the only transport with proxy events. The job runs
# twice, with NCCL_PROFILER_PLUGIN=none and with the plugin; tests/gpu_ring_check.py then checks
# the rings against what the job issued and compares the times. The plugin gets 16
# communicator slots (MYCROFT_NCCL_COMMS), so the job's churn of communicators reuses them.
#
# Everything is kept in DIR (default producers/nccl/gpu_results/<UTC time>): build/ (the
# plugin and the job), off/ and on/ (manifest-R.json and rank-R.log per rank, on/rings/),
# environment.txt, results.json, summary.txt.
#
# Exit status: 0 every check passed; 1 a check failed, or the job failed with the plugin only;
# 2 no GPU; 3 no NCCL to run (neither (a) nor (b)); 4 NCCL older than 2.27 (it looks for no
# profiler ABI the plugin exports); 5 the plugin or the job does not build, or the job fails
# without the plugin too, or bad arguments. For 2 to 4 nothing was run.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out="" job=auto churn=80 iters=20 graph=() limit=600

usage() {
  sed -n '3,4p' "${BASH_SOURCE[0]}" | sed 's/^# *//' >&2
  exit 5
}

while [[ $# -gt 0 ]]; do
  case $1 in
    --out) out=${2:?}; shift 2 ;;
    --job) job=${2:?}; shift 2 ;;
    --churn) churn=${2:?}; shift 2 ;;
    --iters) iters=${2:?}; shift 2 ;;
    --timeout) limit=${2:?}; shift 2 ;;
    --no-graph) graph=(--no-graph); shift ;;
    *) usage ;;
  esac
done
[[ $job =~ ^(auto|nccl|torch)$ && $churn =~ ^[0-9]+$ && $iters =~ ^[1-9][0-9]*$ &&
  $limit =~ ^[1-9][0-9]*$ ]] || usage

out=${out:-$here/gpu_results/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
echo "gpu_check: results go to $out"

# die CODE MESSAGE: say why nothing (more) was run, in results.json too
die() {
  local why=${2//\\/\\\\}
  why=${why//\"/\\\"}
  printf '{"ok": false, "exit": %d, "reason": "%s"}\n' "$1" "${why//$'\n'/ }" >"$out/results.json"
  echo "gpu_check: $2" >&2
  echo "gpu_check: exit $1; results in $out" >&2
  exit "$1"
}

# vtext CODE: ncclGetVersion's code as a version (23007 -> 2.30.7)
vtext() { echo "$(($1 / 10000)).$(($1 / 100 % 100)).$(($1 % 100))"; }

py3=${PYTHON3:-python3}
for tool in "${CC:-cc}" make "$py3"; do
  command -v "$tool" >/dev/null 2>&1 || die 5 "no $tool on PATH"
done

# ---- the job's program first: it also probes for NCCL and the CUDA runtime ----
mkdir -p "$out/build"
"${CC:-cc}" -std=c11 -O2 -Wall -Wextra -o "$out/build/gpu_nccl_job" \
  "$here/tests/gpu_nccl_job.c" -ldl >"$out/build.log" 2>&1 ||
  die 5 "tests/gpu_nccl_job.c does not build: $(tail -5 "$out/build.log")"

# ---- what this machine has ----
# probe CMD...: the command's key=value lines into the associative array P
declare -A P=()
probe() {
  local k v
  while IFS='=' read -r k v; do
    [[ -n $k ]] && P[$k]=$v
  done < <("$@" 2>/dev/null || true)
}

torch_py="" nvdirs="" pythons_seen=() torch_seen=("no python")
pythons=("${PYTHON:-}" python3 python "$root/.venv/bin/python")
[[ -n ${MYCROFT_TORCH_PYTHON:-} ]] && pythons=("$MYCROFT_TORCH_PYTHON")
for p in "${pythons[@]}"; do
  if [[ -z $p ]] || ! command -v "$p" >/dev/null 2>&1; then continue; fi
  real=$(readlink -f "$(command -v "$p")")
  [[ " ${pythons_seen[*]} " == *" $real "* ]] && continue
  [[ ${#pythons_seen[@]} -eq 0 ]] && torch_seen=()
  pythons_seen+=("$real")
  for k in torch_error torch_version torch_gpus torch_nccl_version nvidia_lib_dirs; do
    unset "P[$k]"
  done
  probe "$p" "$here/tests/gpu_torch_job.py" --probe
  nvdirs=${nvdirs:-${P[nvidia_lib_dirs]:-}}
  torch_seen+=("$p: ${P[torch_error]:-torch ${P[torch_version]:-?} sees ${P[torch_gpus]:-0} GPUs}")
  if [[ -n ${P[torch_nccl_version]:-} ]]; then
    torch_py=$p
    break
  fi
done
torch_why=$(printf '%s; ' "${torch_seen[@]}")
torch_why=${torch_why%; }

# NCCL and the CUDA runtime from the loader's path and CUDA's usual folders; failing that,
# from the NVIDIA wheels (PyTorch's) found above
ldpath=${LD_LIBRARY_PATH:-}
for d in ${CUDA_HOME:+"$CUDA_HOME/lib64"} /usr/local/cuda/lib64 /usr/local/cuda/targets/*/lib; do
  [[ -d $d ]] && ldpath=${ldpath:+$ldpath:}$d
done
probe_nccl() {
  local k
  for k in nccl_version nccl_lib nccl_error cudart cudart_error cuda_devices cuda_error; do
    unset "P[$k]"
  done
  probe env LD_LIBRARY_PATH="$ldpath" "$out/build/gpu_nccl_job" --probe
}
probe_nccl
if [[ -n $nvdirs && (${P[nccl_version]:-0} -lt 22700 || -z ${P[cudart]:-}) ]]; then
  ldpath=${ldpath:+$ldpath:}$nvdirs
  probe_nccl
fi

smi=0
if command -v nvidia-smi >/dev/null 2>&1; then
  smi=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
cuda_gpus=${P[cuda_devices]:-0} torch_gpus=${P[torch_gpus]:-0}
nccl=${P[nccl_version]:-0} torch_nccl=${P[torch_nccl_version]:-0}
{
  echo "nvidia-smi GPUs: $smi"
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L 2>&1 || true; fi
  for k in "${!P[@]}"; do echo "$k=${P[$k]}"; done | sort
  echo "torch python: ${torch_py:-none}"
  echo "LD_LIBRARY_PATH=$ldpath"
} >"$out/environment.txt"

gpus=$((smi > cuda_gpus ? smi : cuda_gpus))
gpus=$((gpus > torch_gpus ? gpus : torch_gpus))
if [[ $gpus -eq 0 ]]; then
  cuda_why=${P[cudart_error]:-${P[cuda_error]:-0 devices}}
  smi_why=$(command -v nvidia-smi >/dev/null 2>&1 && echo "lists no GPU" || echo "not found")
  die 2 "no GPU: nvidia-smi $smi_why; CUDA runtime: $cuda_why; PyTorch: $torch_why. Nothing was run."
fi

a_ok=0 b_ok=0
[[ $job != torch && $nccl -ge 22700 && $cuda_gpus -gt 0 ]] && a_ok=1
[[ $job != nccl && $torch_nccl -ge 22700 && $torch_gpus -gt 0 ]] && b_ok=1
if [[ $a_ok -eq 0 && $b_ok -eq 0 ]]; then
  old=()
  [[ $job != torch && $nccl -gt 0 && $nccl -lt 22700 ]] &&
    old+=("NCCL $(vtext "$nccl") (${P[nccl_lib]:-})")
  [[ $job != nccl && $torch_nccl -gt 0 && $torch_nccl -lt 22700 ]] &&
    old+=("PyTorch's NCCL $(vtext "$torch_nccl") ($torch_py)")
  [[ ${#old[@]} -gt 0 ]] &&
    die 4 "${old[*]}: older than 2.27, the first NCCL that looks for a profiler ABI the plugin exports (v4). Nothing was run."
  why="libnccl.so.2: ${P[nccl_error]:-NCCL $(vtext "$nccl")}; CUDA runtime: ${P[cudart_error]:-${P[cuda_error]:-$cuda_gpus devices}}; PyTorch: $torch_why"
  die 3 "no NCCL to run ($job): $why. Nothing was run."
fi

# ---- the plugin, with its Makefile, into the kept directory ----
make -s -C "$here" BUILD="$out/build" >>"$out/build.log" 2>&1 ||
  die 5 "the plugin does not build: $(tail -5 "$out/build.log")"
so=$out/build/libnccl-profiler-mycroft.so
echo "gpu_check: built $so"

devices=(0 0)
ndev=$([[ $a_ok -eq 1 ]] && echo "$cuda_gpus" || echo "$torch_gpus")
[[ $ndev -ge 2 ]] && devices=(0 1)
if [[ $a_ok -eq 1 ]]; then
  kind=nccl
  echo "gpu_check: job tests/gpu_nccl_job.c, NCCL $(vtext "$nccl") (${P[nccl_lib]:-}), ${P[cudart]:-}"
else
  kind=torch
  echo "gpu_check: job tests/gpu_torch_job.py with $torch_py, NCCL $(vtext "$torch_nccl")"
fi
echo "gpu_check: 2 ranks on GPU ${devices[0]} and ${devices[1]} of $gpus, NCCL over loopback sockets"

# ---- the job, without and with the plugin ----
free_port() {
  "$py3" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# rank_cmd R DIR: the command line of rank R into the array cmd
rank_cmd() {
  local dev=${devices[$1]}
  if [[ $kind == nccl ]]; then
    cmd=("$out/build/gpu_nccl_job" --rank "$1" --world 2 --dir "$2" --device "$dev")
  else
    cmd=("$torch_py" "$here/tests/gpu_torch_job.py" --dir "$2" --device "$dev")
  fi
  cmd+=(--churn "$churn" --iters "$iters" "${graph[@]}")
}

# run MODE: both ranks with NCCL_PROFILER_PLUGIN=none (off) or the plugin (on); 0 when both pass
run() {
  local dir=$out/$1 plugin=none port r st rc=0 cmd=() pids=()
  rm -rf "$dir"
  mkdir -p "$dir/rings"
  [[ $1 == on ]] && plugin=$so
  port=$(free_port)
  for r in 0 1; do
    rank_cmd "$r" "$dir"
    env NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo NCCL_SOCKET_FAMILY=AF_INET NCCL_IB_DISABLE=1 \
      NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_MNNVL_ENABLE=0 NCCL_MULTI_RANK_GPU_ENABLE=1 \
      NCCL_HOSTID="mycroft-gpu-check-$r" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,NET \
      NCCL_PROFILER_PLUGIN="$plugin" MYCROFT_NCCL_RING_DIR="$dir/rings" MYCROFT_JOB_ID=gpu-check \
      MYCROFT_NCCL_COMMS=16 \
      RANK="$r" WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" LD_LIBRARY_PATH="$ldpath" \
      timeout "$limit" "${cmd[@]}" >"$dir/rank-$r.log" 2>&1 &
    pids+=("$!")
  done
  # a rank that fails leaves the other one waiting inside NCCL: stop it
  while [[ ${#pids[@]} -gt 0 ]]; do
    sleep 0.2
    for r in "${!pids[@]}"; do
      kill -0 "${pids[r]}" 2>/dev/null && continue
      st=0
      wait "${pids[r]}" || st=$?
      unset "pids[r]"
      [[ $st -eq 0 ]] && continue
      rc=1
      echo "gpu_check: $1: rank $r exited with $st$([[ $st -eq 124 ]] && echo " (timed out after $limit s)")"
      if [[ ${#pids[@]} -gt 0 ]]; then kill "${pids[@]}" 2>/dev/null || true; fi
    done
  done
  return $rc
}

tails() {
  local log
  for log in "$out/$1"/rank-*.log; do
    echo "--- $log"
    tail -8 "$log"
  done
}

echo "gpu_check: job without the plugin (NCCL_PROFILER_PLUGIN=none)"
run off || { tails off >&2; die 5 "the job fails without the plugin (logs in $out/off)"; }
echo "gpu_check: job with the plugin"
status=0
if ! run on; then
  tails on
  echo "gpu_check: the job FAILED with the plugin and passed without it (logs in $out/on)"
  status=1
fi
grep -h 'PROFILER/Plugin\|Mycroft' "$out"/on/rank-*.log | sort -u | head -6 || true

if "$py3" "$here/tests/gpu_ring_check.py" "$out/on" --baseline "$out/off" \
  --json "$out/results.json" | tee "$out/summary.txt"; then :; else status=1; fi
echo "gpu_check: results in $out (results.json, summary.txt, on/, off/)"
exit $status
