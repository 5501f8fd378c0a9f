"""One process of a launch for tests/test_distributed_faults.py: `distributed_checks` under a real gloo process group.

    accelerate launch ... tests/distributed_faults_worker.py train OUTPUT_DIR DDP_TIMEOUT
        DDP on a linear layer, a checkpoint every 2 steps; after step 4 process 1 writes its id in
        OUTPUT_DIR/ready-1 and sleeps while process 0 begins to save step 4 and waits for it there:
        the test then kills or stops process 1.
    accelerate launch ... tests/distributed_faults_worker.py shared OUTPUT_DIR WAIT_SECONDS
        the shared-folder check, before the main process has the folder and after it made it.
    accelerate launch ... tests/distributed_faults_worker.py versions RANK
        the version check, with process RANK claiming another scratchbert.

Errors are reported as the commands report them (`report_errors`): one line, exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState

from scratchbert.commands.report import report_errors
from scratchbert.training.pretraining import checkpoint as ckpt
from scratchbert.training.pretraining import processes
from scratchbert.training.pretraining.processes import start_processes


def train(output_dir: Path, ddp_timeout: float) -> None:
    start_processes(ddp_timeout)
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    with processes.naming_lost_processes(output_dir, ddp_timeout):
        for step in range(1, 100_000):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            accelerator.backward(loss)  # DDP's all-reduce of the gradients
            optimizer.step()
            optimizer.zero_grad()
            if step == 4 and accelerator.process_index == 1:
                (output_dir / "ready-1").write_text(str(os.getpid()))
                time.sleep(3600)  # until the test kills or stops this process
            if step % 2 == 0:
                ckpt.save_checkpoint(accelerator, output_dir, step, {"step": step, "epoch": 0, "batches_in_epoch": step, "config": {}}, 2)


def shared(output_dir: Path, wait_seconds: float) -> None:
    state = start_processes(60)
    processes.check_shared_output_dir(state, output_dir, wait_seconds)  # as setup, before the folder is made
    if state.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
    state.wait_for_everyone()
    processes.check_shared_output_dir(state, output_dir, wait_seconds)  # and once it is
    left = sorted(path.name for path in [*output_dir.iterdir(), *output_dir.parent.iterdir()] if path.name.startswith("."))
    print(f"process {state.process_index}: shared; hidden files left {left}")


def versions(odd_rank: int) -> None:
    state = start_processes(60)
    installed = processes.installed_versions()
    if state.process_index == odd_rank:
        installed["scratchbert"] = "0.0.1 (source 0123456789ab)"
    processes.check_same_versions(state, installed)
    print(f"process {state.process_index}: same versions")


def run(args: argparse.Namespace) -> None:
    if args.scenario == "train":
        train(Path(args.values[0]), float(args.values[1]))
    elif args.scenario == "shared":
        shared(Path(args.values[0]), float(args.values[1]))
    else:
        versions(int(args.values[0]))
    # Ended before the interpreter is: gloo's threads still running at interpreter exit abort the
    # process now and then ("terminate called without an active exception"), failing the launch.
    PartialState().destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=("train", "shared", "versions"))
    parser.add_argument("values", nargs="*")
    sys.exit(report_errors(run, parser.parse_args(), "scratchbert pretrain"))
