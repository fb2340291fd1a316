"""Graded knowledge catalogs -> generated rule packs (issue 12 item 2; used by ``build_packs.py``).

A catalog is a TSV file in ``ftwatch/rules/packs/`` (tab-separated, one header row, no quoting),
one fact per row with its ``source``; the grade of each row comes from what that source says.
``build_packs.py`` turns every catalog into a YAML pack next to it (the engine loads only YAML).

Two shapes:

* ``cuda_errors.tsv``: the CUDA runtime error enum: ``enum, number, message, sticky, grade,
  covered_by, source, meaning``. ``message`` is ``cudaGetErrorString``'s text; ``grade`` is one
  of ``GRADES`` (which says the class, action and priority and why). Each row becomes one rule
  ``cuda.rt.<name>`` matching the message as PyTorch (``CUDA error: ``, ``CUDA driver error: ``),
  NCCL (``Cuda failure 999 'unknown error'``) and old THC (``cuda runtime error (30) : ``) print
  it, and the enum name itself. ``covered_by`` names an older rule that matches the same
  ``CUDA error:`` text; it keeps its id and must carry the same grade (tests/rules/test_catalogs.py).
  ``driver_enum`` (may be empty) is the Driver API's ``CUresult`` name of the same error
  (``CUDA_ERROR_CONTAINED``), which JAX/XLA and the driver API print instead of the runtime's.
* the vocabularies (``nccl_vocab.tsv``, ``dist_vocab.tsv``, ``kernel_vocab.tsv``,
  ``net_vocab.tsv``, ``env_vocab.tsv``, ``kill_vocab.tsv``, ``cudalib_vocab.tsv``,
  ``stacks_vocab.tsv``): ``id, regex, class, action, priority, source, meaning, example,
  counterexample``. A row whose regex is ``-``
  records the grade of a rule that already lives in another pack (its id stays there); the
  tests check that rule carries that grade.

Output is deterministic (``build_packs.py --check`` compares bytes).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Sequence

CUDA_COLUMNS = ["enum", "number", "message", "sticky", "grade", "covered_by", "source", "meaning",
                "driver_enum"]
VOCAB_COLUMNS = ["id", "regex", "class", "action", "priority", "source", "meaning", "example",
                 "counterexample"]
EXISTING = "-"
"""A vocabulary row's regex when the rule already exists in another pack."""

GRADES: dict[str, tuple[str, str, int, str]] = {
    "device": ("hardware_node", "isolate_node", 30,
               "the source names the device, its memory/links or the node's driver state, nothing the program did"),
    "sticky_program": ("user_code", "fail_job", 10,
                       "sticky (the process must be relaunched) and the source names a fault of the kernel's code"),
    "sticky_ambiguous": ("user_code", "restart_in_place", 10,
                         "sticky and the source names program faults first, system-specific causes second: "
                         "relaunch the process once (the source says it must be), fail if it repeats"),
    "ambiguous": ("user_code", "restart_in_place", 10,
                  "the source names no single cause: relaunch the process once"),
    "usage": ("user_code", "fail_job", 10, "an invalid call, argument or build: a retry repeats it"),
    "setup": ("user_code", "fail_job", 10,
              "the software stack does not fit the driver or device (versions, stubs): a retry repeats it"),
    "oom": ("oom", "fail_job", 25, "out of device memory: needs a smaller batch or more parallelism"),
    "hang": ("hang", "restart_job", 10, "a kernel ran past its time limit"),
    "transient": ("retryable_infra", "restart_job", 10, "a service the runtime talks to (MPS) was not available"),
    "status": ("info", "none", -20, "not an error: a status or shutdown notice"),
}
"""grade -> (class, action, priority, why)."""

CATALOGS: dict[str, tuple[str, str]] = {
    "cuda_errors.tsv": ("cuda_runtime.yaml", "CUDA runtime error enum (cudaError_t), graded"),
    "nccl_vocab.tsv": ("nccl_vocab.yaml", "NCCL result codes and WARN vocabulary (IB events and completions, verbs, bootstrap), graded"),
    "dist_vocab.tsv": ("dist_vocab.yaml", "c10d store and ProcessGroupNCCL watchdog lines, torchelastic, graded"),
    "net_vocab.tsv": ("net_vocab.yaml", "transfer-library network errors: libcurl codes 7/28/55/56, "
                      "the AWS SDK's retryable 'Unable to connect to endpoint', a Hub file (hf://) that fails to open, wandb.init's time-out, graded"),
    "env_vocab.tsv": ("env_vocab.yaml", "configuration and environment errors against transient infrastructure: gloo "
                      "interface, c10d lookup/connect notices, DNS, HDF5/netCDF files, Kubernetes images, "
                      "ConfigMaps/Secrets and mounts, the NVIDIA container toolkit, Slurm request and controller "
                      "errors, container start-up errors, ld.so's missing shared library, graded"),
    "kernel_vocab.tsv": ("kernel_vocab.yaml", "kernel and driver lines: NVSwitch SXid, Xid 154, NVML/NVRM (and pynvml's GPU-state exceptions), GPUs missing from their node (Slurm's GRES count below the configured one, lspci's rev ff), mlx5 port and health, a bond with no active member, EDAC, MCE, PCIe AER, GHES, NFS/Lustre, OOM killer and reaper, graded"),
    "kill_vocab.tsv": ("kill_vocab.yaml", "who killed a process: shells' and Python's reports of a SIGKILL, "
                       "the memory enforcers that kill (Slurm's jobacct_gather, systemd-oomd, the kubelet's "
                       "SystemOOM event, Ray's memory monitor), and allocation failures that end a process "
                       "(TensorFlow's OOM, std::bad_alloc), and the allocator's 1 EB size guard (no shortage), graded"),
    "stacks_vocab.tsv": ("stacks_vocab.yaml", "the stacks beyond torch+NCCL: XLA/JAX status codes (the gRPC "
                         "code set, each graded by gRPC's definition), the JAX coordination service's fatal-error "
                         "and heartbeat lines (fallout), Ray's lost nodes (retryable), memory-monitor kills (oom), "
                         "actor/worker deaths and a lost GCS (fallout), vLLM's engine-dead and worker-died "
                         "reports (fallout), graded"),
    "platform_vocab.tsv": ("platform_vocab.yaml", "the platforms beyond Linux and CUDA: Apple's MPS backend of "
                           "PyTorch and Metal (the MPS allocator's and a command buffer's out-of-memory: oom; a "
                           "failed assertion of Metal/MPS and an MPSGraph compile error: the program's or its "
                           "stack's), Windows' fatal exceptions as Python's faulthandler prints them (a native "
                           "crash, as a segmentation fault) and NTSTATUS exit statuses, zsh's report of the signal that "
                           "ended a command, Intel XPU's allocator out-of-memory, graded"),
    "rocm_vocab.tsv": ("rocm_vocab.yaml", "the AMD GPU runtimes: HIP's hipError_t texts as PyTorch on ROCm prints "
                       "them ('HIP error: ...', each graded as the CUDA error of the same name), the HSA runtime's "
                       "(ROCr) GPU memory-access faults by reason, its HW exceptions (ECC, GPU hang) and the "
                       "hsa_status_t strings a queue aborts with, graded"),
    "cudalib_vocab.tsv": ("cudalib_vocab.yaml", "CUDA math-library status codes (cublasStatus_t, cudnnStatus_t "
                          "with cuDNN 9's sub-codes, cufftResult, cusolverStatus_t, cusparseStatus_t, curandStatus_t), "
                          "graded as the CUDA runtime enum is (allocation failures oom, usage and setup "
                          "user_code, launch/internal failures ambiguous), and a kernel's failed device-side "
                          "assert() as the CUDA runtime prints it (user_code, as cudaErrorAssert)"),
}
"""catalog file -> (generated pack, title)."""

HEADER = """\
# ftwatch built-in keyword pack: {title}.
#
# GENERATED by tools/build_packs.py (tools/catalogs.py) from ftwatch/rules/packs/{catalog}: one
# fact per row with its source, graded by what that source says. Edit the catalog, then run
#     python tools/build_packs.py
# Rule schema: ftwatch/rules/packs/README.md.
"""
_REGEX_SPECIALS = set("\\.^$|?*+()[]{}")


def read_tsv(path: Path, columns: list[str]) -> list[dict[str, str]]:
    """Rows of a catalog as dicts.

    Raises:
        ValueError: a bad header or a row with the wrong number of columns (``file:line``).
    """
    lines = path.read_text(encoding="utf-8").split("\n")
    header = lines[0].rstrip("\r").split("\t")
    if header == columns + ["tags"]:        # optional: extra rule tags, comma-separated (e.g. cascade)
        columns = header
    elif header != columns:
        raise ValueError(f"{path}:1: expected header {columns} (and optionally tags)")
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cols = line.rstrip("\r").split("\t")
        if len(cols) != len(columns):
            raise ValueError(f"{path}:{number}: expected {len(columns)} columns, found {len(cols)}")
        rows.append(dict(zip(columns, cols)))
    return rows


def escape(text: str) -> str:
    """``text`` as a regex literal in the RE2/Hyperscan subset (only the specials escaped)."""
    return "".join("\\" + c if c in _REGEX_SPECIALS else c for c in text)


def snake(enum: str) -> str:
    """``cudaErrorECCUncorrectable`` -> ``ecc_uncorrectable``."""
    name = enum.removeprefix("cudaError")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def cuda_regex(row: dict[str, str]) -> str:
    """The message after PyTorch's, NCCL's or THC's prefix, or the enum name alone.

    PyTorch's prefixes: ``CUDA error: `` (C10_CUDA_CHECK), ``CUDA driver error: ``, and the device
    count's ``Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before
    calling NumCudaDevices() that might have already set an error? Error <N>: <message>``
    (c10/cuda/CUDAFunctions.cpp ``device_count_impl``; also the ``CUDA initialization:`` UserWarning).
    CUDA programs of their own print ``cudaGetErrorString`` the same way: darknet's ``check_error``
    (``CUDA Error: %s``, ``CUDA Error Prev: %s``, AlexeyAB/darknet and pjreddie/darknet
    ``src/dark_cuda.c`` / ``src/cuda.c``) and the error-check macro most CUDA code copies
    (``GPUassert: %s %s %d``, the canonical answer to "What is the canonical way to check for errors
    using the CUDA runtime API?", Stack Overflow 14038589). darknet's form is read only at the start of
    a line (darknet is one process that prints it bare): behind another program's prefix the same
    words are that program's, read by its own rule (vLLM's ``CUDA Error: out of memory at ...
    cumem_allocator.cpp``, ``vllm.cumem_cuda_oom``).

    The older stacks' check macros print the same text after a location or a check: NCCL's own
    examples and the programs that copy them (NCCL User Guide "Examples", ``CUDACHECK``:
    ``Failed: Cuda error %s:%d '%s'``; Bluefog ``common.h``), nccl-tests ``common.h`` (``%s: Test CUDA
    failure %s:%d '%s'``), the ``cudaCheckError`` idiom (``Cuda failure %s:%d: '%s'``); MXNet's and
    mshadow's ``CUDA_CALL`` (``CHECK(e == cudaSuccess ...) << "CUDA: " << cudaGetErrorString(e)``,
    also awslabs/raf ``src/common/cuda.h``); Caffe's ``CUDA_CHECK`` (``CHECK_EQ(error, cudaSuccess)
    << " " << cudaGetErrorString(error)``: glog prints ``Check failed: error == cudaSuccess (77 vs. 0)
    `` before it). The text is the runtime's, so the error's grade is the one the enum gives,
    whatever program checked it. HugeCTR's ``CK_CUDA_THROW_`` (NVIDIA-Merlin/HugeCTR
    ``HugeCTR/include/common.hpp``; also its Triton backend) throws ``"Runtime error: " +
    cudaGetErrorString(retval) + " " + __FILE__ + ":" + __LINE__``, which its logger prints after
    ``[HUGECTR][ERROR]: ``: read only with that location after the text, so another program's
    ``Runtime error: <words>`` is not taken for a CUDA error. Marian's ``CUDA_CHECK``
    (marian-nmt/marian-dev ``src/tensors/gpu/cuda_helpers.h``: ``ABORT_IF(rc != cudaSuccess, "CUDA
    error {} '{}' - {}:{}: {}", rc, cudaGetErrorString(rc), ...)``, which its logger prints after
    ``Error: ``) puts the number before the quoted text: ``CUDA error 700 '<text>' - file:line:
    <expr>``, read only with that location after it (NCCL's own ``CUDA error 999 'unknown error'.``
    inside its WARN lines is NCCL's, read by its rules). Isaac Gym's simulation plugin (a binary
    release, no public source) logs a failed CUDA call as ``[Error] [carb.gym.plugin] Gym cuda
    error: <cudaGetErrorString text>: <its source file>: <line>``, the runtime's text unchanged
    (as printed in leggedrobotics/legged_gym#42 ``invalid resource handle``, isaac-sim/IsaacGymEnvs#33
    ``no kernel image is available for execution on the device``, chengxuxin/extreme-parkour#37 ``an
    illegal memory access was encountered``): read only after the plugin's tag, and graded by the
    enum like every other print of it. The plugin logs the error and the simulation may go on
    (IsaacGymEnvs#33 trained on to its last epoch): a run that outlived it is a notice, as for any
    error (``ftwatch.pipeline.notices``).

    A row ``covered_by`` an older rule leaves PyTorch's ``CUDA error: `` form to that rule, so
    one line never has two equal winners."""
    torch = "" if row["covered_by"] else "CUDA error: |"
    prefix = (rf"({torch}CUDA driver error: |Cuda failure (-?\d+ )?'|cuda runtime error \(\d+\) : "
              r"|might have already set an error\? Error \d+: |^ ?CUDA Error( Prev)?: |GPUassert: "
              r"|(Cuda|CUDA) (error|failure|Failure) [^\s:']+:\d+:? '|\bCUDA: |== cudaSuccess \(\d+ vs\. 0\) +"
              r"|\[carb\.gym\.plugin\] Gym cuda error: )")
    driver = f"|\\b{row['driver_enum']}\\b" if row.get("driver_enum") else ""
    hugectr = rf"|\bRuntime error: {escape(row['message'])} [^\s:]+:\d+"
    marian = rf"|\bCUDA error \d+ '{escape(row['message'])}' - [^\s:]+:\d+: "
    return f"{prefix}{escape(row['message'])}{hugectr}{marian}|\\b{row['enum']}\\b{driver}"


def cuda_keywords(row: dict[str, str]) -> list[str]:
    """What every form :func:`cuda_regex` reads holds: the message, the enum's name, the driver
    API's (a line without one of them cannot match it)."""
    return list(dict.fromkeys(k for k in (row["message"], row["enum"], row.get("driver_enum")) if k))


def cuda_condition(row: dict[str, str], longer: Sequence[str] = ()) -> str:
    """The rule's ``when:``: :func:`cuda_regex` on a line that holds one of :func:`cuda_keywords`,
    and none of ``longer``: the catalog's messages that begin with this row's and say more
    (``operation not permitted`` / ``operation not permitted when stream is capturing``, 800 and
    900; ``unspecified launch failure`` / ``... in prior launch``): a line that prints the longer
    message is that error, not the shorter one its first words spell (recorded on an H200, a
    synchronising call inside a CUDA graph capture: tests/golden/gpu_graph_capture).

    Why not the regex as the rule's pattern: Hyperscan compiled the 131 rules' regexes (each its
    own copy of the dozen prefixes, with digit runs, word boundaries and an anchored form) in ~4 s, twice on a start with
    an empty cache (the rule file's check, then the engine's database): ~7 of the 11 s the default
    engine took to build. As keywords (literals: ~0.01 s for all) with the regex confirmed by RE2
    on the lines they hit, the rule reads the same lines (``ftwatch.rules.conditions``: a
    condition's regex matches the raw line as a rule pattern does; every alternative of the regex
    holds one of the keywords)."""
    when = 'regex "' + cuda_regex(row).replace('"', '""') + '"'
    return when + "".join(f' and not keyword "{m.replace(chr(34), chr(34) * 2)}"' for m in longer)


def longer_messages(rows: Sequence[dict[str, str]]) -> dict[str, list[str]]:
    """Each row's enum -> the messages of the other rows that begin with its message and a space
    (:func:`cuda_condition`)."""
    return {r["enum"]: [o["message"] for o in rows if o is not r and r["message"]
                        and o["message"].startswith(r["message"] + " ")] for r in rows}


def cuda_rule(row: dict[str, str], severity_for: Callable[[str, str], str],
              longer: Sequence[str] = ()) -> dict:
    """One rule from a ``cuda_errors.tsv`` row (class, action, priority from its grade); ``longer``:
    the catalog's messages that extend the row's (:func:`longer_messages`)."""
    failure_class, action, priority, why = GRADES[row["grade"]]
    msg, enum, number = row["message"], row["enum"], row["number"]
    notes = f"grade {row['grade']}: {why}. sticky: {row['sticky']}."
    first = f"[rank0]: RuntimeError: CUDA error: {msg}"
    counter = [f"[rank0]: RuntimeError: {msg}", f"TF_CUDA: {msg}", f"Runtime error: {msg} (no location)",
               f"[Error] [carb.gym.plugin] Failed to fill rigid body state tensor ({msg})"]
    if row["covered_by"]:
        notes += f" PyTorch's 'CUDA error: {msg}' is {row['covered_by']}'s (same grade, its id stays)."
        first = f"[rank0]: RuntimeError: CUDA driver error: {msg}"
        counter.append(f"[rank0]: RuntimeError: CUDA error: {msg}")
    counter += [f"[rank0]: RuntimeError: CUDA error: {m}" for m in longer]    # the longer error's
    driver = row.get("driver_enum", "")
    examples = [first,
                f"gpu-node-3:2111:2190 [1] transport/nvls.cc:223 NCCL WARN Cuda failure {number} '{msg}'",
                f"RuntimeError: cuda failure: {enum}: {msg}",
                f" CUDA Error: {msg}", f"GPUassert: {msg} kernels.cu 118",
                f"[1,2]<stdout>:Failed: Cuda error /tmp/build/bluefog/common/nccl_controller.cc:247 '{msg}'",
                f"h100-r07-n3: Test CUDA failure common.cu:1007 '{msg}'",
                f"[18:02:11] src/storage/storage.cc:78: Check failed: e == cudaSuccess: CUDA: {msg}",
                f"F0312 10:01:55.123 syncedmem.cpp:71] Check failed: error == cudaSuccess (2 vs. 0)  {msg}",
                f"[13d08h12m43s][HUGECTR][ERROR]: Runtime error: {msg} /hugectr/HugeCTR/src/data_readers/reader.cu:212 ",
                f"[2019-02-17 09:52:17] Error: CUDA error {number} '{msg}' - /marian/src/tensors/gpu/device.cu:32: cudaMalloc(&data_, size)",
                f"[Error] [carb.gym.plugin] Gym cuda error: {msg}: ../../../source/plugins/carb/gym/impl/Gym/GymPhysX.cpp: 1459",
                "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
                f"calling NumCudaDevices() that might have already set an error? Error {number}: {msg}"]
    if driver:
        examples.append(f"jax.errors.JaxRuntimeError: INTERNAL: CUDA error: : {driver}: {msg}")
        counter.append(f"E0905 17:34:36.549112 allocator.cc:414] {driver}_X: not the enum")
    return {
        "id": f"cuda.rt.{snake(enum)}", "keywords": cuda_keywords(row), "when": cuda_condition(row, longer),
        "caseless": False,
        "class": failure_class, "action": action, "severity": severity_for(action, failure_class),
        "priority": priority, "tags": ["cuda", "cuda_errors", row["grade"]],
        "source": row["source"], "classified_by": "graded from the source (ftwatch/rules/packs/cuda_errors.tsv)",
        "description": f"{enum} ({number}): {row['meaning']}", "notes": notes,
        "examples": examples,
        "counterexamples": counter,
    }


def vocab_rule(row: dict[str, str], catalog: str, severity_for: Callable[[str, str], str]) -> dict:
    """One rule from a vocabulary row (its regex is not ``-``)."""
    return {
        "id": row["id"], "regex": [row["regex"]], "caseless": False,
        "class": row["class"], "action": row["action"],
        "severity": severity_for(row["action"], row["class"]), "priority": int(row["priority"]),
        "tags": [catalog.removesuffix(".tsv")] + [tag for tag in row.get("tags", "").split(",") if tag],
        "source": row["source"],
        "classified_by": f"graded from the source (ftwatch/rules/packs/{catalog})",
        "description": row["meaning"],
        **({"notes": "fallout (SPEC R7): the cause is on another rank; " + row["meaning"]}
           if row["class"] == "fallout" else {}),
        "examples": [row["example"]], "counterexamples": [row["counterexample"]],
    }


def build(folder: Path, render_rules: Callable[[list[dict]], str],
          severity_for: Callable[[str, str], str]) -> dict[str, str]:
    """Generated pack name -> text, for every catalog in ``folder``.

    Args:
        folder: where the catalogs are (``ftwatch/rules/packs``).
        render_rules: ``build_packs.render_rules`` (the ``rules:`` list as YAML text).
        severity_for: ``build_packs.severity_for``.
    """
    files = {}
    for catalog, (pack, title) in CATALOGS.items():
        path = folder / catalog
        if catalog == "cuda_errors.tsv":
            rows = read_tsv(path, CUDA_COLUMNS)
            longer = longer_messages(rows)
            rules = [cuda_rule(r, severity_for, longer[r["enum"]]) for r in rows]
        else:
            rules = [vocab_rule(r, catalog, severity_for) for r in read_tsv(path, VOCAB_COLUMNS)
                     if r["regex"] != EXISTING]
        files[pack] = HEADER.format(title=title, catalog=catalog) + "\n" + render_rules(rules)
    return files
