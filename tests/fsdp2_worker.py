"""One launch of tests/test_fsdp2.py: a few AdamW steps of a tiny ScratchBertForMaskedLM, sharded on 2 CPU processes.

Started by `accelerate launch` itself, so the FSDP settings are the ones its flags put in the
environment (FSDP_VERSION, FSDP_RESHARD_AFTER_FORWARD, FSDP_STATE_DICT_TYPE, ...):

    accelerate launch --use_fsdp --fsdp_version 2 --num_processes 2 \
        tests/fsdp2_worker.py OUT --steps 6 --save-at 3 --ddp-reference --accelerate-wrapping
    accelerate launch --use_fsdp --fsdp_version 2 --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP --num_processes 2 \
        tests/fsdp2_worker.py OUT2 --steps 6 --resume-from OUT/checkpoints/step-3

Accelerate shards only on accelerator devices: on a CPU, `PartialState` calls a launch
MULTI_CPU and `AcceleratorState` then drops the FSDP plugin (a plain DDP run). `fsdp_accelerator`
starts the process group as on a CPU (gloo, device cpu) and names its type as a GPU launch's
(MULTI_GPU) before the Accelerator is built; from there accelerate's own code runs unchanged:
the plugin from the FSDP_* variables, `prepare` (the optimizer's parameters swapped for the
sharded ones), `backward`, `get_state_dict`, and `save_state`/`load_state` through
torch.distributed.checkpoint.

The model is sharded by `scratchbert.training.pretraining.sharding.shard` before `prepare`, as the pretrain
loop would; `--accelerate-wrapping` first records what a step does when accelerate's own
`fsdp2_prepare_model` shards it instead. Each launch trains with scratchbert's AdamW (`adamw`,
fused on CPU), parameter groups and schedule, checkpoints with `checkpoint.save_checkpoint` /
`load_checkpoint` and saves the final model with `checkpoint.save_final_model`, as `scratchbert
pretrain` does. `--ddp-reference` first trains the same model on the same batches under torch's
DistributedDataParallel. The main process writes OUT/report.json (losses, how the model was
sharded), OUT/model/ (the final model) and OUT/ddp.safetensors (the DDP run's final weights).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import tempfile
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType
from safetensors.torch import save_file
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from scratchbert import ScratchBertConfig, ScratchBertForMaskedLM
from scratchbert.tokenization import tokenizer_from_vocab
from scratchbert.training.pretraining import checkpoint as ckpt
from scratchbert.training.pretraining.checkpoint import save_final_model
from scratchbert.training.pretraining.optimization import adamw, make_scheduler, parameter_groups
from scratchbert.training.pretraining.sharding import shard

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB_SIZE, GLOBAL_BATCH, SEQ_LENGTH, MASK_SHARE = 100, 8, 16, 0.3
MICRO_BATCHES = 2  # per process and step: gradients exchanged once, after the last
LEARNING_RATE, WEIGHT_DECAY, MAX_GRAD_NORM = 5e-3, 0.01, 1.0  # the pretrain default's clipping


def fsdp_accelerator() -> Accelerator:
    """The Accelerator a GPU launch of the same `accelerate launch --use_fsdp` flags gets, on CPU over gloo."""
    state = PartialState(cpu=True)
    assert state.distributed_type == DistributedType.MULTI_CPU and state.backend == "gloo", (state.distributed_type, state.backend)
    state.distributed_type = DistributedType.MULTI_GPU  # what PartialState says on GPUs: AcceleratorState makes it FSDP
    accelerator = Accelerator(cpu=True, step_scheduler_with_optimizer=False)
    assert accelerator.is_fsdp2 and accelerator.device.type == "cpu", (accelerator.distributed_type, accelerator.device)
    return accelerator


def tiny_model() -> ScratchBertForMaskedLM:
    torch.manual_seed(0)
    config = ScratchBertConfig(
        vocab_size=VOCAB_SIZE, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=SEQ_LENGTH,
    )  # fmt: skip
    return ScratchBertForMaskedLM(config)


def tiny_tokenizer():
    """A WordPiece tokenizer of the model's VOCAB_SIZE tokens, so the saved folder is a whole model folder."""
    words = SPECIAL_TOKENS + [f"w{i}" for i in range(VOCAB_SIZE - len(SPECIAL_TOKENS))]
    with tempfile.TemporaryDirectory() as folder:  # one per process
        (Path(folder) / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
        return tokenizer_from_vocab(Path(folder) / "vocab.txt")


def batch(step: int, rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """This rank's share of step `step`'s global batch: the same examples whatever the engine. (B/N, S) each."""
    generator = torch.Generator().manual_seed(1000 + step)
    input_ids = torch.randint(len(SPECIAL_TOKENS), VOCAB_SIZE, (GLOBAL_BATCH, SEQ_LENGTH), generator=generator)
    chosen = torch.rand(GLOBAL_BATCH, SEQ_LENGTH, generator=generator) < MASK_SHARE
    chosen[:, 0] = True  # at least one prediction per row
    labels = torch.where(chosen, input_ids, -100)
    input_ids = torch.where(chosen, SPECIAL_TOKENS.index("[MASK]"), input_ids)
    rows = slice(rank * GLOBAL_BATCH // world_size, (rank + 1) * GLOBAL_BATCH // world_size)
    return {"input_ids": input_ids[rows], "attention_mask": torch.ones_like(input_ids[rows]), "labels": labels[rows]}


def optimizer_and_schedule(model, steps: int, device: torch.device):
    optimizer = adamw(parameter_groups(model, WEIGHT_DECAY), device, lr=LEARNING_RATE, betas=(0.9, 0.98), eps=1e-6)
    scheduler, _ = make_scheduler(optimizer, steps, warmup_ratio=0.34, time_budget=None)
    return optimizer, scheduler


def sharding_report(model) -> dict:
    """Which modules became FSDP units, and which parameters more than one module holds (the tied ones)."""
    holders: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        holders.setdefault(id(parameter), []).append(name)
    return {
        "units": [name or "<root>" for name, module in model.named_modules() if isinstance(module, FSDPModule)],
        "tied": sorted(names for names in holders.values() if len(names) > 1),
        "decoder_weight_is_word_embeddings": model.get_output_embeddings().weight is model.get_input_embeddings().weight,
        "parameter_types": sorted({type(p).__name__ for p in model.parameters()}),
    }


def optimizer_step(model, optimizer, scheduler, step: int, accelerator: Accelerator, under_ddp: bool) -> dict:
    """One step as the pretrain loop takes it: micro-batches (no gradient exchange before the last),
    clipping to MAX_GRAD_NORM, AdamW, the schedule. Returns each rank's loss and the gradient norm."""
    rows = batch(step, accelerator.process_index, accelerator.num_processes)
    parts = [dict(zip(rows, values)) for values in zip(*(tensor.chunk(MICRO_BATCHES) for tensor in rows.values()))]
    total = torch.zeros(())
    for number, part in enumerate(parts):
        last = number == len(parts) - 1
        exchange = contextlib.nullcontext() if last else model.no_sync() if under_ddp else accelerator.no_sync(model)
        with exchange:
            loss = model(**part).loss / len(parts)
            loss.backward() if under_ddp else accelerator.backward(loss)
        total += loss.detach()
    clip = torch.nn.utils.clip_grad_norm_ if under_ddp else accelerator.clip_grad_norm_
    norm = clip(model.parameters(), MAX_GRAD_NORM)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
    return {"losses": accelerator.gather(total[None]).tolist(), "grad_norm": norm.item()}


def ddp_reference(accelerator: Accelerator, steps: int) -> tuple[dict, dict]:
    """The same model, batches, optimizer and schedule under torch's DDP: each step's record, final weights."""
    model = tiny_model()
    optimizer, scheduler = optimizer_and_schedule(model, steps, accelerator.device)
    ddp = DistributedDataParallel(model)
    records = {step: optimizer_step(ddp, optimizer, scheduler, step, accelerator, under_ddp=True) for step in range(1, steps + 1)}
    return records, {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def accelerate_wrapping(accelerator: Accelerator) -> str:
    """What a first step does when accelerate's `fsdp2_prepare_model` shards the model itself: "ok" or the error."""
    model = tiny_model()
    optimizer, _ = optimizer_and_schedule(model, 1, accelerator.device)
    model, optimizer = accelerator.prepare(model, optimizer)
    try:
        model(**batch(1, accelerator.process_index, accelerator.num_processes)).loss.backward()
    except ValueError as error:  # raised on every rank before any collective, so the launch goes on
        return str(error)
    finally:  # this model is not the run's: save_state must not see it
        accelerator._models.clear()
        accelerator._optimizers.clear()
    return "ok"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-at", type=int, default=0, help="save a checkpoint after this step")
    parser.add_argument("--resume-from", type=Path, help="a checkpoint of an earlier launch to continue")
    parser.add_argument("--ddp-reference", action="store_true", help="first train the same steps under DDP")
    parser.add_argument("--accelerate-wrapping", action="store_true", help="first try accelerate's own sharding of the model")
    args = parser.parse_args()

    accelerator = fsdp_accelerator()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    report = {}
    if args.ddp_reference:
        report["ddp_steps"], ddp_weights = ddp_reference(accelerator, args.steps)
        if accelerator.is_main_process:
            save_file(ddp_weights, args.output_dir / "ddp.safetensors")

    if args.accelerate_wrapping:
        report["accelerate_wrapping"] = accelerate_wrapping(accelerator)
    model = shard(tiny_model(), accelerator)
    optimizer, scheduler = optimizer_and_schedule(model, args.steps, accelerator.device)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    report["sharding"] = sharding_report(model)
    first_step = 1
    if args.resume_from is not None:
        first_step = ckpt.load_checkpoint(accelerator, args.resume_from)["step"] + 1
        report["sharding_after_resume"] = sharding_report(model)
    report["steps"] = {}
    for step in range(first_step, args.steps + 1):
        report["steps"][step] = optimizer_step(model, optimizer, scheduler, step, accelerator, under_ddp=False)
        if step == args.save_at:
            trainer_state = {"step": step, "epoch": 0, "batches_in_epoch": step, "config": {}}
            ckpt.save_checkpoint(accelerator, args.output_dir, step, trainer_state, keep_last=2)
    report["sharding_at_end"] = sharding_report(model)
    save_final_model(accelerator, model, tiny_tokenizer(), args.output_dir / "model", finetune_dropout=0.0)
    if accelerator.is_main_process:
        report["checkpoints"] = {path.name: sorted(os.listdir(path)) for _, path in ckpt.list_checkpoints(args.output_dir)}
        (args.output_dir / "report.json").write_text(json.dumps(report, indent=1))
    # As `loop.shut_down`: every reference to what holds the process group dropped and collected, all ranks
    # waited for, and only then the group destroyed (gloo threads left at interpreter exit abort the process).
    del model, optimizer, scheduler
    accelerator.free_memory()
    gc.collect()
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
