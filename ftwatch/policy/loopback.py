"""A connect to a loopback address in a job that spans hosts: the address every rank was given
leads each host to itself (issue 12: a configuration that never worked against a transient fault).

The knowledge: the loopback network never leaves its host. RFC 1122 section 3.2.1.3 (g):
``{127, <any>}`` is the "Internal host loopback address. Addresses of this form MUST NOT appear
outside a host"; RFC 4291 section 2.5.3: ``::1`` "may be used by a node to send an IPv6 packet to
itself. It must not be assigned to any physical interface"; RFC 6890 (the special-purpose
registry): 127.0.0.0/8 and ::1/128 are neither forwardable nor global. So when ranks on two hosts
are to meet at a loopback address, a rank that connects to it reaches its own host, never the peer
it was sent to, whatever the moment. The common way there: a host whose name resolves to
``127.0.1.1`` (Debian's ``/etc/hosts`` entry for the host name, Debian Reference 5.1.1), which a
library that takes its address from the host name then advertises to its peers; gloo does
(pytorch/pytorch#15592, the maintainers: gloo picked the address the host name resolves to, set
``GLOO_SOCKET_IFNAME``; meta-pytorch/data#1142 the same for the group torchdata's reading service
creates), and so does a launcher that derives its master endpoint from the host name.

The reading (:func:`loopback_across_hosts`): before any progress (the caller,
``ftwatch.policy.initphase.at_init``, checks that), a connect failure graded retryable (refused,
timed out: the rule's own grade says "may pass") whose line names a loopback target, in a job whose
findings come from two hosts or more (:func:`job_hosts`: the instances' nodes, or NCCL's
``<host>:<pid>:<tid>`` prefixes, each naming counted apart), is the launch's configuration (user_code, fail_job). On one host
the same connect keeps its grade: there the loopback address does lead to the peer, and a refused or
timed-out connect is a peer not listening yet or gone (a c10d store on ``127.0.0.1`` that starts
late). Where the hosts are not known (a replayed log with one file per rank and no host names) it
keeps its grade too.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Iterable

from ftwatch.events import FailureClass, Finding
from ftwatch.policy.escalation import IMPLICIT_NODES

#: the host an NCCL debug line comes from: NCCL prefixes it ``<host>:<pid>:<tid> [<dev>] NCCL INFO``
#: (src/debug.cc ncclDebugLog), whatever a launcher put before it (mpirun's ``[1,0]<stdout>:``); group 2 the pid
NCCL_HOST = re.compile(r"(?:^|[\s:>])([A-Za-z0-9][\w.-]*):(\d+):\d+ \[\d+\] NCCL (?:INFO|WARN)")
#: the target of a connect as the libraries print it: NCCL ``connect to 127.0.1.1<41327>``, gloo
#: ``connect [127.0.1.1]:38117``, c10d ``connect to (127.0.0.1, 29500)`` / ``connect to [::1]:29500`` /
#: ``to host 127.0.0.1:29500``, Paddle's ``connect to 127.0.1.1:48209``; the name ``localhost``, which
#: resolves to a loopback address (RFC 6761 section 6.3)
_TARGET = re.compile(r"(?i)\bconnect(?:/validate)?(?:\s+to)?\s*(?:host\s+)?(?:\[([0-9a-f.:]+)\]|\(\s*([0-9a-f.:]+|localhost)\s*,"
                     r"|(\d{1,3}(?:\.\d{1,3}){3}|localhost)(?=[<:\s,]))")
_LOOPBACK_SOURCE = (
    "RFC 1122 section 3.2.1.3 (g) ({127, <any>}: internal host loopback, MUST NOT appear outside a host); RFC 4291 "
    "section 2.5.3 (::1, a node's packets to itself); RFC 6890 (127.0.0.0/8, ::1/128: not forwardable, not global); "
    "RFC 6761 section 6.3 (localhost names resolve to loopback addresses); Debian Reference 5.1.1 (127.0.1.1, the host name's /etc/hosts entry); pytorch/pytorch#15592 (gloo advertised the "
    "address its host name resolves to, 127.0.1.1; the maintainers: set GLOO_SOCKET_IFNAME)")
_LOOPBACK_MEANING = (
    "before any progress, a connect to the loopback address {target} failed in a job whose ranks run on {n} hosts: "
    "the loopback network never leaves its host, so the address the ranks were given (a host name that resolves to "
    "127.0.1.1, an interface setting) leads each host to itself; the launch's configuration, which a restart repeats")


def job_hosts(evidence: Iterable[Finding]) -> frozenset[str]:
    """The hosts the findings name, by one naming at a time so that one host is never counted twice
    under two names: their instances' nodes (not the implicit ones a replay or a local run gives,
    ``IMPLICIT_NODES``), or else the ``<host>`` of NCCL's line prefix (NCCL's own host name, cut at
    the first dot: src/debug.cc getHostName(hostname, 1024, '.')), whichever names more."""
    nodes: set[str] = set()
    prefixed: set[str] = set()
    for g in evidence:
        if g.origin.node and g.origin.node not in IMPLICIT_NODES and g.origin.node != "unknown":
            nodes.add(g.origin.node)
        named = NCCL_HOST.search(g.line)
        if named:
            prefixed.add(named.group(1))
    return frozenset(max(nodes, prefixed, key=len))


def loopback_target(line: str) -> str | None:
    """The loopback address (127.0.0.0/8, ``::1``, an IPv4-mapped ``::ffff:127.x``) a connect on
    ``line`` went to; None when the line names no connect or its target is no loopback address."""
    for match in _TARGET.finditer(line):
        name = next(g for g in match.groups() if g)
        if is_loopback(name):
            return name
    return None


def is_loopback(name: str) -> bool:
    """Says whether a host as a program prints it names the host itself: ``localhost`` (RFC 6761
    section 6.3: resolves to a loopback address; also the ``localhost.localdomain`` and
    ``ip6-localhost`` names of distributions' /etc/hosts), 127.0.0.0/8, ``::1``, an IPv4-mapped
    ``::ffff:127.x``."""
    if name.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        ip = ipaddress.ip_address(name.split("%")[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def loopback_across_hosts(f: Finding, evidence: Iterable[Finding]) -> tuple[str, str] | None:
    """``(source, meaning)`` when ``f`` is a connect failure graded retryable whose target is a
    loopback address (:func:`loopback_target`) and the findings name two hosts or more
    (:func:`job_hosts`); None otherwise. The caller checks that the job made no progress before ``f``."""
    if f.failure_class is not FailureClass.RETRYABLE_INFRA or (target := loopback_target(f.line)) is None:
        return None
    hosts = job_hosts([f, *evidence])
    if len(hosts) < 2:
        return None
    return _LOOPBACK_SOURCE, _LOOPBACK_MEANING.format(target=target, n=len(hosts))
