"""torch 1.6-1.9's wording of an aborted communicator, ``RuntimeError: NCCL communicator was
aborted.`` (``NCCLComm::getNcclComm`` in torch/lib/c10d/NCCLUtils.hpp, raised by the next collective
after the watchdog's ``ncclCommAbort``): fallout of the watchdog's timeout, as the later wording
(``... was aborted on rank N. Original reason for failure was: ...``) is. Before the row, the
traceback ending in it was the generic RuntimeError, a program error that failed the job after a
collective timeout with no cause (CenterPoint's ALLGATHER watchdog timeout)."""

from __future__ import annotations

from ftwatch.events import FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())
TRACEBACK = ("Traceback (most recent call last):",
             '  File "./tools/train.py", line 137, in <module>', "    main()",
             '  File "/env/lib/python3.6/site-packages/torch/nn/parallel/distributed.py", line 799, in forward',
             "    output = self.module(*inputs[0], **kwargs[0])")


def findings(*lines: str):
    text = "".join(f"{line}\n" for line in lines)
    return ENGINE.feed(Origin("rank0", 0, "j", "node-1", "stdout", "file"), text.encode(), 1.0, final=True)


def test_the_older_wording_ends_a_traceback_as_fallout():
    found = findings(*TRACEBACK, "RuntimeError: NCCL communicator was aborted.")
    assert [(f.rule_id, f.failure_class) for f in found] == [
        ("torch.nccl_communicator_aborted_legacy", FailureClass.FALLOUT)]


def test_the_later_wording_is_not_read_by_the_legacy_row():
    """(its "Original reason" suffix decides, as before: here NCCL's remote error)"""
    found = findings("RuntimeError: NCCL communicator was aborted on rank 1.  Original reason for failure was: "
                     "NCCL error: remote process exited or there was a network error, NCCL version 2.14.3")
    assert found and "torch.nccl_communicator_aborted_legacy" not in [f.rule_id for f in found]
