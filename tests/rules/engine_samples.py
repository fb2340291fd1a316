"""Real log units the engine tests feed (tests/rules/test_engine*.py): PyTorch tracebacks, a gloo
peer error, a c10 stack dump, the NCCL watchdog, an Xid and NCCL's INFO chatter, as PyTorch, torchrun,
gloo, NCCL and the NVIDIA driver print them (several from the recorded DDP jobs in ``tests/golden``).
"""

from __future__ import annotations

import pytest

from ftwatch.events import Finding
from ftwatch.rules import matcher as matcher_mod

T0 = 1_795_253_763.0  # 2026-11-21T09:36:03Z
HAVE_HS = matcher_mod._hs is not None
needs_hs = pytest.mark.skipif(not HAVE_HS, reason="hyperscan not installed")

KEYERROR_TB = [
    "Traceback (most recent call last):",
    '  File "/srv/train/examples/train_ddp.py", line 230, in <module>',
    "    _exit(main())",
    "          ^^^^^^",
    '  File "/srv/train/examples/train_ddp.py", line 97, in main',
    "    _inject(fault[0], rank, step, args.timeout)",
    '  File "/srv/train/examples/train_ddp.py", line 182, in _inject',
    '    warmup = config["warmup_steps"]      # the bug: a key nobody set',
    "             ~~~~~~^^^^^^^^^^^^^^^^",
    "KeyError: 'warmup_steps'",
]
GLOO_TB = [
    "Traceback (most recent call last):",
    '  File "/srv/train/examples/train_ddp.py", line 230, in <module>',
    "    _exit(main())",
    "          ^^^^^^",
    '  File "/srv/train/examples/train_ddp.py", line 106, in main',
    "    dist.all_reduce(p.grad)      # the collective every rank must reach",
    "    ^^^^^^^^^^^^^^^^^^^^^^^",
    '  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83, in wrapper',
    "    return func(*args, **kwargs)",
    "           ^^^^^^^^^^^^^^^^^^^^^",
    '  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252, in all_reduce',
    "    work.wait()",
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
    "peer [127.0.0.1]:42725. This is typically caused by a remote worker crashing. Check the logs of the remote "
    "worker before reporting an error. GLHF! \U0001f3d6\ufe0f",
]
WATCHDOG = ("[E1121 09:36:03.735000 140 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
            "600010 milliseconds before timing out.")
C10_DUMP = [
    "terminate called after throwing an instance of 'c10::DistBackendError'",
    "  what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with exception: "
    "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, "
    "NumelOut=1, Timeout(ms)=600000) ran for 600010 milliseconds before timing out.",
    "Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:616 "
    "(most recent call first):",
    "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f1f5b1b2446 in "
    "/opt/venv/lib/python3.11/site-packages/torch/lib/libc10.so)",
    "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
    "std::ratio<1l, 1000l> > >) + 0x282 (0x7f1f0c5c8772 in /opt/venv/lib/python3.11/site-packages/torch/lib/"
    "libtorch_cuda.so)",
]
XID79 = ("[Sat Nov 21 09:36:03 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=48213, name=python3, "
         "GPU has fallen off the bus.")
NCCL_INFO = "node-a:4120:4180 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[2] via P2P/IPC/read"
STEP = "step 7/12 loss 0.9119"


def summary(findings: list[Finding]) -> list[tuple]:
    """What a finding says, without its engine-local sequence number."""
    return [(f.rule_id, f.kind, f.failure_class, f.action, f.severity, f.origin, f.line, f.time, f.evidence,
             dict(f.fields)) for f in findings]
