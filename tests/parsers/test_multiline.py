"""Where a Python traceback or a C++ stack dump ends (SPEC P1)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftwatch.parsers.fields import clean, split_rank_prefix
from ftwatch.parsers import multiline
from ftwatch.parsers.multiline import BLOCK_START_REGEXES, BlockEnd, block_end, is_block_start
from ftwatch.rules.engine import BLOCK_START_PATTERNS
from ftwatch.rules.matcher import Matcher

KEYERROR = """\
Traceback (most recent call last):
  File "/workspace/train.py", line 88, in <module>
    main()
  File "/workspace/train.py", line 61, in main
    lr = cfg["lr"]
         ~~~^^^^^^
KeyError: 'lr'""".splitlines()

NCCL = """\
Traceback (most recent call last):
  File "/workspace/train.py", line 120, in <module>
    dist.all_reduce(loss)
  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/c10d_logger.py", line 83, in wrapper
    return func(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^^^^
  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/distributed_c10d.py", line 2501, in all_reduce
    work = group.allreduce([tensor], opts)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, \
unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5
ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.
Last error:
socketStartConnect: Connect to 10.0.0.2<35261> failed : Software caused connection abort""".splitlines()

GLOO_CHAIN = """\
Traceback (most recent call last):
  File "/workspace/train.py", line 40, in step
    dist.barrier()
RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/workspace/train.py", line 95, in <module>
    step()
  File "/workspace/train.py", line 43, in step
    raise TrainingAborted("peer lost") from None
TrainingAborted: peer lost
[2026-11-21 09:36:05] next log line""".splitlines()

DIRECT_CAUSE = """\
Traceback (most recent call last):
  File "x.py", line 1, in <module>
ValueError: bad shape

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "x.py", line 3, in <module>
RuntimeError: wrapped
step 3""".splitlines()

RECURSION = """\
Traceback (most recent call last):
  File "r.py", line 2, in f
    return f()
           ^^^
  [Previous line repeated 996 more times]
RecursionError: maximum recursion depth exceeded""".splitlines()

WATCHDOG = """\
terminate called after throwing an instance of 'c10::DistBackendError'
  what():  [PG ID 0 PG GUID 0(default_pg) Rank 3] Process group watchdog thread terminated with exception: \
[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, \
NumelOut=1, Timeout(ms)=600000) ran for 600010 milliseconds before timing out.
Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:565 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57 (0x7f5c1e5b9897 in /usr/local/lib/python3.10/dist-packages/torch/lib/libc10.so)
frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, 1000l> > >) + 0x1d2 (0x7f5c1f892c62 in /usr/local/lib/python3.10/dist-packages/torch/lib/libtorch_cuda.so)
frame #2: <unknown function> + 0xdc253 (0x7f5c6b4b0253 in /lib/x86_64-linux-gnu/libstdc++.so.6)
frame #3: clone + 0x44 (0x7f5c6b5dd7f4 in /lib/x86_64-linux-gnu/libc.so.6)

Fatal Python error: Aborted""".splitlines()


def test_python_traceback_ends_at_the_exception_line():
    assert block_end(KEYERROR + ["next line"], 0) == 6
    assert block_end(RECURSION + ["x"], 0) == 5


def test_exception_message_continuation_lines_are_not_joined():
    assert NCCL[9].startswith("torch.distributed.DistBackendError:")
    assert block_end(NCCL, 0) == 9


def test_traceback_not_at_index_zero():
    lines = ["step 10 loss 2.3", "2026-11-21 09:36:03,123 ERROR Traceback (most recent call last):"] + KEYERROR[1:]
    assert block_end(lines, 1) == 7


def test_chained_exceptions_are_one_block():
    assert block_end(GLOO_CHAIN, 0) == 12
    assert block_end(DIRECT_CAUSE, 0) == 8


def test_open_blocks_give_none():
    assert block_end(KEYERROR[:4], 0) is None  # still in the frames
    assert block_end(KEYERROR[:1], 0) is None
    assert block_end(GLOO_CHAIN[:5], 0) is None  # exception line, empty line: a chain may follow
    assert block_end(GLOO_CHAIN[:6], 0) is None  # chain message, separator not complete
    assert block_end(GLOO_CHAIN[:7], 0) is None
    assert block_end(GLOO_CHAIN[:9], 0) is None  # in the second traceback's frames


def test_lines_ending_right_after_the_exception_line_are_complete():
    assert block_end(KEYERROR, 0) == 6
    assert block_end(GLOO_CHAIN[:4], 0) == 3  # a chain printed later becomes its own block


def test_empty_line_not_followed_by_a_chain_message_ends_the_block():
    assert block_end(KEYERROR + ["", "Epoch 2"], 0) == 6
    assert block_end(GLOO_CHAIN[:5] + ["During handling of something else"], 0) == 3


def test_cut_off_traceback_ends_at_its_last_frame():
    assert block_end(KEYERROR[:3] + ["", "x"], 0) == 2
    assert block_end(["Traceback (most recent call last):", ""], 0) == 0


def test_cpp_stack_dump_ends_at_the_last_frame():
    assert block_end(WATCHDOG, 2) == 6
    assert block_end(WATCHDOG[:7], 2) is None  # the next line may be another frame
    assert block_end(WATCHDOG[:3], 2) is None
    assert block_end(["Exception raised from foo at a.cpp:1 (most recent call first):", "plain"], 0) == 0
    assert block_end(["c10 dump (most recent call first):", "frame #0: f + 0x1 (0x1 in libc10.so)", "x"], 0) == 1


def test_a_line_that_starts_nothing_is_a_block_of_its_own():
    assert block_end(WATCHDOG, 0) == 0
    assert block_end(["KeyError: 'lr'"], 0) == 0


def test_start_outside_lines_raises():
    with pytest.raises(IndexError):
        block_end(KEYERROR, 7)


@pytest.mark.parametrize(
    "line, expected",
    [
        ("Traceback (most recent call last):", True),
        ("[2026-11-21 09:36:03] ERROR Traceback (most recent call last):", True),
        (WATCHDOG[2], True),
        ("something (most recent call first):  ", True),
        ("Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:43", True),
        ("KeyError: 'lr'", False),
        ('  File "x.py", line 1, in <module>', False),
        ("frame #0: c10::Error::Error + 0x57", False),
    ],
)
def test_is_block_start(line, expected):
    assert is_block_start(line) is expected


def test_block_start_patterns_find_starts_in_a_raw_chunk_with_prefixes():
    assert [p.text for p in BLOCK_START_PATTERNS] == list(BLOCK_START_REGEXES)   # as the engine wraps them
    assert all(p.regex and not p.caseless for p in BLOCK_START_PATTERNS)
    raw = [b"[rank0]:step 1", b"[rank1]: Traceback (most recent call last):", b'[rank1]:   File "t.py", line 1',
           b"[rank2]:[W1121 09:36:03.735 1 x.cc:1] warn", b"[default3]:" + WATCHDOG[2].encode() + b"\r",
           b"[default3]:frame #0: f + 0x1", b"plain (most recent call first): not at the end"]
    data = b"\n".join(raw) + b"\n"
    matcher = Matcher(BLOCK_START_PATTERNS)
    starts = sorted({s for s, _ in matcher.scan(data)})
    found = [split_rank_prefix(clean(data[s:data.index(b"\n", s)]))[1] for s in starts]
    assert [line for line in found if is_block_start(line)] == ["Traceback (most recent call last):", WATCHDOG[2]]
    assert len(found) == 2


LINE_KINDS = ["Traceback (most recent call last):", '  File "x.py", line 1, in f', "    f()", "    ^^^",
              "KeyError: 'lr'", "", "During handling of the above exception, another exception occurred:",
              "The above exception was the direct cause of the following exception:", WATCHDOG[2],
              "frame #0: f + 0x1", "step 1", "\t", " "]


@given(st.lists(st.one_of(st.sampled_from(LINE_KINDS), st.text(max_size=20)), min_size=1, max_size=30),
       st.data())
def test_block_end_never_raises_and_stays_in_range(lines, data):
    start = data.draw(st.integers(0, len(lines) - 1))
    end = block_end(lines, start)
    assert end is None or start <= end < len(lines)
    for k in range(start + 1, len(lines)):
        early = block_end(lines[:k], start)
        if early is not None and early + 1 < k:
            # decided with a line after the block in view: more lines do not change it
            assert end == early


# pieces of blocks, in any order: what a traceback, a chain and a c10 dump are made of, and lines
# around them
BLOCK_PIECES = [
    ["Traceback (most recent call last):"], ['  File "x.py", line 1, in f', "    f()"], ["    ^^^"],
    ["  [Previous line repeated 996 more times]"], ["KeyError: 'lr'"], ["\t"], [" "], [""], ["step 1"],
    ["", "During handling of the above exception, another exception occurred:", ""],
    ["", "The above exception was the direct cause of the following exception:", ""],
    ["grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with:",
     "\tstatus = StatusCode.UNAVAILABLE", '\tdetails = "failed to connect"'],     # indented continuation
    ["RayTaskError(ValueError): ray::f() (pid=1, ip=10.0.0.1)"],                  # a remote traceback goes on
    ["x:"], ["  Traceback (most recent call last):"], [WATCHDOG[2]], ["frame #0: f + 0x1 (0x1 in libc10.so)"],
    ["Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:43"],
]
BLOCKS = st.lists(st.one_of(st.sampled_from(BLOCK_PIECES), st.lists(st.text(alphabet=" \t:ab\r", max_size=5),
                                                                     max_size=1)),
                  min_size=1, max_size=20).map(lambda pieces: [line for piece in pieces for line in piece])


@given(st.sampled_from(["Traceback (most recent call last):", WATCHDOG[2], "x"]), BLOCKS, st.data())
def test_block_end_line_by_line_answers_as_block_end_over_the_lines_so_far(first, rest, data):
    lines = [first, *rest]
    start = data.draw(st.sampled_from([0] * 3 + list(range(len(lines)))))
    seen = lines[: start + 1]
    ends = BlockEnd(seen, start)
    while True:
        end = ends.end()
        assert end == ends.end()                       # asked again with no new line: the same
        assert end == block_end(seen, start)           # as a scan of the lines so far from the start
        if end is not None or len(seen) == len(lines):
            break                                      # closed: the caller takes the block there
        seen.append(lines[len(seen)])


def _counting(monkeypatch, name):
    calls = [0]
    real = getattr(multiline, name)

    def counted(line):
        calls[0] += 1
        return real(line)

    monkeypatch.setattr(multiline, name, counted)
    return calls


def test_block_end_line_by_line_reads_each_line_once(monkeypatch):
    indented = _counting(monkeypatch, "_indented")
    frames = _counting(monkeypatch, "_is_frame")
    for n in (1_000, 10_000):
        indented[0] = frames[0] = 0
        lines = ["Traceback (most recent call last):"]
        ends = BlockEnd(lines)
        for i in range(n):
            lines.append(f'  File "x.py", line {i}, in f' if i % 2 else "    f()")
            assert ends.end() is None
        lines.append("RecursionError: maximum recursion depth exceeded")
        assert ends.end() == n + 1
        assert indented[0] <= n + 2                    # not n^2/2: the frames are not read again
        indented[0] = 0
        lines[-1] = "grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with:"
        ends = BlockEnd(lines)
        for i in range(n):
            lines.append(f"\tdetail {i}")               # the message's indented continuation
            assert ends.end() is None
        lines.append("next line")
        assert ends.end() == 2 * n + 1
        assert indented[0] <= 2 * n + 4
        dump = ["Exception raised from f at a.cpp:1 (most recent call first):"]
        ends = BlockEnd(dump)
        for i in range(n):
            dump.append(f"frame #{i}: f + 0x1 (0x1 in libc10.so)")
            assert ends.end() is None
        dump.append("plain")
        assert ends.end() == n
        assert frames[0] <= n + 2


# IPython's own traceback (ipython/ipython IPython/core/ultratb.py), as a notebook cell prints it
IPYTHON = """\
RuntimeError                              Traceback (most recent call last)
Cell In[27], line 1
----> 1 model = job.run(
      2     replica_count=1,
      3 )

File /opt/conda/lib/python3.9/site-packages/google/cloud/aiplatform/training_jobs.py:866, in _TrainingJob._raise_failure(self)
    865 if self._gca_resource.error.code != code_pb2.OK:
--> 866     raise RuntimeError("Training failed with:\\n%s" % self._gca_resource.error)

RuntimeError: Training failed with:
code: 8""".splitlines()


def test_an_ipython_traceback_ends_at_the_line_of_the_class_its_header_names():
    assert multiline.ipython_class(IPYTHON[0]) == "RuntimeError"
    assert is_block_start(IPYTHON[0])
    assert block_end(IPYTHON, 0) == len(IPYTHON) - 2     # the message's further lines are not joined
    assert block_end(IPYTHON[:5], 0) is None              # the frames so far: wait for more


def test_an_ipython_traceback_is_read_in_cpythons_shape():
    block = IPYTHON[: block_end(IPYTHON, 0) + 1]
    shaped = multiline.as_cpython(block)
    assert shaped[0] == multiline.PY_START
    assert all(line[:1] == " " for line in shaped[1:-1])
    assert shaped[-1] == "RuntimeError: Training failed with:"
    assert multiline.as_cpython(KEYERROR) is KEYERROR


def test_a_sentence_that_quotes_the_header_starts_no_block():
    assert multiline.ipython_class("the header reads Traceback (most recent call last) and then frames") is None
