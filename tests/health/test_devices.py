"""Check agents run on their worker slot's device (SPEC A1, H1, H2): the agents are real child
processes that report the visible-devices environment they were started with (no GPU here: the
devices are modelled names, as ``ftwatch.config.supervisor.default_devices`` does on a CPU)."""

from __future__ import annotations

import pytest

from ftwatch.config.model import Config
from ftwatch.health import bootcheck, nodes
from ftwatch.cli.health import network_check
from ftwatch.pipeline.actuators.slots import Slots

pytestmark = pytest.mark.slow


def test_each_all_reduce_agent_sees_only_its_slots_device():
    pytest.importorskip("torch")
    results = bootcheck.torch_checks(2, 1 << 16, timeout=60, devices=["5", "7"])
    by = {r.check: r for r in results}
    assert by["versions"].fields["env"] == {"CUDA_VISIBLE_DEVICES": "5", "ASCEND_RT_VISIBLE_DEVICES": "5",
                                            "FTWATCH_HEALTH_DEVICE": "0"}
    assert by["allreduce"].status == "ok", by["allreduce"].lines
    assert by["allreduce"].fields["visible"] == ["5", "7"]


def test_a_slot_whose_device_is_missing_skips_the_all_reduce_instead_of_waiting_it_out(monkeypatch):
    """Recorded on an H200 (tools/gpu_capture.sh too_many_ranks: two slots on a one-GPU node): the
    GPU check found device 1 missing, and the all-reduce then waited 60 s for the agent without a
    GPU, at Bootcheck and again at Troubleshooting. A missing slot device skips the all-reduce."""
    pytest.importorskip("torch")
    from tests.health.test_bootcheck_faults import fake_pynvml
    fake_pynvml(monkeypatch, count=1)
    monkeypatch.setattr(bootcheck, "run_group", lambda *a, **k: pytest.fail("the all-reduce was tried"))
    results = bootcheck.run_checks([], 0, 0.0, 2, True, 1 << 16, timeout=60, devices=["0", "1"])
    by = {r.check: r for r in results}
    assert by["gpu"].status == "fail" and by["gpu"].fields["missing"] == ["1"]
    assert by["versions"].status == "ok"
    assert by["allreduce"].status == "skipped"
    assert by["allreduce"].lines == ("AllReduce Check: skipped: no GPU for the slot(s) of device 1 (GPU Check)",)


@pytest.fixture
def answers(monkeypatch) -> list[dict]:
    """The node check agents' answers, as ``nodes.run_group`` returns them (real agents)."""
    got_all: list[dict] = []
    real = nodes.run_group

    def spy(agents, request, timeout, *a, **k):
        got = real(agents, request, timeout, *a, **k)
        got_all.extend(got)
        return got

    monkeypatch.setattr(nodes, "run_group", spy)
    return got_all


def test_network_check_isolates_the_failed_slots_device_in_the_slots_store(tmp_path, monkeypatch, answers):
    """Slot 1 (device d1) goes down in every check: d1 is isolated in the job's slots store, so the
    run's slots are d0, d2 (not the first two devices d0, d1); every agent saw its own device."""
    pytest.importorskip("torch")
    monkeypatch.setenv("FTWATCH_HEALTH_CRASH", "1")
    config = Config.model_validate({
        "supervisor": {"nproc_per_node": 3, "devices": ["d0", "d1", "d2"]},
        "storage": {"state_dir": str(tmp_path)},
        "health": {"nodecheck": {"gemm_size": 64, "allreduce_bytes": 4096, "timeout": 20, "min_nodes": 2}},
    })
    status, new = network_check(config, "job1", exclude=False)
    assert status == 0
    assert new.supervisor.devices == ["d0", "d1", "d2"] and new.supervisor.nproc_range.max == 2
    slots = Slots.for_job(tmp_path, "job1", new.supervisor.nproc_range, new.supervisor.devices)
    assert list(slots.isolated) == ["d1"] and slots.isolated["d1"]["rule"] == "health.nodecheck"
    assert slots.active == ["d0", "d2"]
    seen = {a["env"]["CUDA_VISIBLE_DEVICES"] for a in answers if a.get("ok")}
    assert seen == {"d0", "d2"}, answers
    assert all(a["env"]["FTWATCH_HEALTH_DEVICE"] == "0" for a in answers if a.get("ok"))


def test_network_check_leaves_gpus_hidden_by_the_environment_hidden(tmp_path, monkeypatch, answers):
    """CUDA_VISIBLE_DEVICES= (the job sees no GPU): the node check's agents see it so too, not the
    modelled slot devices the slots store keeps."""
    pytest.importorskip("torch")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    config = Config.model_validate({
        "supervisor": {"nproc_per_node": 2},
        "storage": {"state_dir": str(tmp_path)},
        "health": {"nodecheck": {"gemm_size": 64, "allreduce_bytes": 4096, "timeout": 20}},
    })
    status, _ = network_check(config, "job1", exclude=False)
    assert status == 0
    assert answers and {a["env"].get("CUDA_VISIBLE_DEVICES") for a in answers} == {""}, answers
