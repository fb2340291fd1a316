"""The platforms beyond Linux and CUDA (``platform_vocab.tsv``) and the command-line parsers'
refusals (``python.yaml``): Apple's MPS backend and Metal, Windows' fatal exceptions and NTSTATUS exit
statuses, zsh's report of the signal that ended a command, Intel XPU's allocator out-of-memory, argparse
subcommands, click/typer, tyro, fire.

Each is graded by its source: an MPS or Metal out-of-memory is oom; a Metal/MPS failed assertion and
an MPSGraph compile error are the program's or its stack's (fail); an access violation is a native
crash as a segmentation fault is; zsh's ``abort`` / ``segmentation fault`` / ``killed`` are the
exits of SIGABRT / SIGSEGV / SIGKILL (graded by the exit-code table as bash's words are)."""

from __future__ import annotations

import pytest

from ftwatch.events import Action, FailureClass
from ftwatch.policy.rootcause import NATIVE_CRASHES
from ftwatch.rules.exitcodes import reported_exit
from tests.rules.test_stacks_vocab import findings      # the built-in rules over lines of one stream


def _one(*lines: str):
    found = [f for f in findings(*lines) if f.failure_class != FailureClass.INFO]
    assert found, lines
    return max(found, key=lambda f: f.action)


@pytest.mark.parametrize("line, rule, failure_class", [
    ("RuntimeError: MPS backend out of memory (MPS allocated: 17.36 GB, other allocations: 613.56 MB, max allowed: "
     "18.13 GB). Tried to allocate 192.00 MB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable "
     "upper limit for memory allocations (may cause system failure).", "mps.backend_out_of_memory", FailureClass.OOM),
    ("\tInsufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)",
     "metal.command_buffer_out_of_memory", FailureClass.OOM),
    ("Insufficient Memory (00000008:kIOAccelCommandBufferCallbackErrorOutOfMemory)",
     "metal.command_buffer_out_of_memory", FailureClass.OOM),
    ("-[MTLDebugComputeCommandEncoder setBuffer:offset:atIndex:]:383: failed assertion `Set Buffer Validation "
     "index(31) must be < 31'", "metal.failed_assertion", FailureClass.USER_CODE),
    ("(mpsFileLoc): /AppleInternal/Library/BuildRoots/x/Library/Caches/com.apple.xbs/Sources/"
     "MetalPerformanceShadersGraph/mpsgraph/MetalPerformanceShadersGraph/Core/Files/MPSGraphUtilities.mm:294:0: "
     "error: 'mps.add' op operands don't have broadcast-compatible shapes", "mpsgraph.compile_error",
     FailureClass.USER_CODE),
    ("Windows fatal exception: stack overflow", "windows.fatal_exception", FailureClass.USER_CODE),
    ("torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with exit code 3221225477",
     "windows.crash_exit_status", FailureClass.USER_CODE),
    ("Process finished with exit code -1073740791 (0xC0000409)", "windows.crash_exit_status", FailureClass.USER_CODE),
    ("subprocess.CalledProcessError: Command '['python', 'train.py']' returned non-zero exit status 3221225781.",
     "windows.dll_not_found_exit_status", FailureClass.USER_CODE),
    ("train.py db: error: argument --lr: invalid float value: '3e'", "python.argparse_usage_error",
     FailureClass.USER_CODE),
    ("Error: No such option: --num-gpus Did you mean --num-devices?", "python.click_usage_error",
     FailureClass.USER_CODE),
    ("ERROR: Could not consume arg: --num_gpus", "python.fire_usage_error", FailureClass.USER_CODE),
    ("│ Unrecognized options: --machine.num-gpus                                      │", "python.tyro_usage_error",
     FailureClass.USER_CODE),
    ("RuntimeError: XPU out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.11 GiB total capacity; 12.50 GiB already "
     "allocated; 12.60 GiB reserved in total by PyTorch)", "xpu.out_of_memory", FailureClass.OOM),
])
def test_each_platform_line_is_graded_by_its_source(line, rule, failure_class):
    hit = [f for f in findings(line) if f.rule_id == rule]
    assert hit and (hit[0].failure_class, hit[0].action) == (failure_class, Action.FAIL_JOB)
    f = _one(line)          # a launcher's own exit rule may read the same line: the grade is the same
    assert (f.failure_class, f.action) == (failure_class, Action.FAIL_JOB)


@pytest.mark.parametrize("line", [
    "Windows fatal exception: code 0x8001010d",      # a first-chance COM exception a caller may handle
    "Windows fatal exception: page error",           # EXCEPTION_IN_PAGE_ERROR: an I/O failure, not the program's
    "Error: no such file or directory: data/train.json",
    "Process finished with exit code 0",
    "zsh: command not found: torchrun",
])
def test_lines_outside_the_sources_words_make_no_platform_finding(line):
    rules = {f.rule_id for f in findings(line)}
    assert not rules & {"windows.fatal_exception", "windows.crash_exit_status", "python.click_usage_error",
                        "shell.zsh_signal_report"}


@pytest.mark.parametrize("line, signal", [
    ("zsh: abort      python train.py --device mps", 6),
    ("zsh: segmentation fault  python train.py", 11),
    ("zsh: killed     python train.py", 9),
    ("zsh: illegal hardware instruction  python -c 'import tensorflow'", 4),
])
def test_zsh_reports_the_signal_in_its_own_words(line, signal):
    assert reported_exit(line, "shell.zsh_signal_report")[1] == signal


def test_a_zsh_crash_report_is_graded_as_the_signals_exit():
    segv = _one("zsh: segmentation fault  python train.py")
    assert (segv.kind, segv.fields["signal"], segv.failure_class, segv.action) == (
        "exit_code", 11, FailureClass.USER_CODE, Action.FAIL_JOB)
    killed = _one("zsh: killed     python train.py")
    assert (killed.fields["signal"], killed.action) == (9, Action.RESTART_JOB)


def test_a_metal_assertion_explains_the_abort_zsh_reports_after_it():
    """The assertion (priority 10) outranks the weak exit report (priority 1) of the same process."""
    f = _one("/System/Volumes/Data/SWE/macOS/BuildRoots/x/Library/Caches/com.apple.xbs/Sources/MetalPerformanceShaders/"
             "MPSCore/Types/MPSNDArray.mm:782: failed assertion `[MPSNDArray, initWithBuffer:descriptor:] Error: "
             "buffer is not large enough. Must be 1024 bytes'",
             "zsh: abort      python run.py")
    assert (f.rule_id, f.action) == ("metal.failed_assertion", Action.FAIL_JOB)


def test_an_access_violation_is_a_native_crash_for_rootcause_rule_11():
    assert "windows.fatal_exception" in NATIVE_CRASHES
