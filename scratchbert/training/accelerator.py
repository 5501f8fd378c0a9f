"""The `Accelerator` of a pretraining run: devices, mixed precision, trackers and replayable data order."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, broadcast_object_list, is_tensorboard_available

from scratchbert.configuration_scratchbert import ScratchBertConfig
from scratchbert.errors import ScratchBertError
from scratchbert.tokenization import load_tokenizer
from scratchbert.training import checkpoint as ckpt
from scratchbert.training import prepared
from scratchbert.training.config import DEFAULT_VOCAB_SIZE, PretrainConfig
from scratchbert.training.distributed_checks import DEFAULT_DDP_TIMEOUT, check_same_versions, collective_timeout, start_heartbeat
from scratchbert.training.models import pretraining_model
from scratchbert.training.precision import auto_precision


def _has_accelerator_device() -> bool:
    return torch.cuda.is_available() or (hasattr(torch, "accelerator") and torch.accelerator.is_available())


def start_processes(ddp_timeout: float = DEFAULT_DDP_TIMEOUT) -> PartialState:
    """The launch's process group (gloo on a machine without GPUs), each collective waiting at most `ddp_timeout` seconds.

    Call it before anything else asks for a `PartialState`: Accelerate keeps one state per process, so
    the first call starts the processes and fixes the deadline, and every later state (the one
    `settle_mixed_precision` asks for, the Accelerator's) shares it. With more than two processes each
    also beats a heartbeat, by which the survivors of a lost process tell which one it was.
    """
    state = PartialState(cpu=not _has_accelerator_device(), timeout=collective_timeout(ddp_timeout))
    start_heartbeat()
    return state


def settle_mixed_precision(config: PretrainConfig) -> PretrainConfig:
    """`--mixed-precision auto` made concrete, before the Accelerator that fixes a run's precision exists.

    A resumed run keeps the precision its checkpoint trained in. Otherwise the main process
    decides (`precision.auto_precision`: on a CPU a timed trial of the run's model, batch and
    masking rate, with the vocabulary `trial_vocab_size` expects) and tells the others, so every process trains alike. The
    returned config names the precision chosen, and so does the pretrain_config.json it saves.
    """
    if config.mixed_precision != "auto":
        return config
    state = PartialState(cpu=not _has_accelerator_device())  # the Accelerator built next shares it
    decision, failure = [None], None
    if state.is_main_process:
        try:
            decision = [_auto_decision(config)]
        except Exception as err:  # e.g. a damaged checkpoint: the other ranks must not wait for an answer
            decision, failure = [("error", str(err))], err
    if state.num_processes > 1:
        broadcast_object_list(decision, from_process=0)
    choice, reason = decision[0]
    if choice == "error":
        if failure is not None:
            raise failure
        raise ScratchBertError(f"the main process could not settle --mixed-precision auto: {reason}", every_process=True)
    state.print(f"--mixed-precision auto: {reason}")
    return dataclasses.replace(config, mixed_precision=choice)


def _auto_decision(config: PretrainConfig) -> tuple[str, str]:
    checkpoints = ckpt.list_checkpoints(config.output_dir) if config.resume else []
    if checkpoints:
        resumed = ckpt.read_trainer_state(checkpoints[-1][1])["config"].get("mixed_precision", "no")
        return resumed, f"{'fp32' if resumed == 'no' else resumed}, the precision of the checkpoint this run continues"
    model_config = ScratchBertConfig(vocab_size=trial_vocab_size(config), **config.model_kwargs())
    return auto_precision(
        lambda: pretraining_model(config, model_config), config.batch_size, config.max_seq_length, config.mlm_probability,
        on_gpu=_has_accelerator_device(),
    )


def trial_vocab_size(config: PretrainConfig) -> int:
    """The vocabulary size the run's model will have, as far as it is known before the data is built.

    A tokenizer given (`--tokenizer`, or a `--prepared-data` folder's) sets it, unless `--vocab-size`
    overrides it for `--tokenizer`, as `pretrain.setup` does; one trained for the run comes out at
    most the size asked. The trial must time the model that will train: the MLM head's product of
    the predicted positions with the (H, V) output matrix is a large share of a small model's
    step (`tiny` at 32 x 64 on a Zen 4: 32,000 tokens/s in fp32 with 4,096 tokens, 10,000 with
    BERT's 30,522).
    """
    if config.prepared_data:
        prepared.check_options(config.prepared_data, config)  # a missing or mismatched folder is named before any trial
        return len(load_tokenizer(Path(config.prepared_data) / "tokenizer"))
    if config.tokenizer and config.vocab_size is None:
        return len(load_tokenizer(config.tokenizer))
    return config.vocab_size or DEFAULT_VOCAB_SIZE


def build_accelerator(config: PretrainConfig) -> Accelerator:
    """An Accelerator for this run; on a machine without GPUs, several processes use gloo on CPU.

    FSDP and DeepSpeed need accelerator devices: on a CPU-only machine a launch that asks for
    them is refused with the DDP command to use instead, never silently turned into DDP.
    Processes that run different software are refused here, on every process (`distributed_checks`);
    the processes' deadline for a collective is `start_processes`'s.
    """
    has_device = _has_accelerator_device()
    if config.mixed_precision == "fp16" and not has_device:
        raise ScratchBertError("mixed_precision='fp16' needs a GPU; on CPU use --mixed-precision bf16 (or no).")
    for variable, name in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")):
        if os.environ.get(variable, "false").lower() in ("1", "true", "yes") and not has_device:
            raise ScratchBertError(
                f"{name} shards the model across GPUs, and this machine has none. On CPU, run data-parallel (DDP over "
                "gloo) instead: `accelerate launch --multi_gpu --num_processes 2 -m scratchbert.commands.pretrain ...` (no GPU needed)."
            )
    trackers = _trackers(config.report_to)
    check_same_versions(PartialState(cpu=not has_device))
    return Accelerator(
        # Without an accelerator device, `cpu=True` makes a multi-process launch (even
        # `--multi_gpu`) use gloo DDP on CPU instead of quietly running N copies alone.
        cpu=not has_device,
        mixed_precision=config.mixed_precision,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        log_with=trackers or None,
        project_config=ProjectConfiguration(project_dir=config.output_dir, logging_dir=str(Path(config.output_dir) / "logs")),
        # The training order is corpus.EpochPermutation's (seed + epoch), which Accelerate leaves
        # alone; the seedable sampler would stand in for any plain shuffling DataLoader.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=config.seed),
        # We step the scheduler once per optimizer step ourselves; by default Accelerate
        # steps it once per process, for schedules written in single-process steps.
        step_scheduler_with_optimizer=False,
    )


def _trackers(report_to: str) -> list[str]:
    if report_to == "none":
        return []
    if report_to == "auto":
        return ["tensorboard"] if is_tensorboard_available() else []
    return [name.strip() for name in report_to.split(",") if name.strip()]
