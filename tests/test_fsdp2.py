"""FSDP2 under `accelerate launch --use_fsdp --fsdp_version 2`, on 2 CPU processes over gloo.

Two launches of tests/fsdp2_worker.py (its docstring says how accelerate's FSDP2 code is made to
run on a CPU). The first tries accelerate's own sharding of the model, then trains 6 AdamW steps
of a tiny ScratchBertForMaskedLM (2 micro-batches a step, clipped at 1.0, as the pretrain loop
steps) under torch's DDP, and again sharded by `sharding.shard`, checkpointing at step 3. The
second, in fresh processes and with accelerate's wrap-policy flags, resumes that checkpoint and
trains steps 4-6 again. Checked: one unit per ScratchBertLayer, the MLM decoder still the
word-embedding table; the sharded run's losses and weights are DDP's (to LOSS_RTOL, WEIGHT_ATOL);
the final model folder loads with `from_pretrained` as a plain scratchbert model; the resumed
run ends on the uninterrupted run's weights exactly.

Not covered here: GPUs and NCCL, mixed precision (fp32 only), CPU offload, activation
checkpointing, `scratchbert pretrain` itself under FSDP2, more than 2 processes or one machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import python_path, tiny_bert_config
from fsdp2_worker import tiny_model
from safetensors.torch import load_file
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy
from transformers import AutoModelForMaskedLM

from scratchbert import ScratchBertForMaskedLM
from scratchbert.errors import ScratchBertError
from scratchbert.training.pretraining.sharding import original_class, take_over_wrapping, unsharded_copy

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "tests" / "fsdp2_worker.py"
STEPS, SAVE_AT = 6, 3
# DDP and FSDP2 sum the same numbers in other orders: the ranks' gradients (all-reduce against
# reduce-scatter) and the squares in the gradient norm that clipping divides by (whole tensors
# against each rank's slices). On an Intel Xeon (2 ranks, fp32) that moved the losses and norms by
# one float32 step (1e-7 relative) and the weights by at most 1.2e-7 after 6 steps.
LOSS_RTOL, WEIGHT_ATOL = 1e-6, 1e-6
LAUNCH_TIMEOUT = 300
WRAP_FLAGS = ("--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP", "--fsdp_transformer_layer_cls_to_wrap", "ScratchBertLayer")



def launch(output_dir: Path, port: int, *worker_args: str, accelerate_flags: tuple[str, ...] = ()) -> str | None:
    """One `accelerate launch --use_fsdp --fsdp_version 2` of the worker on 2 processes: None, or what went wrong."""
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--use_fsdp", "--fsdp_version", "2", *accelerate_flags, "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
        str(WORKER), str(output_dir), "--steps", str(STEPS), *worker_args,
    ]  # fmt: skip
    # No GPU, as on CI; one thread per rank; torch's own kernels for every product, in both engines.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "SCRATCHBERT_GEMM": "mkl", "PYTHONPATH": python_path(REPO)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the launcher and both ranks
        output, _ = process.communicate()
        return f"the launch hung for {LAUNCH_TIMEOUT}s:\n{output[-4000:]}"
    return None if process.returncode == 0 else f"the launch failed ({process.returncode}):\n{output[-4000:]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The uninterrupted run (after its DDP reference) and the run resumed from its step-3 checkpoint.

    Each test first checks that both launches ran (so a failure is the test's, not the fixture's).
    """
    root = tmp_path_factory.mktemp("fsdp2")
    whole, resumed = root / "whole", root / "resumed"
    failure = launch(whole, 29631, "--save-at", str(SAVE_AT), "--ddp-reference", "--accelerate-wrapping")
    if failure is None:
        # with the wrap flags `accelerate config` writes: sharding.shard takes them over, and makes the same units
        resume = ["--resume-from", str(whole / "checkpoints" / f"step-{SAVE_AT}")]
        failure = launch(resumed, 29632, *resume, accelerate_flags=WRAP_FLAGS)
    return {"whole": whole, "resumed": resumed, "failure": failure}


def report(runs: dict, name: str) -> dict:
    assert runs["failure"] is None, runs["failure"]
    return json.loads((runs[name] / "report.json").read_text())


def saved_weights(runs: dict, name: str) -> dict[str, torch.Tensor]:
    assert runs["failure"] is None, runs["failure"]
    return load_file(runs[name] / "model" / "model.safetensors")


def test_accelerates_own_sharding_puts_the_mlm_bias_in_two_units(runs):
    """Why scratchbert shards the model itself (sharding.py). If this fails, accelerate has learnt BERT's head."""
    assert "is shared with a parameter already managed by another FSDP group" in report(runs, "whole")["accelerate_wrapping"]


def test_fsdp2_shards_each_encoder_layer_and_keeps_the_decoder_tied(runs):
    for when in ("sharding", "sharding_at_end"):
        sharding = report(runs, "whole")[when]
        # the root, each layer, and the tied unit (word embeddings + MLM head)
        assert sharding["units"] == ["<root>", "bert.embeddings.word_embeddings", "bert.encoder.layer.0", "bert.encoder.layer.1", "cls.predictions"]
        assert sharding["tied"] == [
            ["bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"],
            ["cls.predictions.bias", "cls.predictions.decoder.bias"],
        ]
        assert sharding["decoder_weight_is_word_embeddings"] and sharding["parameter_types"] == ["DTensor"]
    assert report(runs, "resumed")["sharding_after_resume"] == report(runs, "whole")["sharding"]


def steps(runs: dict, name: str, engine: str = "steps") -> tuple[torch.Tensor, torch.Tensor]:
    """Each step's loss on each rank, (steps, 2), and gradient norm before clipping, (steps,)."""
    records = report(runs, name)[engine].values()
    return torch.tensor([r["losses"] for r in records]), torch.tensor([r["grad_norm"] for r in records])


def test_fsdp2_trains_to_ddps_losses_and_weights(runs):
    (fsdp2, fsdp2_norms), (ddp, ddp_norms) = steps(runs, "whole"), steps(runs, "whole", "ddp_steps")
    assert fsdp2.shape == ddp.shape == (STEPS, 2)
    torch.testing.assert_close(fsdp2, ddp, atol=0, rtol=LOSS_RTOL)
    torch.testing.assert_close(fsdp2_norms, ddp_norms, atol=0, rtol=LOSS_RTOL)
    assert (ddp_norms > 1.0).any()  # so clipping to 1.0 acted, in both
    reference = load_file(runs["whole"] / "ddp.safetensors")
    sharded = saved_weights(runs, "whole")
    assert set(sharded) <= set(reference) and "bert.embeddings.word_embeddings.weight" in sharded
    for name, tensor in sharded.items():
        torch.testing.assert_close(tensor, reference[name], atol=WEIGHT_ATOL, rtol=0, msg=name)
    # and the steps moved the weights far more than that (AdamW's first steps move each by about the rate)
    initial = tiny_model().state_dict()
    assert max((sharded[name] - initial[name]).abs().max() for name in sharded) > 1000 * WEIGHT_ATOL


def test_fsdp2_final_model_is_a_plain_from_pretrained_folder(runs):
    folder = runs["whole"] / "model"
    weights = saved_weights(runs, "whole")
    for load in (ScratchBertForMaskedLM.from_pretrained, AutoModelForMaskedLM.from_pretrained):
        model = load(folder)
        assert type(model) is ScratchBertForMaskedLM
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
        loaded = model.state_dict()
        for name, tensor in weights.items():
            assert torch.equal(loaded[name], tensor), name
    # the model's own code beside it, not the FSDP subclass's (torch's files)
    assert not list(folder.glob("_fsdp*.py")) and (folder / "modeling_scratchbert.py").is_file()
    assert "FSDP" not in (folder / "config.json").read_text()


def test_fsdp2_resumes_a_sharded_checkpoint_to_the_uninterrupted_weights(runs):
    whole, resumed = report(runs, "whole"), report(runs, "resumed")
    # model and optimizer as torch.distributed.checkpoint shards, one file per rank
    assert whole["checkpoints"][f"step-{SAVE_AT}"] == [
        "optimizer_0", "pytorch_model_fsdp_0", "random_states_0.pkl", "random_states_1.pkl", "scheduler.bin", "trainer_state.json",
    ]  # fmt: skip
    assert list(resumed["steps"]) == [str(step) for step in range(SAVE_AT + 1, STEPS + 1)]
    assert all(resumed["steps"][step] == whole["steps"][step] for step in resumed["steps"])  # losses and norms, exactly
    uninterrupted, continued = saved_weights(runs, "whole"), saved_weights(runs, "resumed")
    assert uninterrupted.keys() == continued.keys()
    assert all(torch.equal(continued[name], uninterrupted[name]) for name in uninterrupted)


def test_shard_takes_over_a_transformer_wrap_policy_and_refuses_another():
    model = ScratchBertForMaskedLM(tiny_bert_config(vocab_size=40))
    plugin = SimpleNamespace(auto_wrap_policy=transformer_auto_wrap_policy, transformer_cls_names_to_wrap=["ScratchBertLayer"])
    take_over_wrapping(plugin, model)
    assert plugin.auto_wrap_policy is None  # accelerate has nothing left to wrap
    for policy, names in ((size_based_auto_wrap_policy, None), (transformer_auto_wrap_policy, ["ScratchBertSelfAttention"])):
        with pytest.raises(ScratchBertError, match="drop --fsdp_auto_wrap_policy"):
            take_over_wrapping(SimpleNamespace(auto_wrap_policy=policy, transformer_cls_names_to_wrap=names), model)


def test_unsharded_copy_is_the_models_own_class_with_the_given_weights():
    model = ScratchBertForMaskedLM(tiny_bert_config(vocab_size=40))
    assert original_class(model) is ScratchBertForMaskedLM
    state = {name: tensor + 1 for name, tensor in model.state_dict().items()}
    copy = unsharded_copy(model, state)
    assert type(copy) is ScratchBertForMaskedLM and copy.config is model.config
    assert copy.get_output_embeddings().weight is copy.get_input_embeddings().weight
    for name, tensor in copy.state_dict().items():
        assert torch.equal(tensor, state[name]), name
