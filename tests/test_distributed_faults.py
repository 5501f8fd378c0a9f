"""Distributed faults end in one line that names the fix (`scratchbert.training.pretraining.processes`).

The launches are two "machines" on this one: `accelerate launch --num_machines 2 --machine_rank 0|1
--main_process_ip 127.0.0.1`, one process each, gloo. Each launcher then knows only its own process,
as on two real machines, so nothing but the process group tells a process that the other is gone.
The processes run tests/distributed_faults_worker.py, which calls the checks as `pretrain` does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from conftest import first_documents_file, python_path

from scratchbert.errors import ScratchBertError
from scratchbert.training.pretraining import processes
from scratchbert.training.pretraining.processes import LostProcessError

REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("distributed_faults_worker.py")
PREFIX = "scratchbert pretrain: error: "

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the launches use POSIX signals")


class Machines:
    """The launches of one run, one per "machine"; `finish` waits for all (killing what is left at `timeout`) and returns what each printed."""

    def __init__(self, tmp_path: Path, port: int, args_of_machine, machines: int = 2):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": python_path(REPO), "CUDA_VISIBLE_DEVICES": ""}
        self.logs = [tmp_path / f"machine-{rank}.log" for rank in range(machines)]
        self.launches = []
        for rank, log in enumerate(self.logs):
            command = [
                sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", str(machines), "--machine_rank", str(rank),
                "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), "--num_processes", str(machines),
                "--mixed_precision", "no", "--dynamo_backend", "no", str(WORKER), *args_of_machine(rank),
            ]  # fmt: skip
            with open(log, "w") as out:  # own sessions: a test kills only the processes it started
                self.launches.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, start_new_session=True))

    def finish(self, timeout: float) -> tuple[list[int | None], list[str]]:
        deadline = time.monotonic() + timeout
        codes = []
        for launch in self.launches:
            try:
                codes.append(launch.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        self.kill()
        return codes, [log.read_text() for log in self.logs]

    def kill(self) -> None:
        for launch in self.launches:
            if launch.poll() is None:
                os.killpg(launch.pid, signal.SIGKILL)
                launch.wait()


def wait_for(condition, timeout: float, machines: Machines) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline or any(launch.poll() is not None for launch in machines.launches):
            machines.kill()
            pytest.fail("the launch never got ready:\n" + "\n".join(log.read_text()[-3000:] for log in machines.logs))
        time.sleep(0.2)


def failed(codes: list[int | None]) -> bool:
    """Both launches ended, with the failure status of a launch whose process failed (its own status, 2, is the launcher's 1)."""
    return all(code not in (0, None) for code in codes)


def errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(PREFIX)]


def start_training_and_hit_process_1(tmp_path: Path, port: int, sig: int, ddp_timeout: float, machines: int = 2) -> tuple[float, list, list[str], Path]:
    """Train until process 1 sleeps before the save of step 4, send it `sig`; (seconds until machine 0 stopped, exit statuses, outputs, the run's folder)."""
    output_dir = tmp_path / "run"
    output_dir.mkdir()
    machines = Machines(tmp_path, port, lambda rank: ["train", str(output_dir), str(ddp_timeout)], machines)
    ready, saving = output_dir / "ready-1", output_dir / "checkpoints" / ".tmp-step-4"
    wait_for(lambda: ready.exists() and ready.read_text() and saving.is_dir(), 120, machines)
    victim = int(ready.read_text())
    os.kill(victim, sig)
    hit = time.monotonic()
    try:
        for launch in machines.launches[:1] + machines.launches[2:]:
            launch.wait(timeout=ddp_timeout + 60)
    except subprocess.TimeoutExpired:
        pass
    seconds = time.monotonic() - hit  # until every machine but the one hit stopped
    if sig == signal.SIGSTOP:
        os.kill(victim, signal.SIGKILL)
    codes, outputs = machines.finish(timeout=30)
    return seconds, codes, outputs, output_dir


def test_a_killed_process_is_named_by_the_other_machine_with_the_last_checkpoint_and_resume(tmp_path):
    """kill -9 of process 1 while process 0 waits for it in the save of step 4: process 0 stops at
    once (its socket closes) with one line naming process 1, the last complete checkpoint (step 2,
    step 4 never completed) and --resume."""
    seconds, codes, outputs, output_dir = start_training_and_hit_process_1(tmp_path, 29531, signal.SIGKILL, ddp_timeout=600)
    assert codes[0] not in (0, None) and seconds < 30, (seconds, outputs[0][-3000:])
    lines = errors(outputs[0])
    assert len(lines) == 1, outputs[0][-3000:]
    assert lines[0].startswith(PREFIX + "process 1 of 2 is gone (it closed its connection: failed, killed, or its machine went down"), lines[0]
    assert f"the last complete checkpoint, {output_dir / 'checkpoints' / 'step-2'}:" in lines[0] and "with --resume" in lines[0]
    assert [path.name for path in (output_dir / "checkpoints").iterdir() if not path.name.startswith(".")] == ["step-2"]


def test_with_three_machines_the_survivors_name_the_killed_process_by_its_heartbeat(tmp_path):
    """With three, an error does not say which process is gone (a process may be waiting on a survivor);
    the heartbeats do. Only process 0 prints it, and every survivor stops."""
    seconds, codes, outputs, output_dir = start_training_and_hit_process_1(tmp_path, 29543, signal.SIGKILL, ddp_timeout=600, machines=3)
    assert codes[0] not in (0, None) and codes[2] not in (0, None) and seconds < 40, (seconds, outputs[0][-3000:])
    assert [len(errors(output)) for output in outputs] == [1, 0, 0], outputs
    assert errors(outputs[0])[0].startswith(PREFIX + "process 1 of 3 is gone"), errors(outputs[0])


def test_a_hung_process_is_named_at_the_deadline(tmp_path):
    """A stopped process (a hung one, or a machine gone from the network) closes nothing: process 0
    stops at ddp_timeout (8 s here), naming process 1 and the option."""
    seconds, codes, outputs, output_dir = start_training_and_hit_process_1(tmp_path, 29533, signal.SIGSTOP, ddp_timeout=8)
    assert codes[0] not in (0, None) and 8 <= seconds < 40, (seconds, outputs[0][-3000:])
    lines = errors(outputs[0])
    assert len(lines) == 1, outputs[0][-3000:]
    assert lines[0].startswith(PREFIX + "process 1 of 2 did not answer within 8 s (ddp_timeout in a --config file)"), lines[0]
    assert "step-2" in lines[0] and "with --resume" in lines[0]


def test_an_output_folder_the_machines_do_not_share_is_refused_before_anything_is_written(tmp_path):
    """Each machine with a disk of its own (machine-0/, machine-1/ here) and --output-dir on it: the main
    process's file in the folder's parent, where the run will make it, is not seen by process 1. Refused
    once, naming the fix, before the folder is made. (Process 1 looks for 1 s here, `SHARED_FOLDER_WAIT` by default.)"""
    for rank in (0, 1):
        (tmp_path / f"machine-{rank}").mkdir()
    machines = Machines(tmp_path, 29535, lambda rank: ["shared", str(tmp_path / f"machine-{rank}" / "run"), "1"])
    codes, outputs = machines.finish(timeout=90)
    assert failed(codes), outputs
    lines = errors(outputs[0]) + errors(outputs[1])
    assert len(lines) == 1 and lines == errors(outputs[0]), outputs
    assert lines[0].startswith(PREFIX + f"--output-dir {tmp_path / 'machine-0' / 'run'} is not shared between the machines: process 1 on "), lines[0]
    assert f"does not see in {tmp_path / 'machine-1'} the file process 0 (on " in lines[0] and f"just wrote in {tmp_path / 'machine-0'}." in lines[0]
    assert "a file system that every machine mounts" in lines[0]
    assert list((tmp_path / "machine-0").iterdir()) == []  # no folder made, the check's file gone


def test_a_folder_only_another_machine_has_is_refused(tmp_path):
    """Process 1 has its own folder at that place (something mounted there on its machine only) where the main process has none."""
    (tmp_path / "machine-1").mkdir()
    machines = Machines(tmp_path, 29537, lambda rank: ["shared", str(tmp_path / ("fresh" if rank == 0 else "machine-1")), "1"])
    codes, outputs = machines.finish(timeout=90)
    assert failed(codes) and len(errors(outputs[0])) == 1 and not errors(outputs[1]), outputs
    fresh = tmp_path / "fresh"
    assert f"--output-dir {fresh} is not shared between the machines: process 1 on " in outputs[0]
    assert f" already has a folder {fresh} where process 0 has none." in outputs[0] and "remove a machine's own copy" in outputs[0]
    assert not fresh.exists()


def test_a_shared_output_folder_passes_and_is_left_as_it_was(tmp_path):
    """The same folder for both (one file system, as with NFS): checked before and after it is made, no error, nothing left."""
    machines = Machines(tmp_path, 29539, lambda rank: ["shared", str(tmp_path / "shared" / "run"), "1"])
    codes, outputs = machines.finish(timeout=90)
    assert codes == [0, 0], outputs
    assert "process 0: shared; hidden files left []" in outputs[0] and "process 1: shared; hidden files left []" in outputs[1], outputs


def test_processes_with_different_versions_are_refused_with_which_has_which(tmp_path):
    machines = Machines(tmp_path, 29541, lambda rank: ["versions", "1"])
    codes, outputs = machines.finish(timeout=90)
    assert failed(codes), outputs
    lines = errors(outputs[0]) + errors(outputs[1])
    assert len(lines) == 1, outputs
    ours = processes.installed_versions()["scratchbert"]
    assert f"different software: scratchbert {ours} on process 0 (" in lines[0], lines[0]
    assert "0.0.1 (source 0123456789ab) on process 1 (" in lines[0] and "Install the same versions on every machine" in lines[0]
    assert "torch" not in lines[0].split("Install")[0].replace("scratchbert", "")  # only what differs is named


# --- in one process ---------------------------------------------------------------------


def test_version_differences_name_each_package_that_differs_once():
    same = {"scratchbert": "0.1.0 (source a)", "torch": "2.13.0"}
    reports = [("a", same), ("a", same), ("b", {**same, "torch": "2.12.0"}), ("b", {**same, "torch": "2.12.0"})]
    assert processes.version_differences(reports[:2]) == ""
    assert processes.version_differences(reports) == "torch 2.13.0 on processes 0, 1 (a), 2.12.0 on processes 2, 3 (b)"


def test_the_processes_whose_heartbeat_stopped_are_the_ones_named():
    """With more than two processes a survivor reads the others' heartbeats in the launch's store: here 0 and 2 beat."""
    store = dist.HashStore()
    beating = [processes.Heartbeat(store, rank, interval=0.05) for rank in (0, 2)]
    store.add(f"{processes.HEARTBEAT_KEY}3", 1)  # process 3 beat once, then died
    try:
        assert processes.silent_processes(store, 4, wait_seconds=0.5) == [1, 3]
    finally:
        for heartbeat in beating:
            heartbeat.stop()
    assert processes.silent_processes(None, 4) is None


def test_errors_of_a_run_in_one_process_pass_through():
    with pytest.raises(RuntimeError, match="Connection reset by peer"):
        with processes.naming_lost_processes("nowhere"):
            raise RuntimeError("gloo: Connection reset by peer")
    assert not issubclass(RuntimeError, LostProcessError)


def test_the_timeout_must_be_a_positive_number_of_seconds():
    assert processes.collective_timeout(90) == timedelta(seconds=90)
    for bad in (0, -1, float("inf"), True, "60"):
        with pytest.raises(ScratchBertError, match="ddp_timeout: 1800 in a --config file"):
            processes.collective_timeout(bad)


def test_the_pretrain_command_names_a_killed_process_of_another_machine(tmp_path):
    """The real command, wired as a user runs it: two "machines" of `scratchbert pretrain`; machine 1's
    process killed (-9) once a checkpoint is saved. Machine 0 stops within seconds in one line naming
    process 1, the last complete checkpoint and --resume, and no checkpoint is left half-written."""
    import psutil
    from conftest import kill_tree
    from test_global_batch import two_machines

    from scratchbert.tokenization import train_tokenizer
    from scratchbert.training.pretraining import checkpoint as ckpt

    corpus = first_documents_file(tmp_path, documents=24, words=120)
    tokenizer = tmp_path / "tokenizer"
    train_tokenizer([str(corpus)], vocab_size=400, show_progress=False).save_pretrained(tokenizer)
    output_dir = tmp_path / "run"
    launches = two_machines(corpus, tokenizer, output_dir, 29557, batch_size=8, max_steps=100_000, save_every=3)
    deadline = time.monotonic() + 300
    while not ckpt.list_checkpoints(output_dir):
        assert time.monotonic() < deadline and all(launch.poll() is None for launch in launches), "no checkpoint"
        time.sleep(0.1)
    for worker in psutil.Process(launches[1].pid).children(recursive=True):  # machine 1's training process
        with contextlib.suppress(psutil.NoSuchProcess):
            worker.kill()
    killed = time.monotonic()
    try:
        output = launches[0].communicate(timeout=120)[0]
        seconds = time.monotonic() - killed
    finally:
        for launch in launches:
            kill_tree(launch.pid)
            launch.communicate()
    lines = [line for line in output.splitlines() if line.startswith(PREFIX)]
    assert len(lines) == 1 and lines[0].startswith(PREFIX + "process 1 of 2 is gone"), output[-3000:]
    assert "with --resume" in lines[0] and str(ckpt.list_checkpoints(output_dir)[-1][1]) in lines[0]
    assert seconds < 30, (seconds, output[-3000:])
    # Our process printed no traceback and exited 2; the one traceback is the launcher's report of it.
    assert "failed (exitcode: 2)" in output and output.index("Traceback") > output.index("failed (exitcode: 2)"), output[-3000:]
    assert all((path / "trainer_state.json").is_file() for _, path in ckpt.list_checkpoints(output_dir))  # each complete
