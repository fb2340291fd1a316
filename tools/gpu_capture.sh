#!/usr/bin/env bash
# Record real NCCL and CUDA failure output, and ftwatch's live decisions on it, on a machine with an
# NVIDIA GPU and a CUDA build of PyTorch (torchrun on PATH or as `python3 -m torch.distributed.run`).
#
#   tools/gpu_capture.sh OUTDIR
#
# For each scenario of examples/train_gpu.py (a clean NCCL_DEBUG=INFO run, a CUDA OOM, a
# device-side assert, an illegal address, two ranks sharing one GPU under NCCL) it writes
# OUTDIR/<scenario>/: combined.log (torchrun --tee 3, the shape of tests/golden's logs),
# torchrun.rc, ftwatch-run.out and decisions.jsonl (the same job under `ftwatch run`, one restart
# allowed), replay.json (`ftwatch replay --json` of combined.log); and OUTDIR/bootcheck{1,2}.out,
# OUTDIR/nodecheck{1,2}.out (the GPU paths of both checks, with one and two workers or nodes), OUTDIR/nvidia-smi.txt and OUTDIR/dmesg.txt
# (kernel lines such as NVRM Xids, where the machine lets them be read). Every step has a time
# limit; a failing step is recorded, never fatal. ftwatch runs from this checkout (PYTHONPATH).
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
    env "$@" timeout "$limit" "$py" -m torch.distributed.run --nproc-per-node "$nproc" --tee 3 \
        --master-port 29511 "$root/examples/train_gpu.py" > "$dir/combined.log" 2>&1
    echo $? > "$dir/torchrun.rc"
    env "$@" timeout "$limit" "$py" -m ftwatch run "${flags[@]}" --nproc-per-node "$nproc" \
        --state-dir "$dir/state" --decisions-file "$dir/decisions.jsonl" -- \
        "$py" "$root/examples/train_gpu.py" > "$dir/ftwatch-run.out" 2>&1
    echo "ftwatch run rc=$?" >> "$dir/ftwatch-run.out"
    timeout 60 "$py" -m ftwatch replay "${flags[@]}" --json "$dir/combined.log" > "$dir/replay.json" 2>&1
    echo "   torchrun rc=$(cat "$dir/torchrun.rc"); $(tail -1 "$dir/ftwatch-run.out")"
}

nvidia-smi > "$out/nvidia-smi.txt" 2>&1
scenario clean_info 1 NCCL_DEBUG=INFO
scenario cuda_oom 1 FTWATCH_INJECT_FAULT=cuda_oom
scenario device_assert 1 FTWATCH_INJECT_FAULT=device_assert
scenario illegal_address 1 FTWATCH_INJECT_FAULT=illegal_address
scenario shared_gpu 2 FTWATCH_INJECT_FAULT=shared_gpu FTWATCH_GPU_PER_RANK=0
for n in 1 2; do   # 1: the NVML and NCCL-version path; 2: the all-reduce path (two workers share GPU 0 here)
    echo "== bootcheck, $n worker(s)"
    timeout "$limit" "$py" -m ftwatch bootcheck --nproc-per-node "$n" --state-dir "$out/health" > "$out/bootcheck$n.out" 2>&1
    echo "bootcheck rc=$?" >> "$out/bootcheck$n.out"
    echo "== nodecheck, $n node(s)"
    timeout "$limit" "$py" -m ftwatch nodecheck --nnodes "$n" --nproc-per-node 1 --state-dir "$out/health" > "$out/nodecheck$n.out" 2>&1
    echo "nodecheck rc=$?" >> "$out/nodecheck$n.out"
done
(dmesg 2>&1 || journalctl -k --no-pager 2>&1) | tail -200 > "$out/dmesg.txt"
echo "done"
