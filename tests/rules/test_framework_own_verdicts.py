"""Verdicts a framework prints in its own words about the job's model (``stacks_vocab.tsv``):
faceswap's translation of the device out-of-memory error of a training step (oom, fail: the model
at those settings does not fit the GPU) and the Vitis AI PyTorch quantizer's ``[VAIQ_ERROR]``
lines (its own rejection of the model or its use: user_code, fail). Without these rows the
faceswap log decided nothing (TensorFlow's BFC allocator line before it is only a warning) and
the quantizer's exit 1 was read as torchelastic's generic child failure (a restart)."""

from __future__ import annotations

from ftwatch.events import Action, FailureClass, Origin
from ftwatch.rules.engine import Engine
from ftwatch.rules.loader import load_rules

ENGINE = Engine(load_rules())


def findings(*lines: str):
    text = "".join(f"{line}\n" for line in lines)
    return ENGINE.feed(Origin("job", None, "j", "node-1", "stdout", "file"), text.encode(), 1.0, final=True)


def test_faceswaps_own_oom_message_is_an_oom_that_fails_the_job_even_at_debug_level():
    found = findings(
        "2020-03-02 21:19:47.912331: W tensorflow/core/common_runtime/bfc_allocator.cc:419] Allocator (GPU_0_bfc) "
        "ran out of memory trying to allocate 32.00MiB (rounded to 33554432).  Current allocation summary follows.",
        "03/02/2020 21:19:48 MainProcess     _training_0     multithreading  run                       DEBUG    "
        "Error in thread (_training_0): You do not have enough GPU memory available to train the selected model at "
        "the selected settings. You can try a number of things:")
    hit = [f for f in found if f.rule_id == "faceswap.not_enough_gpu_memory"]
    assert hit and (hit[0].failure_class, hit[0].action) == (FailureClass.OOM, Action.FAIL_JOB)


def test_a_similar_sentence_of_another_program_is_not_faceswaps():
    assert not [f for f in findings("You do not have enough GPU memory to run this model")
                if f.rule_id == "faceswap.not_enough_gpu_memory"]


def test_the_vitis_ai_quantizers_error_lines_are_the_programs_both_forms():
    for line in ("[VAIQ_ERROR]: Unsupported Ops: {'_record_function_enter'}",
                 "[VAIQ_ERROR][QUANTIZER_TORCH_EXPORT_XMODEL]: Failed convert graph 'Model' to xmodel."):
        hit = [f for f in findings(line) if f.rule_id == "vitis_ai.quantizer_error"]
        assert hit and (hit[0].failure_class, hit[0].action) == (FailureClass.USER_CODE, Action.FAIL_JOB), line


def test_the_quantizers_notes_and_warnings_are_no_error():
    found = findings("[VAIQ_NOTE]: =>Parsing DistributedDataParallel...",
                     "[VAIQ_WARN]: The quant config file is empty, use the default configuration")
    assert not [f for f in found if f.rule_id == "vitis_ai.quantizer_error"]
