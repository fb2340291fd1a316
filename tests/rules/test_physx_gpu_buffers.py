"""PhysX's report that a GPU scene outgrew the contact buffers its scene desc reserved
(``stacks_vocab.tsv`` ``physx.gpu_buffer_overflow``): "<buffer> buffer overflow detected, please
increase its size to at least N in the scene desc!". The capacity is the job's own PhysX setting
(Isaac Lab's ``PhysxCfg.gpu_max_rigid_patch_count`` and its siblings), the simulation drops the
contacts that do not fit, and a rerun with the same scene overflows again: user_code, fail_job.
Before this row an Isaac Lab run that printed only these errors decided nothing."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())
RULE = "physx.gpu_buffer_overflow"


def findings(*lines: str):
    text = "".join(f"{line}\n" for line in lines)
    return ENGINE.feed(Origin("job", None, "j", "node-1", "stdout", "file"), text.encode(), 1.0, final=True)


def test_each_gpu_buffer_physx_names_is_the_jobs_configuration():
    for line in (
            "2024-09-11 09:31:07 [803,112ms] [Error] [omni.physx.plugin] PhysX error: Patch buffer overflow detected, "
            "please increase its size to at least 181309 in the scene desc!",
            "[Error] [omni.physx.plugin] PhysX error: PxGpuDynamicsMemoryConfig::collisionStackSize buffer overflow "
            "detected, please increase its size to at least 376226584 in the scene desc! Contacts have been dropped.",
            "PhysX error: Contact buffer overflow detected, please increase its size in the scene desc!"):
        hit = [f for f in findings(line) if f.rule_id == RULE]
        assert hit and (hit[0].failure_class, hit[0].action) == (FailureClass.USER_CODE, Action.FAIL_JOB), line


def test_a_hint_about_the_buffers_is_no_overflow():
    found = findings("[Warning] [omni.physx.plugin] increase gpu_max_rigid_patch_count if you see buffer overflow "
                     "warnings", "Patch buffer size: 163840")
    assert not [f for f in found if f.rule_id == RULE]
