"""Accelerator fault-code tables (SPEC R3): Ascend NPU codes, NVIDIA Xid, DCGM health codes.

The tables are data files shipped in ``ftwatch/rules/packs/`` and copied unchanged from the
research tables (``shared/data/fault-tables/``, see its README for every source and snapshot):

* ``npu_fault_codes.tsv``: ``code, level, meaning, recommended_action, source, category, module,
  fault_class, notes``. Levels are MindCluster's (Ascend/mind-cluster@22bb3d987b
  ``component/ascend-device-plugin/build/faultCode.json`` and friends).
* ``gpu_xid.tsv``: ``xid, meaning, recommended_action, source, ...,
  k8s_device_plugin_app_error, notes`` (NVIDIA Xid catalog, NVSentinel, gpud, k8s-device-plugin).
* ``dcgm_health.tsv``: ``dcgm_code, meaning, recommended_action, source, nvsentinel_action, notes``.

How a row becomes a verdict:

* NPU, by level: ``NotHandleFault`` (L1) and ``SubHealthFault`` -> none (MindCluster's default
  sub-health strategy is "ignore"); ``RestartRequest`` (L2) / ``RestartBusiness`` (L3) ->
  restart_in_place; ``FreeRestartNPU`` (L4) / ``RestartNPU`` (L5) -> restart_job;
  ``PreSeparateNPU`` / ``PreSeparateFault`` -> notify (the running job is left alone);
  ``SeparateNPU`` (L6), ``ManuallySeparateNPU``, ``SeparateFault``, ``SeparateDPU`` ->
  isolate_node. Other levels fall back to the row's ``recommended_action``.
  UB-switch ``RestartRequestFault`` / ``ResetFault`` -> isolate_node (the docs say for all three
  switch levels: stop the job, isolate the node, reschedule).
  Codes the fault-diag knowledge base tags ``User`` (80C98002, 80CB8002: bad input from the
  application; ModelArts, seed 002, names exactly these two as "由用户输入引发") are ``user_code``
  and are never isolated, whatever the level or a frequency rule says (SPEC R3).
  817F8002 / 814F8002 stay SeparateNPU -> isolate_node: their "bad input" meaning is only the
  table's own guess from the ``..8002`` suffix (README "Event-ID structure": "treat as a hint"),
  the knowledge base gives them no ``User`` class, the seed names only the two codes above, and
  MindCluster grades them L6; an input fault of a non-AI-core module is the chip's, not the app's.
  Network codes (81078603, 81078607, 110000002, 110001024) graded at a restart level are
  downgraded to NotHandleFault, as MindCluster does.
* Unknown NPU codes: graded by the driver's severity when the line names one, as MindCluster does
  (README "How codes are matched"): hint / minor -> NotHandleFault (none); anything else, or no
  severity -> SeparateNPU (isolate_node). See ``FaultTables.grade_unknown``.
* Xid and DCGM: the row's ``recommended_action``; Xids that NVIDIA's k8s-device-plugin treats
  as application errors (13, 31, 43, 45, 68) are ``user_code``.
* Failure class otherwise: ``info`` when the action is none, else ``hardware_node``.

Text extraction (``FaultTables.extract``) runs only on lines that one of ``FaultTables.PATTERNS``
hit, so its stdlib regexes never see the bulk of the log.

Size: over 400 lines, one job (the fault tables: load, extract a code from a line, grade it); the
three tables share the extraction and the grading rules for unknown codes.
"""

from __future__ import annotations

import importlib.resources
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

from ftwatch.errors import ConfigError, Issue
from ftwatch.events import Action, FailureClass
from ftwatch.rules.model import Pattern

_PACKAGE = "ftwatch.rules"  # the tables live in its packs/ folder
NPU_FILE, XID_FILE, DCGM_FILE = "npu_fault_codes.tsv", "gpu_xid.tsv", "dcgm_health.tsv"

# Level name (without the "(Ln)" alias) -> action; README of the fault tables, "Chip levels".
_NPU_LEVEL_ACTION: dict[str, Action] = {
    "NotHandleFault": Action.NONE,
    "SubHealthFault": Action.NONE,
    "RestartRequest": Action.RESTART_IN_PLACE,
    "RestartBusiness": Action.RESTART_IN_PLACE,
    "FreeRestartNPU": Action.RESTART_JOB,
    "RestartNPU": Action.RESTART_JOB,
    "PreSeparateNPU": Action.NOTIFY,
    "PreSeparateFault": Action.NOTIFY,
    "SeparateNPU": Action.ISOLATE_NODE,
    "ManuallySeparateNPU": Action.ISOLATE_NODE,
    "SeparateFault": Action.ISOLATE_NODE,
    "SeparateDPU": Action.ISOLATE_NODE,
    "RestartRequestFault": Action.ISOLATE_NODE,
    "ResetFault": Action.ISOLATE_NODE,
}

#: The only chip codes caused by the application's input (fault-diag ``class=User``; seed 002).
USER_INPUT_CODES = frozenset({"80C98002", "80CB8002"})
#: MindCluster's network fault codes (README "How codes are matched").
NETWORK_CODES = frozenset({"81078603", "81078607", "110000002", "110001024"})
_RESTART_LEVELS = frozenset({"RestartRequest", "RestartBusiness", "FreeRestartNPU", "RestartNPU"})
#: Driver severities (Ascend dsmi: 0 hint/提示, 1 minor/次要, 2 major/重要, 3 critical/紧急).
_SEVERITY_WORDS = {"0": "hint", "hint": "hint", "提示": "hint", "1": "minor", "minor": "minor", "次要": "minor",
                   "2": "major", "major": "major", "重要": "major", "3": "critical", "critical": "critical",
                   "紧急": "critical"}
#: A fault event's assertion (Ascend dsmi / device-plugin: 0 recover, 1 occur, 2 once) or the words.
_ASSERTION = re.compile(r"(?i)\bassertion\s*[:=]?\s*(recover\w*|occur\w*|once|[012](?![0-9]))"
                        r"|\b(recovered|recovery|resumed)\b")
_ASSERTION_WORDS = {"0": "recover", "1": "occur", "2": "once"}
#: Unknown codes are graded only when shaped like a chip event ID: 8 hex digits in the 0x80 / 0x81 /
#: 0x8C / 0x8F families that hold 683 of the table's 806 chip codes (the rest are product-specific).
_CHIP_EVENT = re.compile(r"^8[01CF][0-9A-F]{6}$")
#: Driver / fault-event wording (Ascend dsmi, the device plugin, npu-smi, "fault code", "event id"):
#: an unknown code in such a line is a chip event; "error code 0x80004005" in an application's
#: message (a Windows HRESULT, a CANN "E39999 ... error code is 80100001") is not.
_DRIVER_CONTEXT = re.compile(r"(?i)(?<![A-Za-z])(?:dsmi|device[ _-]?plugin|npu[ _-]?smi|hccn"
                             r"|fault[ _-]?(?:code|event|id)|event[ _-]?id|alarm[ _-]?(?:id|code))")
_SEVERITY = re.compile(r"(?i)\b(?:severity|alarm[ _-]?level|fault[ _-]?level)\s*[:=]?\s*"
                       r"(hint|minor|major|critical|[0-3](?![0-9])|提示|次要|重要|紧急)")


def level_name(level: str) -> str:
    """``SeparateNPU (L6)`` -> ``SeparateNPU``: a table level without its alias."""
    return level.split("(")[0].strip()

# --- extraction regexes (stdlib ``re``: they run on hit lines only) -------------------------------
_XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+)"
    r"(?:, pid=(?P<pid>'[^']*'|[^,\s]*))?(?:, name=(?P<name>[^,]*))?"
    r"(?:, (?P<message>.*))?")
#: NVIDIA k8s-device-plugin's health check (internal/rm/health.go) naming the Xid it marks a GPU
#: unhealthy for: ``XidCriticalError: Xid=63 on Device=GPU-<uuid>, the device will go unhealthy.``,
#: or ``XidCriticalError: Xid=79, All devices will go unhealthy.`` when the event names no GPU
_XID_PLUGIN = re.compile(r"\bXidCriticalError: Xid=(?P<xid>\d+)(?: on Device=(?P<uuid>[^,\s]+))?")
_DCGM = re.compile(r"\bDCGM_FR_[A-Z0-9_]+\b")
# A context word right before the code: "fault code", "error_code=", "errorcode:", "Event ID:",
# "alarm id", "fault [" ...; only separators may stand between it and the code (or the list).
_NPU_CONTEXT = re.compile(
    r"(?i)(?<![A-Za-z])(?:fault|error|err|event|alarm)(?:[ _-]?(?:code|id)s?)?(?:\s+is)?[\s:=#]*"
    r"[\[(]?\s*$")
_NPU_LIST_SEP = re.compile(r"^\s*(?:(?:0x)?[0-9A-Fa-f]{8,9}\s*[,;]\s*)+$")
_NPU_TOKEN = re.compile(r"(?<![0-9A-Za-z_])(0[xX])?([0-9A-Fa-f]{9}|[0-9A-Fa-f]{8})(?![0-9A-Za-z_])")
_CONTEXT_WINDOW = 160  # characters looked back from a code for its context word / list start


@dataclass(frozen=True, slots=True)
class FaultEntry:
    """One row of a fault table, graded for ftwatch.

    Attributes:
        kind: ``npu``, ``xid`` or ``dcgm``.
        code: the normalised code (``80E01801``, ``79``, ``DCGM_FR_VOLATILE_DBE_DETECTED``).
        level: the source's grade (MindCluster level, NVIDIA immediate bucket, NVSentinel action).
        meaning: a short paraphrase.
        action: what ftwatch recommends.
        failure_class: why.
        source: where the row comes from (repository@commit:file, URL).
    """

    kind: str
    code: str
    level: str
    meaning: str
    action: Action
    failure_class: FailureClass
    source: str


@dataclass(frozen=True, slots=True)
class FaultHit:
    """A fault code found in text.

    Attributes:
        kind: ``npu``, ``xid`` or ``dcgm``.
        code: the normalised code.
        entry: the table row, or None for a code the table does not know (the caller grades it).
        fields: what the line said besides the code (``xid``, ``pci``, ``pid`` ... or ``fault_code``).
        driver: the line reads like a driver / fault event (``_DRIVER_CONTEXT`` or a severity):
            only then is an unknown NPU code graded (``FaultTables.grade_unknown``).
    """

    kind: str
    code: str
    entry: FaultEntry | None
    fields: dict[str, Any] = field(default_factory=dict)
    driver: bool = True


def normalise_npu(code: str) -> str:
    """``0x80c98002`` -> ``80C98002``; switch codes ``[0x08520003,na,L2,na]`` keep their form.

    Args:
        code: a code as printed (hex with or without ``0x``, a 9-digit decimal, a switch tuple).
    """
    text = code.strip()
    if text.startswith("["):
        return re.sub(r"\s+", "", text).lower()
    if text[:2].lower() == "0x":
        text = text[2:]
    return text.upper()


def _read_tsv(name: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a packaged TSV (tab-separated, no quoting, one header row).

    Raises:
        ConfigError: a row with the wrong number of columns (file:line).
    """
    text = importlib.resources.files(_PACKAGE).joinpath("packs").joinpath(name).read_text(encoding="utf-8")
    lines = [line.rstrip("\r") for line in text.split("\n")]  # not splitlines(): \x1c etc. are data
    header = lines[0].split("\t")
    rows, issues = [], []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != len(header):
            issues.append(Issue(f"ftwatch/rules/packs/{name}", number,
                                f"expected {len(header)} columns, found {len(cols)}"))
            continue
        rows.append(cols)
    if issues:
        raise ConfigError(issues)
    return header, rows


#: NVIDIA's immediate bucket of the NVLink5 Xids (144-150) that are decoded by sub-code
_NVLINK_WORKFLOW = "WORKFLOW_NVLINK"
#: the severity word the driver prints after an NVLink5 Xid's sub-code (``145, RLW_SRC_TRACK Nonfatal XC1 ...``)
_NONFATAL = re.compile(r"^\S+ Non-?fatal\b", re.IGNORECASE)
_NVLINK_NONFATAL_SOURCE = (
    "; NVLink5 Xid marked Nonfatal by the driver: the fault-tables README (Xid 144-150 'must be decoded by "
    "sub-code; many sub-cases are IGNORE'), graded as a non-fatal NVSwitch SXid is (kernel_vocab.tsv "
    "gpu.sxid_nonfatal: worth watching, decides nothing); NVIDIA/NVSentinel#1357 (the maintainers treat a "
    "fatal verdict on an RLW Xid 145 the driver marks Nonfatal as a bug)")


def _nvlink_severity(entry: FaultEntry | None, message: str) -> FaultEntry | None:
    """An NVLink5 Xid (NVIDIA's bucket ``WORKFLOW_NVLINK5_ERR``) whose driver line says ``Nonfatal``
    after its sub-code: the hardware contained it and the link stays up, so it is a notice (action
    none, as a non-fatal SXid), not the table's isolation; ``Fatal`` or no word keeps the table's grade."""
    if entry is None or not entry.level.startswith(_NVLINK_WORKFLOW) or not _NONFATAL.match(message):
        return entry
    return FaultEntry(entry.kind, entry.code, f"{entry.level} (Nonfatal)", entry.meaning, Action.NONE,
                      FailureClass.INFO, entry.source + _NVLINK_NONFATAL_SOURCE)


def _class_for(action: Action, user: bool) -> FailureClass:
    if user:
        return FailureClass.USER_CODE
    return FailureClass.INFO if action is Action.NONE else FailureClass.HARDWARE_NODE


def _npu_action(level: str, recommended: str) -> Action:
    name = level.split("(")[0].strip()
    if name in _NPU_LEVEL_ACTION:
        return _NPU_LEVEL_ACTION[name]
    return Action.parse(recommended)


class FaultTables:
    """The three fault tables, indexed by code.

    Build it with ``FaultTables.load()`` (reads the packaged TSVs once per call).

    Attributes:
        PATTERNS: Hyperscan/RE2-compatible patterns that find candidate lines in a raw chunk
            (an Xid kernel line, a ``DCGM_FR_*`` name, an 8/9-digit code after a context word
            such as ``fault code``/``error_code=``/``Event ID:``); the engine adds them to its
            Matcher and calls ``extract`` on the lines they hit.
    """

    PATTERNS: ClassVar[tuple[Pattern, ...]] = (
        Pattern(r"NVRM: Xid \(", regex=True),
        Pattern(r"XidCriticalError: Xid=[0-9]", regex=True),
        Pattern(r"DCGM_FR_[A-Z0-9_]", regex=True),
        Pattern(r"(fault|error|err|event|alarm)([ _-]?(code|id)s?)?( is)?[ :=#\t]{0,4}[\[(]? ?"
                r"(0x)?[0-9a-f]{8}", regex=True, caseless=True),
    )

    def __init__(self, npu: dict[str, FaultEntry], xid: dict[int, FaultEntry],
                 dcgm: dict[str, FaultEntry]):
        self._npu, self._xid, self._dcgm = npu, xid, dcgm

    @classmethod
    def load(cls) -> "FaultTables":
        """Reads the packaged tables.

        Raises:
            ConfigError: a malformed row (file:line) or an unknown action name.
        """
        return cls(_load_npu(), _load_xid(), _load_dcgm())

    def __len__(self) -> int:
        return len(self._npu) + len(self._xid) + len(self._dcgm)

    def npu(self, code: str) -> FaultEntry | None:
        """The NPU row for ``code`` (``0x80e01801``, ``80E01801``, ``110001024``), or None."""
        return self._npu.get(normalise_npu(code))

    def xid(self, n: int) -> FaultEntry | None:
        """The Xid row for ``n`` (1..173 in the table), or None."""
        return self._xid.get(int(n))

    def dcgm(self, name: str) -> FaultEntry | None:
        """The DCGM row for a ``DCGM_FR_*`` name (case-insensitive), or None."""
        return self._dcgm.get(name.strip().upper())

    def grade_unknown(self, hit: FaultHit) -> FaultEntry | None:
        """The grade of an NPU code the table lacks, from the driver severity on its line.

        MindCluster (README "How codes are matched"): hint or minor -> NotHandleFault (none);
        anything else, including no severity -> SeparateNPU (isolate_node). Only codes shaped like
        a chip event ID (``8[01CF]xxxxxx``) on a driver / fault-event line (``FaultHit.driver``:
        dsmi / device-plugin wording, ``fault code``, ``event id``, or a severity) are graded;
        other unknown codes (``error code 0x80004005``), Xid and DCGM codes the tables lack give
        None (the caller notifies, class info: no incident).
        """
        if hit.kind != "npu" or hit.entry is not None:
            return hit.entry
        if not _CHIP_EVENT.match(hit.code):
            return None     # not shaped like a chip event ID: an error number of something else
        if not hit.driver:
            return None     # not a driver / fault-event line: an application's error number
        sev = hit.fields.get("severity")
        if sev in ("hint", "minor"):
            level, action = f"NotHandleFault (unknown code, severity {sev})", Action.NONE
        else:
            level = f"SeparateNPU (unknown code, severity {sev or 'not given'})"
            action = Action.ISOLATE_NODE
        return FaultEntry("npu", hit.code, level, "code not in the table; graded by driver severity", action,
                          _class_for(action, False), "MindCluster unknown-code grading (fault-tables README)")

    def extract(self, text: str) -> list[FaultHit]:
        """Finds every fault code in ``text`` (one line or several joined by ``\\n``).

        Xid kernel lines give ``fields`` ``xid``, ``pci`` and, when printed, ``pid``, ``name``,
        ``message``; NVIDIA k8s-device-plugin's ``XidCriticalError: Xid=N on Device=<uuid>`` gives ``xid``
        and ``uuid``; NPU codes give ``fault_code``; DCGM names give ``dcgm``. An NPU code is taken
        only after a context word (``fault``, ``error``, ``err``, ``event``, ``alarm``, optionally
        followed by ``code``/``id``), directly or inside a list that follows one, so hashes and
        addresses elsewhere on the line are left alone. Codes the tables lack come back with
        ``entry=None``.

        Returns:
            Hits in text order, each (kind, code) once.
        """
        hits: list[FaultHit] = []
        seen: set[tuple[str, str]] = set()
        for line in text.split("\n"):
            for hit in self._extract_line(line):
                if (hit.kind, hit.code) not in seen:
                    seen.add((hit.kind, hit.code))
                    hits.append(hit)
        return hits

    def _extract_line(self, line: str) -> Iterator[FaultHit]:
        xid_span = None
        m = _XID_LINE.search(line)
        if m:
            xid_span = m.span()
            n = int(m.group("xid"))
            fields: dict[str, Any] = {"xid": n, "pci": m.group("pci")}
            if m.group("pid") is not None:
                fields["pid"] = m.group("pid").strip("'")
            if m.group("name") is not None:
                fields["name"] = m.group("name").strip()
            if m.group("message"):
                fields["message"] = m.group("message").strip()
            yield FaultHit("xid", str(n), _nvlink_severity(self.xid(n), fields.get("message", "")), fields)
        p = _XID_PLUGIN.search(line) if m is None else None
        if p is not None:       # the device plugin's report of an Xid: the table grades it as the kernel line
            xid_span = p.span()
            n = int(p.group("xid"))
            yield FaultHit("xid", str(n), self.xid(n), {"xid": n, **({"uuid": p.group("uuid")} if p.group("uuid") else {})})
        for d in _DCGM.finditer(line):
            name = d.group(0)
            yield FaultHit("dcgm", name, self.dcgm(name), {"dcgm": name})
        sev = _SEVERITY.search(line)
        extra = {"severity": _SEVERITY_WORDS[sev.group(1).lower()]} if sev else {}
        asrt = _ASSERTION.search(line)
        if asrt:
            word = (asrt.group(1) or asrt.group(2)).lower()
            extra["assertion"] = _ASSERTION_WORDS.get(word, "recover" if word.startswith(("recover", "resum"))
                                                      else "occur" if word.startswith("occur") else "once")
        driver = sev is not None or bool(_DRIVER_CONTEXT.search(line))
        for code in _npu_codes(line, xid_span):
            yield FaultHit("npu", code, self.npu(code), {"fault_code": code, **extra}, driver)


def _npu_codes(line: str, skip: tuple[int, int] | None) -> Iterator[str]:
    """The NPU codes on one line that follow a context word (see ``FaultTables.extract``)."""
    for m in _NPU_TOKEN.finditer(line):
        if skip and skip[0] <= m.start() < skip[1]:
            continue
        digits = m.group(2)
        if len(digits) == 9 and not digits.isdigit():
            continue  # 9-digit codes are decimal (UB and public fault codes)
        if not m.group(1) and not any(c.isdigit() for c in digits):
            continue  # "deadbeef", "facefeed": words, not codes
        before = line[max(0, m.start() - _CONTEXT_WINDOW):m.start()]
        if _NPU_CONTEXT.search(before) or _in_list_after_context(before):
            yield normalise_npu(digits)


def _in_list_after_context(before: str) -> bool:
    """True when ``before`` ends inside a code list that a context word opened ("codes: [a, b, ")."""
    for opener in ("[", "("):
        cut = before.rfind(opener)
        if cut >= 0 and _NPU_LIST_SEP.match(before[cut + 1:]) and _NPU_CONTEXT.search(before[:cut + 1]):
            return True
    cut = before.rfind(":")
    if cut < 0:
        cut = before.rfind("=")
    return cut >= 0 and bool(_NPU_LIST_SEP.match(before[cut + 1:])) and bool(
        _NPU_CONTEXT.search(before[:cut + 1]))


def _load_npu() -> dict[str, FaultEntry]:
    _, rows = _read_tsv(NPU_FILE)
    out: dict[str, FaultEntry] = {}
    for code, level, meaning, recommended, source, _cat, _module, fault_class, _notes in rows:
        user = fault_class.strip() == "User"
        if normalise_npu(code) in NETWORK_CODES and level_name(level) in _RESTART_LEVELS:
            level = f"NotHandleFault (network code downgraded from {level_name(level)})"
        action = _npu_action(level, recommended)
        if user and action >= Action.ISOLATE_NODE:
            action = Action.RESTART_JOB  # R3: user-input codes reschedule, never isolate
        entry = FaultEntry("npu", normalise_npu(code), level, meaning, action,
                           _class_for(action, user), source)
        key = entry.code
        # A code listed under two levels (A2301001): the more serious level wins (README).
        if key not in out or entry.action > out[key].action:
            out[key] = entry
    return out


def _load_xid() -> dict[int, FaultEntry]:
    header, rows = _read_tsv(XID_FILE)
    col = {name: i for i, name in enumerate(header)}
    out: dict[int, FaultEntry] = {}
    for row in rows:
        n = int(row[col["xid"]])
        action = Action.parse(row[col["recommended_action"]])
        user = row[col["k8s_device_plugin_app_error"]].strip().lower() == "yes"
        out[n] = FaultEntry("xid", str(n), row[col["nvidia_immediate_action"]], row[col["meaning"]],
                            action, _class_for(action, user), row[col["source"]])
    return out


def _load_dcgm() -> dict[str, FaultEntry]:
    header, rows = _read_tsv(DCGM_FILE)
    col = {name: i for i, name in enumerate(header)}
    out: dict[str, FaultEntry] = {}
    for row in rows:
        name = row[col["dcgm_code"]].strip().upper()
        action = Action.parse(row[col["recommended_action"]])
        out[name] = FaultEntry("dcgm", name, row[col["nvsentinel_action"]], row[col["meaning"]],
                               action, _class_for(action, False), row[col["source"]])
    return out


def xid_groups() -> dict[str, frozenset[int]]:
    """Named sets of Xids for rule conditions (``xid in fatal``; ``ftwatch.rules.conditions``).

    From ``gpu_xid.tsv``: ``fatal`` / ``nonfatal`` by its ``nvsentinel_severity`` column
    (NVIDIA/NVSentinel ``xiderrorsmapping.csv``), ``app_error`` by ``k8s_device_plugin_app_error``
    (NVIDIA k8s-device-plugin's application-error Xids), ``app_cause`` those whose
    ``legacy_possible_causes`` (NVIDIA's Xid table, "User App Error" column) name the user
    application, ``app_or_gpu`` those NVIDIA's catalog answers with ``RESTART_APP`` first and an
    investigatory workflow of their own (``WORKFLOW_XID_13`` / ``_31``: check the application, then
    the GPU if the fault stays with it), ``known`` every row.
    """
    header, rows = _read_tsv(XID_FILE)
    col = {name: i for i, name in enumerate(header)}
    groups: dict[str, set[int]] = {"fatal": set(), "nonfatal": set(), "app_error": set(), "app_cause": set(),
                                   "app_or_gpu": set(), "known": set()}
    for row in rows:
        n = int(row[col["xid"]])
        groups["known"].add(n)
        severity = row[col["nvsentinel_severity"]].strip().upper()
        if severity == "FATAL":
            groups["fatal"].add(n)
        elif severity == "NONFATAL":
            groups["nonfatal"].add(n)
        if row[col["k8s_device_plugin_app_error"]].strip().lower() == "yes":
            groups["app_error"].add(n)
        if "user_app" in row[col["legacy_possible_causes"]].split(","):
            groups["app_cause"].add(n)
        if (row[col["nvidia_immediate_action"]].strip() == "RESTART_APP"
                and row[col["nvidia_investigatory_action"]].strip() == f"WORKFLOW_XID_{n}"):
            groups["app_or_gpu"].add(n)
    return {name: frozenset(values) for name, values in groups.items()}
