#!/usr/bin/env bash
# Record real NCCL and CUDA failure output, and ftwatch's live decisions on it, on a machine with an
# NVIDIA GPU and a CUDA build of PyTorch (torchrun on PATH or as `python3 -m torch.distributed.run`).
#
#   tools/gpu_capture.sh OUTDIR [SCENARIO ...]     (default: every scenario, then `checks`)
#
# For each scenario of examples/train_gpu.py (a clean NCCL_DEBUG=INFO run, a CUDA OOM, a
# device-side assert, an illegal address, a misaligned address, a kernel's trap, an NCCL communicator
# made with the GPU's memory full, a sync inside a CUDA graph capture, a step run with the GPU's
# memory full, two ranks sharing one GPU under NCCL; buffered_oom: the
# OOM with standard output block-buffered, as a job writing to a pipe or file without -u; NCCL told
# to use a socket interface, an algorithm or a network that does not exist; a collective that
# outlives the process group's 15 s timeout, so ProcessGroupNCCL's watchdog fires; gpu_held: another
# process on the node holds all of the GPU's memory, as a stray process of an earlier job does;
# too_many_ranks: two ranks per node on cuda:LOCAL_RANK where the node has one GPU; no_gpu: the
# node shows the job no GPU) it writes
# OUTDIR/<scenario>/: combined.log (torchrun --tee 3, the shape of tests/golden's logs),
# torchrun.rc, ftwatch-run.out and decisions.jsonl (the same job under `ftwatch run`, one restart
# allowed), replay.json (`ftwatch replay --json` of combined.log); and OUTDIR/bootcheck{1,2}.out,
# OUTDIR/nodecheck{1,2}.out (the GPU paths of both checks, with one and two workers or nodes), OUTDIR/nvidia-smi.txt and OUTDIR/dmesg.txt
# (kernel lines such as NVRM Xids, where the machine lets them be read). Every step has a time
# limit; a failing step is recorded, never fatal (a step that outlives its limit leaves
# OUTDIR/<scenario>/ps-at-limit.txt, the process tree just before it was killed). ftwatch runs from
# this checkout (PYTHONPATH).
set -u
out=${1:?usage: tools/gpu_capture.sh OUTDIR}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
limit=${STEP_LIMIT:-150}            # seconds per step
flags=(--enable-job-restart=True --max-num-of-job-restart=1)

scenario() {   # name nproc [VAR=value ...]
    local name=$1 nproc=$2; shift 2
    local dir="$out/$name"
    mkdir -p "$dir"
    echo "== $name (nproc $nproc; $*)"
    local hog=
    if [ "${1:-}" = HOLD_GPU=1 ]; then     # a stray process holds the GPU's memory during both runs
        shift
        "$py" -c "$hold_gpu" > "$dir/holder.out" 2>&1 &
        hog=$!
        for _ in $(seq 120); do grep -q '^holding' "$dir/holder.out" 2>/dev/null && break; sleep 0.5; done
        nvidia-smi > "$dir/nvidia-smi-held.txt" 2>&1
    fi
    env "$@" timeout "$limit" "$py" -m torch.distributed.run --nproc-per-node "$nproc" --tee 3 \
        --master-port 29511 "$root/examples/train_gpu.py" > "$dir/combined.log" 2>&1
    echo $? > "$dir/torchrun.rc"
    (sleep $((limit - 3)); ps -eo pid,ppid,stat,etime,wchan:24,cmd --forest > "$dir/ps-at-limit.txt" 2>&1) &
    local watcher=$!
    env "$@" timeout -k 5 "$limit" "$py" -m ftwatch run "${flags[@]}" --nproc-per-node "$nproc" \
        --state-dir "$dir/state" --decisions-file "$dir/decisions.jsonl" -- \
        "$py" "$root/examples/train_gpu.py" > "$dir/ftwatch-run.out" 2>&1
    local rc=$?
    kill "$watcher" 2>/dev/null
    echo "ftwatch run rc=$rc, ended $(date +%T.%N)" >> "$dir/ftwatch-run.out"
    timeout 60 "$py" -m ftwatch replay "${flags[@]}" --json "$dir/combined.log" > "$dir/replay.json" 2>&1
    echo "   torchrun rc=$(cat "$dir/torchrun.rc"); $(tail -1 "$dir/ftwatch-run.out")"
    [ -z "$hog" ] || kill "$hog" 2>/dev/null
    [ -z "$hog" ] || wait "$hog" 2>/dev/null
}

# the stray process of gpu_held: takes GPU 0's memory in 1 GiB, then 16 MiB allocations until the
# caching allocator is refused, says how much it holds, and sleeps until it is killed
hold_gpu='
import time, torch
held, size = [], 1 << 30
while size >= 1 << 24:
    try:
        held.append(torch.empty(size, dtype=torch.uint8, device="cuda:0"))
    except torch.OutOfMemoryError:
        size >>= 6
free, total = torch.cuda.mem_get_info(0)
print(f"holding {sum(t.numel() for t in held) / 2**30:.2f} GiB of {total / 2**30:.2f}; {free / 2**20:.0f} MiB free", flush=True)
time.sleep(3600)
'

nvidia-smi > "$out/nvidia-smi.txt" 2>&1
declare -A env_of=(
    [clean_info]="1 NCCL_DEBUG=INFO"
    [cuda_oom]="1 FTWATCH_INJECT_FAULT=cuda_oom"
    [device_assert]="1 FTWATCH_INJECT_FAULT=device_assert"
    [illegal_address]="1 FTWATCH_INJECT_FAULT=illegal_address"
    [shared_gpu]="2 FTWATCH_INJECT_FAULT=shared_gpu FTWATCH_GPU_PER_RANK=0"
    [buffered_oom]="1 FTWATCH_INJECT_FAULT=cuda_oom FTWATCH_NO_FLUSH=1 PYTHONUNBUFFERED="
    [nccl_bad_ifname]="1 NCCL_SOCKET_IFNAME=nosuchif0 NCCL_DEBUG=WARN"
    [nccl_bad_algo]="1 NCCL_ALGO=nosuchalgo NCCL_DEBUG=WARN"
    [nccl_net_ib]="1 NCCL_NET=IB NCCL_DEBUG=WARN"
    [misaligned_address]="1 FTWATCH_INJECT_FAULT=misaligned_address"
    [launch_failure]="1 FTWATCH_INJECT_FAULT=launch_failure"
    [nccl_init_oom]="1 FTWATCH_INJECT_FAULT=nccl_init_oom NCCL_DEBUG=WARN"
    [graph_capture]="1 FTWATCH_INJECT_FAULT=graph_capture"
    [fill_then_compute]="1 FTWATCH_INJECT_FAULT=fill_then_compute FTWATCH_INJECT_STEP=1"
    [collective_timeout]="1 FTWATCH_INJECT_FAULT=slow_collective FTWATCH_PG_TIMEOUT=15"
    [gpu_held]="1 HOLD_GPU=1"
    [too_many_ranks]="2 FTWATCH_GPU_PER_RANK=local"
    [no_gpu]="1 FTWATCH_GPU_PER_RANK=local CUDA_VISIBLE_DEVICES="
)
chosen=("${@:2}")
[ ${#chosen[@]} -gt 0 ] || chosen=(clean_info cuda_oom device_assert illegal_address shared_gpu buffered_oom
                                    nccl_bad_ifname nccl_bad_algo nccl_net_ib collective_timeout
                                    gpu_held too_many_ranks no_gpu misaligned_address launch_failure
                                    nccl_init_oom graph_capture fill_then_compute checks)
for name in "${chosen[@]}"; do
    [ "$name" = checks ] || [ -n "${env_of[$name]:-}" ] || { echo "no such scenario: $name" >&2; exit 2; }
done
for name in "${chosen[@]}"; do
    [ "$name" != checks ] || continue
    # shellcheck disable=SC2086  # the table's words: nproc, then VAR=value pairs
    scenario "$name" ${env_of[$name]}
done
if [[ " ${chosen[*]} " == *" checks "* ]]; then
    for n in ${CHECK_COUNTS:-1 2}; do   # 1: the NVML and NCCL-version path; 2: the all-reduce path (two workers share GPU 0 here)
        echo "== bootcheck, $n worker(s)"
        timeout "$limit" "$py" -m ftwatch bootcheck --nproc-per-node "$n" --state-dir "$out/health" > "$out/bootcheck$n.out" 2>&1
        echo "bootcheck rc=$?" >> "$out/bootcheck$n.out"
        echo "== nodecheck, $n node(s)"
        timeout "$limit" "$py" -m ftwatch nodecheck --nnodes "$n" --nproc-per-node 1 --state-dir "$out/health" > "$out/nodecheck$n.out" 2>&1
        echo "nodecheck rc=$?" >> "$out/nodecheck$n.out"
    done
fi
(dmesg 2>&1 || journalctl -k --no-pager 2>&1) | tail -200 > "$out/dmesg.txt"
echo "done"
