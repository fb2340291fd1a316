"""NCCL's unhandled system error before any progress in a job on one host (ftwatch.policy.onehost,
issue 12): no network between hosts is on its path, only the host's shared memory and IPC (NCCL user
guide, Troubleshooting > Runtime and MPI issues > Shared memory), so it is the set-up; between hosts,
with the hosts unknown, or after progress it keeps its retryable grade."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Finding, Origin
from ftwatch.policy import progress
from ftwatch.policy.initphase import NONE_YET, at_init
from ftwatch.policy.onehost import one_host
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

T0 = 1_795_219_200.0
ENGINE = Engine(load_rules())
JOB = "onehost"
NCCL = ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:784, unhandled system "
        "error, NCCL version 2.7.8")
DP_TRACE = ('Traceback (most recent call last):\n  File "train.py", line 165, in train\n    out = net(images)\n'
            '  File "/env/lib/python3.7/site-packages/torch/nn/parallel/data_parallel.py", line 167, in forward\n'
            '    replicas = self.replicate(self.module, self.device_ids[:len(inputs)])\n'
            'RuntimeError: NCCL Error 2: unhandled system error\n')
DDP_TRACE = DP_TRACE.replace("nn/parallel/data_parallel.py", "nn/parallel/distributed.py")


def fed(text: str, rank: int | None = 0, node: str = "replay", t: float = T0) -> list[Finding]:
    origin = Origin(f"rank{rank}", rank, JOB, node, "stderr", "process")
    return ENGINE.feed(origin, text.encode(), t, final=True)


def failed(launch: str, node: str = "replay") -> list[Finding]:
    return [*fed(f"{launch}\n", node=node), *fed(
        f'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n{NCCL}\n', node=node, t=T0 + 5)]


def test_a_loopback_rendezvous_on_one_host_before_progress_fails_the_job():
    for launch in ("cmd = python -u -m deepspeed.launcher.launch --master_addr=127.0.0.1 --master_port=29500 train.py",
                   "Init process group: dist_url: tcp://127.0.0.1:23459, world_size: 4, rank: 0",
                   "MASTER_ADDR=localhost MASTER_PORT=29500"):
        found = failed(launch)
        grade = at_init(found[-1], NONE_YET, found)
        assert grade is not None, launch
        assert grade.failure_class is FailureClass.USER_CODE and grade.action is Action.FAIL_JOB
        assert "Shared memory" in grade.source and "loopback" in grade.meaning


def test_an_nn_data_parallel_traceback_is_one_host_and_ddp_is_not():
    found = fed(DP_TRACE)
    assert found[-1].rule_id == "nccl.unhandled_system_error"
    assert one_host(found[-1], found) is not None
    ddp = fed(DDP_TRACE)
    assert one_host(ddp[-1], ddp) is None


def test_a_job_that_says_it_spans_nodes_keeps_its_grade():
    for launch in ("nnodes=2, num_local_procs=8, node_rank=0 master_addr=127.0.0.1",
                   "NNODES=2 NODE_RANK=1 MASTER_ADDR=localhost",
                   "cmd = torchrun --master_addr=10.0.0.5 --master_port=29500 train.py"):
        found = failed(launch)
        assert one_host(found[-1], found) is None, launch
    two_hosts = [*failed("MASTER_ADDR=localhost", node="box-a"), *failed("MASTER_ADDR=localhost", node="box-b")]
    assert one_host(two_hosts[-1], two_hosts) is None


def test_no_launch_line_or_progress_before_keeps_the_retryable_grade():
    found = fed(f'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n{NCCL}\n')
    assert one_host(found[-1], found) is None
    done = failed("MASTER_ADDR=127.0.0.1")
    assert at_init(done[-1], T0 + 1, done) is None          # the job trained before it


def test_only_nccl_system_errors_are_read():
    found = failed("MASTER_ADDR=127.0.0.1")
    other = [g for g in fed("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")]
    assert other and one_host(other[-1], [*found, *other]) is None


def test_a_launchers_command_line_flag_is_no_progress_line():
    cmd = (b"[2020-11-19 08:22:40,173] [INFO] [runner.py:358:main] cmd = python -u -m deepspeed.launcher.launch "
           b"pretrain_gpt2.py --num-layers 24 --train-iters 100000 --fp16\n")
    assert list(progress.marks(cmd, T0, 0.0, 2020)) == []
    line = b"[2020-11-19 08:25:40,173] iteration 100/100000 | lm loss: 7.1\n"
    assert list(progress.marks(line, T0, 0.0, 2020))


def test_a_paddle_launch_whose_node_list_is_loopback_only_is_one_host():
    # paddle.distributed.launch (1.x) prints its --cluster_node_ips, "Paddle cluster nodes ips"
    found = failed("cluster_node_ips: 127.0.0.1")
    grade = at_init(found[-1], NONE_YET, found)
    assert grade is not None and grade.action is Action.FAIL_JOB and "lists its nodes" in grade.meaning
    for launch in ("cluster_node_ips: 127.0.0.1,10.0.0.6", "cluster_node_ips: 10.0.0.5,10.0.0.6"):
        found = failed(launch)
        assert one_host(found[-1], found) is None, launch


def test_a_detectron2_style_launchers_process_group_url_on_loopback_is_one_host():
    # detectron2's engine/launch.py and YOLOX's core/launch.py log the init_method they passed as
    # "Process group URL: ..."; dist_url "auto" on one machine is tcp://127.0.0.1:<port>
    url = "2022-07-06 11:20:31.612 | ERROR    | yolox.core.launch:_distributed_worker:126 - Process group URL: "
    found = failed(url + "tcp://127.0.0.1:50617")
    assert any(g.rule_id == "rendezvous.init_method_tcp" for g in found)
    grade = at_init(found[-1], NONE_YET, found)
    assert grade is not None and grade.action is Action.FAIL_JOB and "127.0.0.1" in grade.meaning
    assert one_host(failed(url + "tcp://10.0.3.7:50617")[-1], failed(url + "tcp://10.0.3.7:50617")) is None


MARIAN_NCCL = ("[2023-04-21 19:17:31] Error: NCCL error 2 'unhandled system error' - "
               "/marian/src/training/communicator_nccl.h:43: ncclGroupEnd()")


def test_marians_own_word_that_it_runs_as_one_process_on_one_host_is_one_host():
    found = [*fed("[2023-04-21 19:17:25] [comm] Compiled without MPI support. Running as a single process on "
                  "training-job-0\n"), *fed(MARIAN_NCCL + "\n", t=T0 + 5)]
    assert [f.rule_id for f in found][0] == "launch.single_process_host"
    head = found[-1]
    assert one_host(head, found) is not None
    grade = at_init(head, NONE_YET, found)
    assert grade is not None and (grade.failure_class, grade.action) == (FailureClass.USER_CODE, Action.FAIL_JOB)


def test_marians_line_beside_a_second_host_keeps_the_grade():
    found = [*fed("[comm] Compiled without MPI support. Running as a single process on node-a\n", node="node-a"),
             *fed(MARIAN_NCCL + "\n", node="node-a", t=T0 + 5), *fed(MARIAN_NCCL + "\n", rank=1, node="node-b",
                                                                    t=T0 + 6)]
    assert found[1].rule_id == "nccl.unhandled_system_error"
    assert one_host(found[1], found) is None
