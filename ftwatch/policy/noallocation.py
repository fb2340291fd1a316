"""A process that sees no GPU because its allocator gave it none: the job's set-up, not the node.

CUDA shows a process only the devices ``CUDA_VISIBLE_DEVICES`` lists (CUDA C++ Programming Guide,
"CUDA Environment Variables": only the devices whose index is in the sequence are visible; the
ones after an invalid index are hidden, so an empty value or ``-1`` hides them all). Schedulers
and trial launchers set it from what the job asked for, and give a process that asked for no GPU
none:

* Ray: a trial's default resources are 1 CPU and 0 GPU (Ray Tune docs, "A Guide To Parallelism
  and Resources for Ray Tune"), and Ray makes visible to a task or actor only the GPUs it was
  given (``ray.get_gpu_ids``); its maintainer on ray-project/ray#5940: "Ray is detecting the GPUs
  but not allocating them since your code didn't request any for the trials (that's why it says
  0/2 GPUs requested)".
* NNI's local training service logs ``required GPU number is N``; with 0 it starts no GPU
  scheduler and exports ``CUDA_VISIBLE_DEVICES=-1`` to every trial (microsoft/nni
  ``training_service/local/localTrainingService.ts`` ``getEnvironmentVariables``; older releases
  wrote an empty value into the trial's ``run.sh``).
* A container: the NVIDIA Container Toolkit exposes the GPUs ``NVIDIA_VISIBLE_DEVICES`` names
  (the Kubernetes device plugin sets it to the container's allocated GPUs); ``none`` exposes no
  GPU, ``void`` (or unset) makes the runtime behave as runc (NVIDIA Container Toolkit docs,
  "Specialized Configurations with Docker", GPU enumeration).
* Ray Tune also warns at start when the cluster has GPUs and no trial asks for one (``tune.py``:
  "Tune detects GPUs, but no trials are using GPUs").

So the "no device" a CUDA/HIP runtime then reports (``cudaErrorNoDevice``, PyTorch's ``No CUDA
GPUs are available``) is the allocation the job asked for; another node gives the same, and
only the job's resource request fixes it. The evidence rules are ``lifecycle.yaml``'s
``allocation.no_gpu.<who>`` (info: the allocator's own line, the assignment that hides the GPUs).
:func:`not_allocated` regrades a no-device root cause ``user_code`` / ``fail_job`` when the
incident holds such a line; without one the no-device error keeps its grade (a node whose GPUs
fell away: the driver lost them, a container set up without them).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from ftwatch.events import Action, FailureClass, Finding

#: The rule id of the regraded finding.
NOT_ALLOCATED_RULE = "cuda.no_device_not_allocated"
#: Id prefix of the evidence rules (lifecycle.yaml): an allocator's word that the process got no GPU.
NO_GPU = "allocation.no_gpu."
#: The runtime's "no device" errors, graded the node's by their catalogs (cuda_errors.tsv
#: cudaErrorNoDevice, env_vocab.tsv, rocm_vocab.tsv hipErrorNoDevice).
NO_DEVICE_RULES = frozenset({"cuda.no_device", "cuda.rt.no_device", "torch.no_cuda_gpus", "torch.no_hip_gpus",
                             "hip.rt.no_device", "torch.no_xpu_devices"})
_SOURCE = ("CUDA C++ Programming Guide, 'CUDA Environment Variables' (CUDA_VISIBLE_DEVICES: only listed devices "
           "are visible); Ray Tune 'A Guide To Parallelism and Resources' (default 1 CPU, 0 GPU per trial) and "
           "ray-project/ray#5940 (maintainer: GPUs detected but not allocated, '0/2 GPUs requested'); "
           "ray tune.py ('Tune detects GPUs, but no trials are using GPUs'); microsoft/nni localTrainingService.ts "
           "(gpuNum 0: CUDA_VISIBLE_DEVICES=-1); NVIDIA Container Toolkit GPU enumeration (NVIDIA_VISIBLE_DEVICES "
           "none / void)")


def not_allocated(head: Finding, order: Sequence[Finding]) -> Finding | None:
    """``head`` regraded as the job's own allocation, when the incident says it got no GPU.

    Args:
        head: the incident's earliest real error.
        order: all the incident's findings (any instance: the allocator's log is another stream
            than the process's).

    Returns:
        A copy of ``head`` with rule ``cuda.no_device_not_allocated``, ``user_code`` /
        ``fail_job``, its ``allocation`` field the evidence rule's id, when ``head`` is a runtime's
        no-device error and the incident holds an ``allocation.no_gpu.*`` finding, whatever its
        time (the allocation stands for the whole attempt; an allocator's log and the process's
        are different streams whose times need not agree); else None.
    """
    if head.rule_id not in NO_DEVICE_RULES:
        return None
    said = next((f for f in order if f.rule_id.startswith(NO_GPU)), None)
    if said is None:
        return None
    return dataclasses.replace(head, rule_id=NOT_ALLOCATED_RULE, failure_class=FailureClass.USER_CODE,
                               action=Action.FAIL_JOB, fields={**head.fields, "allocation": said.rule_id},
                               source=_SOURCE)
