"""A torchrun agent whose rendezvous store found its port taken, then a failed rendezvous: the port
is another job's (SPEC R7, issue 12 item 3).

torchrun's c10d rendezvous backend creates the store on the endpoint's host itself
(torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py ``_create_tcp_store``): it tries
each of ``[is_host, False]`` in turn, and when ``is_host`` was only inferred (the endpoint's name
matched this machine, no ``is_host`` option given) and starting the store *server* fails, its
comment says it tries once more as a client. The server's failure is c10d's socket warnings
("The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use)",
"... failed to listen on any local network address", torch/csrc/distributed/c10d/socket.cpp); the
job's start-up goes on, so ``ftwatch.pipeline.notices`` files them as notices. But the client then
reaches whatever listens on that port of this host: with a fixed ``--rdzv-endpoint`` port on a node
another job also uses, that job's store, so this job's agents join (or are shut out of) the other
job's rendezvous, and their rendezvous later closes under them or times out
(``RendezvousClosedError`` / ``RendezvousTimeoutError``). A PyTorch distributed maintainer read the
bind lines of such a job so (the corpus case torchrun-slurm-ddp-rdzv-port-shared-with-other-job-
rendezvous-closed, from its thread); the fix is the job's launch: a port of its own (a port from
the scheduler's job id, ``--rdzv-endpoint host:0``-style free ports), which a restart with the same
launch does not change.

:func:`port_taken` reads it: when every error the incident has to explain is a torchelastic
rendezvous failure or a process exit (no other error of the program, the node or the network), and
before the first rendezvous failure the same job noted that a c10d store server could not bind its
port because the address was in use, the root cause is ``rendezvous.store_port_taken``
(user_code, fail_job) on the bind line. A bind failure with no rendezvous failure after it stays
a notice (the agent may have joined its own job's store, hosted by another process of the same
rendezvous on this machine: the edge case the backend's comment names).
"""

from __future__ import annotations

import re
from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding, Severity

#: the rules whose lines say a server socket could not bind its port (EADDRINUSE)
BIND_RULES = frozenset({"os.address_in_use", "torch_npu.init_port_in_use", "c10d.server_listen_addr_in_use"})
#: a bind line of c10d's store (its socket code, the TCPStore), not any program's server
_C10D = re.compile(r"\[c10d\]|\bTCPStore\b|failed to listen on any local network address")
#: torchelastic's rendezvous ended without this agent in a formed world
RDZV_RULES = frozenset({"torch_elastic.rendezvous_closed", "torch_elastic.rendezvous_timeout"})
SOURCE = ("pytorch/pytorch torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py _create_tcp_store "
          "(for is_server in [is_host, False]: an inferred host whose store server fails retries as a client of "
          "whatever listens on the port); torch/csrc/distributed/c10d/socket.cpp (server socket failed to bind, "
          "errno 98 Address already in use)")


def port_taken(errors: Sequence[Finding], notices: Sequence[Finding]) -> Finding | None:
    """``rendezvous.store_port_taken`` (the module docstring), or None.

    Args:
        errors: the errors the incident has to explain (the real ones, or its fallout when it has
            none), earliest first.
        notices: the errors this attempt outlived (``IncidentDesk.notices``), where c10d's bind
            warnings go once the start-up went on.
    """
    rdzv = next((f for f in errors if f.rule_id in RDZV_RULES), None)
    if rdzv is None or not all(f.rule_id in RDZV_RULES or f.kind == "exit_code" for f in errors):
        return None
    bind = next((n for n in sorted(notices, key=lambda n: (n.time, n.seq))
                 if n.rule_id in BIND_RULES and _C10D.search(n.line) and n.origin.job == rdzv.origin.job
                 and (n.time, n.seq) <= (rdzv.time, rdzv.seq)), None)
    if bind is None:
        return None
    line = (f"the rendezvous store's server could not bind its port ({bind.line.strip()[:160]}) and the "
            f"rendezvous then failed ({rdzv.rule_id}): the agent went on as a client of whatever holds that port "
            "on this host, another job's store; the launch's fixed rendezvous port is the cause, which a restart "
            "with the same launch meets again")
    return Finding("rendezvous.store_port_taken", "keyword", FailureClass.USER_CODE, Action.FAIL_JOB,
                   Severity.ERROR, bind.origin, line, bind.time, bind.seq, (bind.line, rdzv.line),
                   {"rendezvous": rdzv.rule_id}, SOURCE)
