"""Whether the job made progress before its error, and what an error before any progress means
(SPEC R6 phases, issue 12: a configuration that never worked against a transient fault).

The fact (:class:`FirstProgress`): the time by which the job had shown that it trains, read once in
the incident core (``ftwatch.pipeline.incidents.IncidentDesk``) for ``run``, ``watch`` and
``replay`` alike and handed to the policy as ``Incident.progress_at``. It is the time of the job's
first progress line (``progress.marks``: step, iteration, epoch and loss lines as trainers print
them; a line that speaks of an error is none), earliest across its streams; a header or comment
line (``#``: nccl-tests' ``# nThread 1 ... step: 2(factor) warmup iters: 5``) and a line whose
counters are all 0 (a bar at ``0/2300``: no step done yet) are none. a bar of loading or preparing (``Loading checkpoint shards: 100%|``, a datasets ``Map`` bar) is none either. ``inf``: no progress this attempt; ``-inf``: not known (the
driver did not see the attempt begin: ``watch`` attached to a running job), read as "progressed
long ago", so nothing is graded as an initialisation failure.

The grading (:func:`at_init`): a root cause whose rule and message ``rules/packs/init_phase.tsv``
lists, with no progress of the job before it, takes that table's class and action. Each row says
where its sources put the failure at initialisation as configuration: NCCL's troubleshooting guide
("interfaces ... not able to communicate between nodes ... fail during the init functions") for a
connect to a network this host has no route to (ENETUNREACH, which NCCL does not retry) or to a
peer's link-local address (RFC 4291: not forwarded between links) or to an address the connecting
host lists among its own ``NET/Socket : Using`` interfaces (the peer advertised an interface each
host has with the same address, a bridge: not between the hosts; :func:`_own_address`), or a job hang
or one of NCCL's network failures while NCCL on two different hosts uses a host-local address first: the
same address on both (a bridge or ``lo`` each host holds alike), or each an address of Docker's default
bridge, 172.17.0.0/16, which each host's daemon holds for its own containers alone (Docker docs, bridge
driver); the same guide: such interfaces make NCCL "fail during the init functions or even hang";
:func:`_shared_interface`), or a rendezvous store connect that ran out of time on such an address (a
container's address on Docker's default bridge, a link-local one: :func:`_host_local_store`), or an NVLS set-up failure after NCCL said the job forced NVLS on (``NCCL_NVLS_ENABLE set by environment to 1``: NCCL's ``ncclNvlsInit`` then skips its check that the device supports multicast, which its default makes, so the failure is the setting's, not a broken device's), or a Hugging Face Hub path it cannot open (``hf://``: before any progress the path the job names, after progress the Hub failing, huggingface/datasets#7440). After progress the same line keeps its rule's grade: the path carried traffic
before, so its loss is the network's. What the table leaves out keeps its rule's grade at init too,
because its sources name transients as well; NCCL's own retry set (``socketConnectCheck``:
ECONNREFUSED, ETIMEDOUT and, from 2.24, EHOSTUNREACH) is the vendor's word that they may pass: a
"No route to host" (an IPoIB link flap that a relaunch got past, NVIDIA/nccl PR #1311), a refused connect (the host answered, its listener not
up yet or gone), a timed-out one (a node dropping SYNs under load, retried with success: NVIDIA/nccl
PR #1618), NCCL's "Software caused connection abort" (a refused or timed-out connect retried on the
same socket: NVIDIA/nccl #1515), the c10d store client's "timed out ... trying to connect" (a
master that starts late or died as well as a wrong ``MASTER_ADDR``). The restart budget (SPEC D3;
D4: "3 reschedules in a row with no node or chip fault → the 4th fails as user code") ends a
configuration among them that loops.

One reading across ranks (:func:`_shared`, ``ftwatch.policy.sharedfailure``): a failure of the
rank's own call that many ranks report at once before any progress (NCCL's ``unhandled system
error`` / ``unhandled cuda error``; a connect to the rendezvous store or coordination service that
failed on its own host as well) is the set-up they share (user_code, fail_job), not one component.
So is a failed connect to a loopback address in a job whose findings name two hosts or more
(:func:`_loopback`, ``ftwatch.policy.loopback``: RFC 1122 and RFC 4291, loopback never leaves its host).
So is NCCL's ``unhandled system error`` in a job whose processes all run on one host (:func:`_one_host`,
``ftwatch.policy.onehost``: no network between hosts is on its path, only the host's shared memory).
"""

from __future__ import annotations

import functools
import importlib.resources
import ipaddress
import re
from dataclasses import dataclass, replace
from typing import Iterable

from ftwatch.bounded import BoundedDict
from ftwatch.config.limits import MAX_INSTANCES_PER_JOB
from ftwatch.events import Action, FailureClass, Finding
from ftwatch.policy import onehost, progress, rdzvconfig, rdzvendpoint
from ftwatch.policy.lasterror import last_error_text
from ftwatch.policy.loopback import NCCL_HOST, loopback_across_hosts
from ftwatch.policy.rdzvconfig import loopback_rendezvous, own_store_unreachable, split_rendezvous
from ftwatch.policy.sharedfailure import shared_failure

_FILE = "init_phase.tsv"
#: A progress line holds one of these (``progress._LITERALS``, where a progress match can start)
_LITERALS = (b"poch", b"ter", b"oss", b"tep", b"%|", b"MnRtt/Rnk: ")
_COMMENT = re.compile(rb"(?m)^[ \t]*#[^\n]*")
#: a tqdm bar of the work before training, by the description its library gives it (``desc: pct|``):
#: transformers' ``Loading checkpoint shards`` (modeling_utils, the shards of a sharded checkpoint),
#: huggingface_hub's ``Fetching N files`` (snapshot_download), datasets' ``Map`` / ``Filter`` (with
#: `` (num_proc=N)``), ``Generating <split> split``, ``Resolving data files``, ``Downloading data``,
#: ``Loading dataset shards`` (arrow_dataset.py, builder.py, data_files.py): loading and preparing,
#: no training step done
_PREPARING = re.compile(rb"(?m)^[^\n]*?(?:Loading checkpoint shards|Fetching \d+ files|(?:Map|Filter)(?: \(num_proc=\d+\))?"
                        rb"|Generating \w+ split|Resolving data files|Downloading data(?: files)?|Loading dataset shards)"
                        rb":\s*\d+%\|[^\n]*")
UNKNOWN = float("-inf")     # ``progress_at`` when the start of the attempt was not seen
NONE_YET = float("inf")     # ``progress_at`` when the job has shown no progress this attempt


@dataclass(frozen=True)
class InitGrade:
    """A row of ``init_phase.tsv``: what ``rule``'s finding whose line matches ``message`` is when
    the job made no progress before it; also what a later finding of one of the ``explains`` rules
    on the same instance is (NCCL WARNs the call that failed, then returns the ncclSystemError that
    its caller reports: the WARN names the errno, the error decides)."""

    rule: str
    message: re.Pattern[str] | None
    explains: frozenset[str]
    failure_class: FailureClass
    action: Action
    source: str
    meaning: str


@functools.lru_cache(maxsize=1)
def table() -> dict[str, tuple[InitGrade, ...]]:
    """``rules/packs/init_phase.tsv`` by rule id (read once).

    Raises:
        ValueError: a row with a wrong column count, an unknown class or action, or a bad regex.
    """
    text = importlib.resources.files("ftwatch.rules").joinpath("packs").joinpath(_FILE).read_text(encoding="utf-8")
    rows: dict[str, list[InitGrade]] = {}
    lines = text.splitlines()
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != 7:
            raise ValueError(f"{_FILE}:{n}: {len(cols)} columns, 7 expected")
        rule, message, explains, cls, action, source, meaning = cols
        grade = InitGrade(rule, None if message == "-" else re.compile(message),
                          frozenset() if explains == "-" else frozenset(explains.split(",")),
                          FailureClass(cls), Action.parse(action), source, meaning)
        rows.setdefault(rule, []).append(grade)
    return {rule: tuple(grades) for rule, grades in rows.items()}


def at_init(f: Finding, progress_at: float, evidence: Iterable[Finding] = ()) -> InitGrade | None:
    """The ``init_phase.tsv`` row that grades ``f`` when the job made no progress before it
    (``progress_at`` not before ``f.time``): a row of ``f``'s rule whose message ``f``'s line
    matches, else one of a finding in ``evidence`` of ``f``'s instance, before ``f``, whose row
    ``explains`` ``f``'s rule (the latest first; first of all NCCL's last-error text that PyTorch
    prints right after the result code, ``lasterror.last_error_text``: NCCL's last WARN). None when the job made progress before ``f``,
    its start was not seen (``progress_at`` = :data:`UNKNOWN`) or no row applies."""
    if progress_at < f.time:
        return None
    rows = table()
    found = (_row(rows, f) or _own_address(f, evidence) or _shared(f, evidence) or _shared_interface(f, evidence)
             or _host_local_store(f) or _loopback(f, evidence) or _loopback_rendezvous(f, evidence)
             or _one_host(f, evidence))
    if found is not None:
        return found
    seen = sorted(evidence, key=lambda g: (g.time, g.seq))
    named = last_error_text(f, seen)        # NCCL's last WARN, printed by torch after the code it names
    before = ([named] if named is not None and named.rule_id in rows else []) + sorted(
        (g for g in seen if g.rule_id in rows and g.origin.instance == f.origin.instance
         and (g.time, g.seq) < (f.time, f.seq)), key=lambda g: (g.time, g.seq), reverse=True)
    for g in before:
        found = _row(rows, g) or _own_address(g, evidence)
        if found is not None and f.rule_id in found.explains:
            return found
    return None


#: NCCL's socket connect WARN (``nccl.socket_connect_failed``): the address it connected to
_CONNECT_TO = re.compile(r"[Cc]onnect to \[?([0-9A-Fa-f.:%\w-]+?)\]?<\d+>")
#: an interface of NCCL's ``NET/Socket : Using [0]bond0:10.0.0.2<0> [1]...`` line: its address
_LISTED = re.compile(r"\[\d+\][^\s:]+:(\S+?)<\d+>")
_OWN = InitGrade(
    "nccl.socket_connect_failed", None, frozenset({"nccl.unhandled_system_error", "nccl.code.system_error"}),
    FailureClass.USER_CODE, Action.FAIL_JOB,
    "NVIDIA/nccl src/transport/net_socket.cc (the 'NET/Socket : Using' line lists the interfaces this host "
    "uses); NCCL user guide, Troubleshooting > Networking issues > IP network interfaces ('If some interfaces "
    "are in the UP state but are not able to communicate between nodes, NCCL may try to use them and therefore "
    "fail during the init functions'; set NCCL_SOCKET_IFNAME)",
    "a connect to an address this host itself holds: the peer advertised an interface that is not between the "
    "hosts (a bridge or virtual interface each host has with the same address), so NCCL's interface choice "
    "(NCCL_SOCKET_IFNAME) is the job's configuration")


def _own_address(f: Finding, evidence: Iterable[Finding]) -> InitGrade | None:
    """:data:`_OWN` when ``f`` is NCCL's failed socket connect to an address that ``f``'s own
    instance listed, before ``f``, among its ``NET/Socket : Using`` interfaces: a peer that
    advertises an address the connecting host also holds advertised a host-local interface, which
    cannot carry traffic between the hosts. None otherwise (a connect to another host's address
    keeps its rule's grade: a refused or timed-out connect may pass)."""
    if f.rule_id != _OWN.rule:
        return None
    target = _CONNECT_TO.search(f.line)
    if target is None:
        return None
    own = {a for g in evidence if g.rule_id == "nccl.socket_interfaces_in_use"
           and g.origin.instance == f.origin.instance and (g.time, g.seq) < (f.time, f.seq)
           for a in _LISTED.findall(g.line)}
    return _OWN if target.group(1) in own else None


def _loopback(f: Finding, evidence: Iterable[Finding]) -> InitGrade | None:
    """user_code, fail_job when ``f`` is a failed connect to a loopback address in a job that spans
    hosts (:func:`ftwatch.policy.loopback.loopback_across_hosts`); None otherwise."""
    found = loopback_across_hosts(f, evidence)
    if found is None:
        return None
    return InitGrade(f.rule_id, None, frozenset(), FailureClass.USER_CODE, Action.FAIL_JOB, *found)


def _shared(f: Finding, evidence: Iterable[Finding]) -> InitGrade | None:
    """The grade of :func:`ftwatch.policy.sharedfailure.shared_failure` (user_code, fail_job) when
    ``f`` is a failure that many ranks made themselves at once; None otherwise."""
    found = shared_failure(f, evidence)
    if found is None:
        return None
    return InitGrade(f.rule_id, None, frozenset(), FailureClass.USER_CODE, Action.FAIL_JOB, found.source,
                     found.meaning)


def _one_host(f: Finding, evidence: Iterable[Finding]) -> InitGrade | None:
    """user_code, fail_job when ``f`` is NCCL's failed system call in a job whose processes all run on
    one host (:func:`ftwatch.policy.onehost.one_host`); None otherwise."""
    why = onehost.one_host(f, evidence)
    if why is None:
        return None
    return InitGrade(f.rule_id, None, frozenset(), FailureClass.USER_CODE, Action.FAIL_JOB, onehost.SOURCE, why)


#: the first interface of a ``NET/Socket : Using`` line, the one NCCL's sockets use first, or the one of
#: a ``Bootstrap : Using`` line (the same search, NCCL_SOCKET_IFNAME included: src/bootstrap.cc)
_FIRST = re.compile(r"Using (?:\[0\]|interface )?[^\s:\[]+:(\S+?)<\d+>")
#: the rules whose lines list the interfaces NCCL uses on a host (rules/packs/lifecycle.yaml)
_INTERFACE_LINES = frozenset({"nccl.socket_interfaces_in_use", "nccl.bootstrap_interface_in_use"})
_SHARED = InitGrade(
    "hang.job", None, frozenset(), FailureClass.USER_CODE, Action.FAIL_JOB,
    "NVIDIA/nccl src/transport/net_socket.cc ('NET/Socket : Using' lists the interfaces this host uses, the "
    "first one first), src/bootstrap.cc ('Bootstrap : Using', the interface of the same search its bootstrap uses) "
    "and src/debug.cc (the '<host>:<pid>:<tid>' prefix); NCCL user guide, Troubleshooting > "
    "Networking issues > IP network interfaces ('If some interfaces are in the UP state but are not able to "
    "communicate between nodes, NCCL may try to use them anyway and therefore fail during the init functions or "
    "even hang'; NCCL_SOCKET_IFNAME; docker* and lo are not chosen by default); Docker docs, Network drivers > "
    "Bridge ('Bridge networks apply to containers running on the same Docker daemon host'; docker0's default "
    "subnet 172.17.0.0/16)",
    "a job hang or NCCL network failure before any progress while NCCL on two different hosts uses the same "
    "address as its first interface, or each an address of Docker's default bridge (a bridge such as docker0, or lo, "
    "that each host holds alike): the ranks reach only themselves "
    "through it, so the interface choice (NCCL_SOCKET_IFNAME) is the job's configuration")


#: NCCL's failures of its network transport: the socket calls behind ``unhandled system error``
#: (ncclSystemError), a peer or the network gone (ncclRemoteError, a closed connection) and its
#: socket connect/call WARNs, as PyTorch raises them and NCCL writes them
NCCL_NETWORK_FAILURES = frozenset({
    "nccl.unhandled_system_error", "nccl.code.system_error", "nccl.remote_error", "nccl.code.remote_error",
    "nccl.connection_closed_by_remote_peer", "nccl.socket_connect_failed", "nccl.socket_call_failed"})


#: Docker's default bridge network (``docker0``): the daemon's default ``bip`` / first
#: ``default-address-pools`` entry. Each host's daemon holds its own: "Bridge networks apply to
#: containers running on the same Docker daemon host" (Docker docs, Network drivers > Bridge)
DOCKER_DEFAULT_BRIDGE = ipaddress.ip_network("172.17.0.0/16")


def _shared_interface(f: Finding, evidence: Iterable[Finding]) -> InitGrade | None:
    """:data:`_SHARED` when ``f`` is a job hang or one of NCCL's network failures
    (:data:`NCCL_NETWORK_FAILURES`: the guide's "fail during the init functions", the other half of
    "or even hang") and the interface lines in ``evidence`` (``NET/Socket : Using [0]...``; NCCL 2.4's
    ``NET : Using interface ...``, one line per interface; the bootstrap's ``Bootstrap : Using ...``,
    each kind of line read apart) show two different hosts (NCCL's
    ``<host>:`` prefix, else the finding's node) whose first address is host-local: the same address
    on both (no address is held by two hosts of one network unless it is host-local), or an address
    of Docker's default bridge (:data:`DOCKER_DEFAULT_BRIDGE`) on each: every host's daemon has its
    own, which carries no traffic to another host (Docker's bridge driver docs). None otherwise."""
    if f.kind != "hang" and f.rule_id not in NCCL_NETWORK_FAILURES:
        return None
    firsts: dict[tuple, tuple[str, str]] = {}   # (host, process, rule) -> (host, the first address: its earliest line)
    for g in sorted(evidence, key=lambda g: (g.time, g.seq)):
        if g.rule_id not in _INTERFACE_LINES or (first := _FIRST.search(g.line)) is None:
            continue
        named = NCCL_HOST.search(g.line)
        host = named.group(1) if named else g.origin.node
        if host and host != "unknown":
            process = (host, named.group(2) if named else g.origin.instance, g.rule_id)
            firsts.setdefault(process, (host, first.group(1)))
    hosts: dict[str, set[str]] = {}
    for host, address in firsts.values():
        hosts.setdefault(address, set()).add(host)
    bridged = {host for host, address in firsts.values() if _in_default_bridge(address)}
    if any(len(h) > 1 for h in hosts.values()) or len(bridged) > 1:
        return replace(_SHARED, rule=f.rule_id)
    return None


def _in_default_bridge(address: str, networks: tuple = (DOCKER_DEFAULT_BRIDGE,)) -> bool:
    """Says whether ``address`` (as NCCL or c10d print it, maybe with ``%scope``) is in Docker's
    default bridge (or in one of ``networks``); False for what is no address."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    return any(ip.version == net.version and ip in net for net in networks)


#: the c10d store client's connects that ran out of time (torch's socket.cpp ``The client socket has
#: timed out after Ns while trying to connect to (<host>, <port>)``, as ``DistNetworkError`` too, and
#: TCPStore's ``TCP client failed to connect/validate to host <host>:<port> - timed out``)
STORE_CONNECT_TIMEOUTS = frozenset({"torch.store_client_timeout", "torch.dist_network_error",
                                    "c10d.store_connect_timed_out"})
#: the address such a connect went to, an IPv4 one or one in the parenthesised form
_STORE_TARGET = re.compile(r"timed out.*?(?:connect to \(|to host )\[?([0-9A-Fa-f.:%]+?)\]?(?:, ?|:)\d+")
#: link-local networks: not forwarded off their link (RFC 3927 for 169.254/16, RFC 4291 2.5.6 for fe80::/10)
_LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
_HOST_LOCAL_STORE = InitGrade(
    "torch.store_client_timeout", None, frozenset(), FailureClass.USER_CODE, Action.FAIL_JOB,
    "PyTorch torch.distributed docs, init_process_group env:// (MASTER_ADDR: the address of rank 0, which every "
    "rank connects to); Docker docs, Network drivers > Bridge ('Bridge networks apply to containers running on "
    "the same Docker daemon host. For communication among containers running on different Docker daemon hosts, "
    "... use an overlay network'; the default bridge docker0 is 172.17.0.0/16 on every host); RFC 3927 and RFC "
    "4291 section 2.5.6 (link-local addresses are not forwarded off their link)",
    "before any progress, the rendezvous store's connect ran out of time on an address that leads nowhere from "
    "another host (a container's address on its own host's default Docker bridge, or a link-local one): the "
    "address the ranks were given (MASTER_ADDR, the network mode of the containers) is the launch's configuration, "
    "which a restart repeats")


def _host_local_store(f: Finding) -> InitGrade | None:
    """:data:`_HOST_LOCAL_STORE` when ``f`` is a store connect that timed out
    (:data:`STORE_CONNECT_TIMEOUTS`) to an address of Docker's default bridge
    (:data:`DOCKER_DEFAULT_BRIDGE`) or a link-local one: each host's daemon holds its own default
    bridge for its own containers, and a link-local address is not routed, so a rank that waited out
    its timeout for it was on another host; the connect to a routable address keeps its retryable
    grade (a master that starts late). None otherwise."""
    if f.rule_id not in STORE_CONNECT_TIMEOUTS or (target := _STORE_TARGET.search(f.line)) is None:
        return None
    if _in_default_bridge(target.group(1)) or _in_default_bridge(target.group(1), _LINK_LOCAL):
        return replace(_HOST_LOCAL_STORE, rule=f.rule_id)
    return None


def _loopback_rendezvous(f: Finding, evidence: Iterable[Finding]) -> InitGrade | None:
    """user_code, fail_job when ``f`` is a job hang or a store connect that timed out
    (:data:`STORE_CONNECT_TIMEOUTS`) and a node of rank 1 or more was told to rendezvous at a loopback
    address, or the ranks at different ports, or node rank 0 timed out on its own static store's address
    (``ftwatch.policy.rdzvconfig``), or every node timed out on the c10d endpoint one of them should serve
    (``ftwatch.policy.rdzvendpoint``); None otherwise."""
    if f.kind != "hang" and f.rule_id not in STORE_CONNECT_TIMEOUTS:
        return None
    why = loopback_rendezvous(f, evidence) or split_rendezvous(f, evidence)
    if why is None and (target := _STORE_TARGET.search(f.line)) is not None:
        why = own_store_unreachable(f, target.group(1), evidence)
    if why is None and (why := rdzvendpoint.every_node_unreachable(f, evidence)) is not None:
        return InitGrade(f.rule_id, None, frozenset(), FailureClass.USER_CODE, Action.FAIL_JOB, rdzvendpoint.SOURCE,
                         why)
    if why is None:
        return None
    return InitGrade(f.rule_id, None, frozenset(), FailureClass.USER_CODE, Action.FAIL_JOB, rdzvconfig.SOURCE, why)


def _row(rows: dict[str, tuple[InitGrade, ...]], f: Finding) -> InitGrade | None:
    for grade in rows.get(f.rule_id, ()):
        if grade.message is None or grade.message.search(f.line):
            return grade
    return None


class FirstProgress:
    """The time by which a job showed progress (see the module docstring): the time of its
    ``needed``-th progress line, counted across its streams in time order.

    Args:
        needed: progress lines of the job that show it trains (1: one ``step 1`` line is a step done).
        max_streams: streams counted at once (the least recently read forgotten first).

    Attributes:
        at: epoch seconds of the job's ``needed``-th progress line (the earliest ``needed`` of all
            read); :data:`NONE_YET` before that; :data:`UNKNOWN` when the attempt's start was not seen.
    """

    def __init__(self, needed: int = 1, max_streams: int = MAX_INSTANCES_PER_JOB):
        self.needed = needed
        self.at = NONE_YET
        self._times: list[float] = []           # the earliest ``needed`` progress times read, sorted
        self._seen: dict[object, int] = BoundedDict(max_streams)   # stream key -> its progress lines so far

    @property
    def progressed(self) -> frozenset[str]:
        """The instances that printed a progress line this attempt (each stream's own; read for
        ``ftwatch.policy.rankonly``: which instances log their training)."""
        return frozenset(getattr(k, "instance", str(k)) for k, n in self._seen.items() if n > 0)

    def reset(self, known: bool = True) -> None:
        """A new attempt: no progress yet (``known``), or not known (its start was not seen)."""
        self.at = NONE_YET if known else UNKNOWN
        self._times.clear()
        self._seen.clear()

    def wants(self, key: object) -> bool:
        """Whether a chunk of the stream ``key`` may still change :attr:`at` (O(1)): a stream's
        later lines are later in time, so past its ``needed``-th progress line it is read no more."""
        return self.at != UNKNOWN and self._seen.get(key, 0) < self.needed

    def read(self, key: object, data: bytes, time: float, sim_step: float, year: int | None) -> None:
        """Read a chunk of the stream ``key`` (``progress.marks``'s arguments). A line that starts
        with ``#`` is a header or comment (a benchmark's parameter line, ``iters: 20``), one whose
        counters are all 0 (``Epoch 0:   0%| 0/2300``, ``step 0``) shows no step done yet, and a
        bar of loading or preparing (:data:`_PREPARING`: ``Loading checkpoint shards: 100%|``)
        counts what was loaded, not a step."""
        if not self.wants(key) or not any(literal in data for literal in _LITERALS):
            return                              # (``bytes.find`` per literal: memchr-fast, no regex pass)
        if b"#" in data:
            data = _COMMENT.sub(b"", data)      # emptied, not removed: untimed lines keep their times
        if b"%|" in data:
            data = _PREPARING.sub(b"", data)    # the bars of loading and preparing, emptied alike
        seen = self._seen.get(key, 0)
        for _, at, counters in progress.marks(data, time, sim_step, year):
            if counters and not any(counters.values()):
                continue
            seen += 1
            self._times = sorted([*self._times, at])[:self.needed]
            if seen >= self.needed:
                break
        self._seen[key] = seen
        if len(self._times) >= self.needed:
            self.at = self._times[-1]
