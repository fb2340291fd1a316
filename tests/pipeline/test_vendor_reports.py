"""Vendor reports that decide a run whatever else its log says: a shell's or faulthandler's report
of a SIGBUS death (a failed process, not a finished one), Paddle's device out-of-memory report
inside the SystemError its tracer raises (oom, not the interpreter's fault), Megascale's verdict
naming bad TPU chips (isolate the host it names)."""

from __future__ import annotations

from pathlib import Path

from ftwatch.events import Action, FailureClass

JOB = "vendor-reports-test"
STEPS = [f"step {i} loss {2.0 - i / 10:.2f}" for i in range(4)]


def decided(run, path: Path, lines: list[str]):
    """The decision of a replay of ``lines`` written to ``path`` (restarts enabled, 3 allowed)."""
    path.write_text("".join(f"{line}\n" for line in lines))
    return run([path], enable_job_restart=True, max_num_of_job_restart=3).decision


def test_a_scripts_bus_error_report_fails_the_job(run, tmp_path):
    d = decided(run, tmp_path / "rank0.log", STEPS + [
        "Fatal Python error: Bus error",
        "",
        "Current thread 0x00007fd40d7fa740 (most recent call first):",
        '  File "/opt/t5x/t5x/train.py", line 511 in train',
        "/opt/t5x/run_pretrain.sh: line 41:    88 Bus error               (core dumped) python3 -u train.py"])
    assert d.action is Action.FAIL_JOB, d
    assert d.root_cause is not None and d.root_cause.failure_class is FailureClass.USER_CODE


def test_paddles_oom_inside_a_systemerror_is_oom(run, tmp_path):
    d = decided(run, tmp_path / "workerlog.2", STEPS + [
        "Traceback (most recent call last):",
        '  File "train.py", line 94, in evaluate',
        "    logits = model(images)",
        "SystemError: (Fatal) Operator conv2d raises an paddle::memory::allocation::BadAlloc exception.",
        "The exception content is",
        ":ResourceExhaustedError: ",
        "",
        "Out of memory error on GPU 2. Cannot allocate 392.000244MB memory on GPU 2, 15.586487GB memory has been "
        "allocated and available memory is only 187.437500MB."])
    assert d.action is Action.FAIL_JOB, d
    assert d.root_cause is not None and d.root_cause.failure_class is FailureClass.OOM


def test_megascale_naming_bad_tpu_chips_isolates(run, tmp_path):
    steps = [f"completed step: {4410 + i}, seconds: 3.118, loss: 2.41" for i in range(4)]
    d = decided(run, tmp_path / "worker-0.log", steps + [
        "E1126 03:19:22.837410    1871 megascale_hang_detector.cc:412] Megascale detects a hang that is likely "
        "caused by bad TPU chips on the following hosts. Please remove the hosts from the fleet and restart the "
        "workload. If problem persists please contact Megascale XLA team.",
        "The host that have bad TPUs are: gke-tpu-5c1e9a04-w3kq"])
    assert d.action is Action.ISOLATE_NODE, d
    assert d.root_cause is not None and d.root_cause.rule_id == "megascale.hang_bad_tpu_chips"


def test_a_gpu_that_nvidia_smi_shows_with_uncorrectable_ecc_errors_isolates_its_oom(run, tmp_path):
    d = decided(run, tmp_path / "rank0.log", [
        "|   0  Tesla V100-SXM2...  On   | 00000000:1B:00.0 Off |                    1 |",
        "| N/A   36C    P0    42W / 300W |      0MiB / 32510MiB |      0%      Default |",
        "Traceback (most recent call last):",
        '  File "train.py", line 102, in main',
        "    model = build_model(cfg).cuda()",
        "RuntimeError: CUDA error: out of memory"])
    assert d.action is Action.ISOLATE_NODE, d
    assert d.root_cause is not None and d.root_cause.rule_id == "gpu.smi_volatile_uncorrectable_ecc"


def test_a_scripts_report_that_its_command_was_terminated_restarts(run, tmp_path):
    d = decided(run, tmp_path / "algo-1.log", [
        "Epoch 17:  42%|████▏     | 331/788 [03:58<05:29,  1.39it/s, loss=0.214, v_num=0]",
        "Epoch 17:  58%|█████▊    | 457/788 [05:29<03:58,  1.39it/s, loss=0.209, v_num=0]",
        "./entrypoint.sh: line 6:    57 Terminated              python train.py --config configs/unet.yaml"])
    assert d.action is Action.RESTART_JOB, d
    assert d.root_cause is not None and d.root_cause.failure_class is FailureClass.RETRYABLE_INFRA
