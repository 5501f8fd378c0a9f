"""What a training command sets up before it runs, the same in pretraining and fine-tuning: its
options, and the folder it writes. Nothing here knows about any one job, so fine-tuning uses it
without importing the pretraining code.

1. **Options.** A run configuration (`PretrainConfig`, `FinetuneConfig`) is a dataclass whose fields carry
`metadata={"help": ...}` (and optionally "choices", "flag", "metavar", "positional", "file_only").
`add_config_arguments` turns the fields into flags, grouped by the dataclass that declares
them (as transformers' example scripts group model, data and training arguments);
`config_from_args` layers the flags the user typed over a `--config` file. This module knows
nothing about any one job, so fine-tuning uses it without importing the pretraining code.
2. **The output folder.** `check_output_folder` is the one check of an `--output-dir` before any
   long work (it reads only); `OutputDirLock` then lets one run at a time write there, held by
   `scratchbert pretrain` and `finetune`.
3. **Progress bars.** `--no-progress-bar` silences datasets' and transformers' bars too (`progress_bars`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import socket
import time
import typing
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml
from accelerate import Accelerator, PartialState
from accelerate.utils import broadcast_object_list

from scratchbert.errors import MissingFileError, ScratchBertError

try:
    import fcntl
except ImportError:  # Windows: runs are not locked
    fcntl = None


# ---------------------------------------------------------------------------------------------
# 1. Options: a dataclass read from flags over a --config file, and where each value came from
# ---------------------------------------------------------------------------------------------
class ConfigFile:
    """What every run configuration (a dataclass) can do with files: save, load, layer.

    `JOB` names the job in messages ("pretraining", "fine-tuning"). `VERSION`, when set, is
    written into saved files as "config_version"; `upgrade` reads older saves in today's terms.
    """

    JOB = "run"
    VERSION: int | None = None
    RENAMED_OPTIONS: dict[str, str] = {}  # an option's old name -> today's: files saved before a rename still load

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_saved_dict(self) -> dict:
        """`to_dict` with the format's version: what a run writes next to its results."""
        return {"config_version": self.VERSION, **self.to_dict()} if self.VERSION is not None else self.to_dict()

    def save(self, path: str | Path) -> None:
        """Write the resolved configuration as JSON (it reloads with `from_file`).

        Atomically: written beside `path`, then renamed over it, so a failed write (a full disk)
        leaves the file that was there whole.
        """
        path = Path(path)
        partial = path.with_name(f".{path.name}.partial")
        try:
            partial.write_text(json.dumps(self.to_saved_dict(), indent=2) + "\n", encoding="utf-8")
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)

    @classmethod
    def upgrade(cls, values: dict) -> dict:
        """Saved values in today's terms: renamed options under today's name (a hook for more)."""
        for old, new in cls.RENAMED_OPTIONS.items():
            if old in values:
                values.setdefault(new, values.pop(old))
        return values

    def default_layers(self) -> dict[str, str]:
        """For the options this configuration filled in itself: the layer each came from (see `resolve`)."""
        return {}

    @classmethod
    def from_values(cls, values: dict):
        """The configuration of `values`, which are in today's terms; unknown names are refused."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ScratchBertError(f"unknown {cls.JOB} option(s): {', '.join(unknown)}. Known options: {', '.join(sorted(known))}.")
        return cls(**values)

    @classmethod
    def from_dict(cls, values: dict):
        """The configuration of a saved or hand-written mapping (upgraded first)."""
        return cls.from_values(cls.upgrade(dict(values)))

    @classmethod
    def from_file(cls, path: str | Path, **overrides):
        """Load a YAML (.yaml/.yml) or JSON (.json) file; `overrides` win over its values."""
        return cls.resolve(read_config_file(path), overrides)[0]

    @classmethod
    def resolve(cls, file_values: dict | None = None, flag_values: dict | None = None):
        """The configuration, and the source of each option's value: "flag" > "file" > the layers
        the configuration fills in itself (`default_layers`) > "default"."""
        file_values = numbers_read_as_text(cls, cls.upgrade(dict(file_values))) if file_values else {}
        flag_values = dict(flag_values or {})
        config = cls.from_values({**file_values, **flag_values})
        layers = config.default_layers()
        sources = {}
        for f in dataclasses.fields(cls):
            sources[f.name] = "flag" if f.name in flag_values else "file" if f.name in file_values else layers.get(f.name, "default")
        return config, sources


def numbers_read_as_text(config_class: type, values: dict) -> dict:
    """`values` with each number a file wrote as text made a number again, for the options that take one.

    YAML 1.1 (PyYAML's) reads `1e-3` and `5e5` as strings: its floats need a dot and a signed
    exponent (`1.0e-3`). A string in a numeric option that is a number means that number; any
    other string there is refused, naming the option and the fix.
    """
    hints = typing.get_type_hints(config_class)
    converted = dict(values)
    for name, value in values.items():
        kind = _number_kind(hints.get(name))
        if kind is None or not isinstance(value, str):
            continue
        number = _parse_number(value, kind)
        if number is None:
            example = {int: "1000", float: "0.001"}[kind]
            raise ScratchBertError(
                f"option {name} in the --config file is {value!r}, which is not {'an integer' if kind is int else 'a number'}: "
                f"write a number there, e.g. `{name}: {example}`."
            )
        converted[name] = number
    return converted


def _number_kind(hint) -> type | None:
    """int or float when an option of type `hint` takes a number (`float | None` included), else None."""
    kinds = {a for a in typing.get_args(hint) if a is not type(None)} if typing.get_args(hint) else {hint}
    return next(iter(kinds)) if len(kinds) == 1 and kinds <= {int, float} else None


def _parse_number(text: str, kind: type) -> int | float | None:
    """The number `text` writes (an int only if whole, for an int option), or None."""
    try:
        number = float(text.strip())
    except ValueError:
        return None
    if not math.isfinite(number):
        return None
    if kind is float:
        return number
    return int(number) if number.is_integer() else None


def format_sources(config: ConfigFile, sources: dict[str, str]) -> str:
    """The resolved configuration as a table: option, value, and where the value came from."""
    width = max(len(name) for name in sources)
    rows = [f"{'option':<{width}}  {'source':<7}  value"]
    rows += [f"{name:<{width}}  {sources[name]:<7}  {value!r}" for name, value in config.to_dict().items()]
    return "\n".join(rows)


def read_config_file(path: str | Path) -> dict:
    """The mapping stored in a YAML or JSON configuration file."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"configuration file {path} does not exist.")
    text = path.read_text(encoding="utf-8")
    try:
        values = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ScratchBertError(f"could not parse {path}: {err}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ScratchBertError(f"{path} must hold a mapping of option names to values, not a {type(values).__name__}.")
    return {key.replace("-", "_"): value for key, value in values.items()}


# --- command line -------------------------------------------------------------------


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _groups(parser: argparse.ArgumentParser, config_class: type) -> dict[str, argparse._ArgumentGroup]:
    """One argument group per dataclass base that declares fields (its docstring's first line as title)."""
    groups = {}
    for base in reversed(config_class.__mro__):
        declared = [name for name in vars(base).get("__annotations__", {}) if name in getattr(base, "__dataclass_fields__", {})]
        if declared and base is not config_class:
            group = parser.add_argument_group((base.__doc__ or base.__name__).strip().splitlines()[0])
            groups.update(dict.fromkeys(declared, group))
    return groups


def add_config_arguments(parser: argparse.ArgumentParser, config_class: type, only: frozenset[str] | None = None) -> None:
    """One flag per field of `config_class`, plus `--config FILE`.

    A field's metadata gives its help text, and optionally "choices", "flag" (its flag name
    when it is not the field's), "positional" and "file_only" (no flag: set in the --config file,
    as rarely changed optimiser constants are). `only`: the fields that get a flag (a command
    that takes a few of the configuration's options; "file_only" does not apply then). Flags
    default to `argparse.SUPPRESS`, so the parsed namespace holds only what the user typed;
    `config_from_args` layers those over the file and the configuration's own defaults.
    """
    fields = [f for f in dataclasses.fields(config_class) if (f.name in only if only is not None else not f.metadata.get("file_only"))]
    file_only = [f.name for f in dataclasses.fields(config_class) if f not in fields and f.metadata.get("file_only")]
    more = f"; also sets the options without a flag: {', '.join(file_only)}" if file_only and only is None else ""
    parser.add_argument("--config", metavar="FILE", help=f"YAML or JSON file of options (flags override it){more}")
    hints = typing.get_type_hints(config_class)
    groups = _groups(parser, config_class)
    for f in fields:
        kind, meta = hints[f.name], f.metadata
        help_text = meta.get("help", "")
        if f.default not in (dataclasses.MISSING, None) and "default" not in help_text:
            help_text += f" (default: {f.default})"
        names = [f.name] if meta.get("positional") else [meta.get("flag", _flag(f.name))]
        options: dict = {"default": argparse.SUPPRESS, "help": help_text, "dest": f.name}
        if meta.get("positional"):
            options.pop("dest")
            options["nargs"] = "?"
        target = groups.get(f.name, parser)
        args = typing.get_args(kind)
        if kind is bool or (typing.get_origin(kind) is not list and set(args) == {bool, type(None)}):
            target.add_argument(*names, action=argparse.BooleanOptionalAction, **options)
        elif typing.get_origin(kind) is list or list in {typing.get_origin(a) for a in args}:
            target.add_argument(*names, nargs="+", metavar=meta.get("metavar", "PATH"), **options)
        else:
            base = next((a for a in args if a is not type(None)), kind) if args else kind
            if "choices" in meta:
                options["choices"] = list(meta["choices"])
            elif not meta.get("positional"):
                options["metavar"] = meta.get("metavar", {int: "N", float: "X"}.get(base, "VALUE"))
            target.add_argument(*names, type=base, **options)


def resolve_args(args: argparse.Namespace, config_class: type, under_file: dict | None = None):
    """`config_class.resolve` of the `--config` file and the flags the user typed: (config, sources).

    `under_file`: values below the file's (e.g. a prepared-data folder's options), reported as "file".
    """
    names = {f.name for f in dataclasses.fields(config_class)}
    typed = {name: value for name, value in vars(args).items() if name in names}
    values = read_config_file(args.config) if getattr(args, "config", None) else {}
    return config_class.resolve({**(under_file or {}), **values}, typed)


def config_from_args(args: argparse.Namespace, config_class: type):
    """Build the configuration: its own defaults < `--config` file < flags typed by the user."""
    return resolve_args(args, config_class)[0]


# ---------------------------------------------------------------------------------------------
# 2. The output folder: checked before any long work, then held by one run at a time
# ---------------------------------------------------------------------------------------------


LOCK_FILE = ".scratchbert.lock"  # while a run writes in a folder: which process holds it

logger = logging.getLogger(__name__)


class OutputDirLock:
    """One run at a time per output folder: an exclusive lock on the folder itself.

    A second run given the same --output-dir (a second terminal, a job started twice), here or on
    another machine that shares the folder, stops with an error instead of writing its
    checkpoints between the first run's or, with --overwrite, deleting them. The lock is the
    operating system's (`flock` on the folder), so it ends with the process that holds it: a run
    that was killed leaves nothing to clean up, and a run refused for bad input writes nothing.
    Once the run writes, `LOCK_FILE` says who holds the folder, for the error a second run
    gives. The main process holds it; on a file system without locks (some network mounts), or
    on Windows, runs are not locked. `kind` names the run in that file ("scratchbert pretrain").

    A folder that did not exist at the first `claim` is locked only once the run makes it, so
    another run may have written there meanwhile: `claim(..., recheck=...)` looks again, under
    the lock and before the first write (`folder_existed` says which case it is).
    """

    def __init__(self, output_dir: str | os.PathLike, kind: str):
        self.folder = Path(output_dir)
        self.kind = kind
        self._fd: int | None = None
        self.folder_existed: bool | None = None  # at the first claim (main process)

    def __enter__(self) -> OutputDirLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def claim(self, state: Accelerator | PartialState, writing: bool = False, recheck: Callable[[], str | None] | None = None) -> None:
        """Hold the lock if the folder exists (a no-op once held); raise on every process if another run holds it.

        writing: the run writes there from now on, so the folder is made first, and once held it
        says who holds it.
        recheck: called on the main process once the lock is held, before anything is written:
        a message refuses the folder (e.g. another run finished there meanwhile).
        """
        refused = None
        if state.is_main_process:
            if self.folder_existed is None:
                self.folder_existed = self.folder.is_dir()
            try:
                refused = self._claim_here(writing, recheck)
            except PermissionError as error:  # a read-only folder (the holder's note cannot be written)
                refused = (
                    f"--output-dir {self.folder} is not writable ({error.strerror}: {error.filename}): "
                    "choose another --output-dir, or make it writable."
                )
        if state.num_processes > 1:  # only the main process knows, and every process must stop
            refused = broadcast_object_list([refused])[0]
        if refused:
            raise ScratchBertError(refused, every_process=True)

    def _claim_here(self, writing: bool, recheck: Callable[[], str | None] | None) -> str | None:
        """The main process's part of `claim`: the message that refuses the folder, or None."""
        if writing:
            self.folder.mkdir(parents=True, exist_ok=True)
        refused = self._try_lock() if self._fd is None and self.folder.is_dir() else None
        if refused is None and recheck is not None:
            refused = recheck()
        if writing and refused is None:
            self._write_holder()
        return refused

    def _try_lock(self) -> str | None:
        """Lock the folder; the error message when another process holds it."""
        if fcntl is None:
            return None
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            try:
                holder = (self.folder / LOCK_FILE).read_text(encoding="utf-8").strip()
            except OSError:
                holder = "still checking its inputs"
            return f"{self.folder} is in use by another run ({holder}). Wait for it to end or stop it, or choose another --output-dir."
        except OSError as error:  # no locks on this file system: run unlocked
            os.close(fd)
            logger.debug("output folder %s not locked: %s", self.folder, error)
            return None
        self._fd = fd
        (self.folder / LOCK_FILE).unlink(missing_ok=True)  # a killed run's: it held the lock no longer
        return None

    def _write_holder(self) -> None:
        """Say who holds the folder, in `LOCK_FILE`."""
        if self._fd is not None:
            since = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            holder = f"{self.kind}, process {os.getpid()} on {socket.gethostname()}, since {since}"
            (self.folder / LOCK_FILE).write_text(holder + "\n", encoding="utf-8")

    def release(self) -> None:
        """Let the next run in."""
        if self._fd is not None:
            (self.folder / LOCK_FILE).unlink(missing_ok=True)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def folder_contents(path: Path) -> str | None:
    """What any command would replace in `path`: anything at all (None when it is empty or absent)."""
    return "files (it is not empty)" if path.is_dir() and any(path.iterdir()) else None


def check_output_folder(path: str | Path, overwrite: bool, *, resume: bool | None = None, held=folder_contents) -> Path:
    """The one check of an `--output-dir` before a command writes there (pretrain, prepare-data, finetune).

    path:      the folder the command will write.
    overwrite: --overwrite was passed: what the folder holds may be replaced (the caller deletes it,
               and only once its new inputs are known to be good).
    resume:    None for a command without --resume; True lets a folder that holds a run through
               (the caller then checks that the checkpoint belongs to this run).
    held:      path -> a description of what the command would replace there, or None when
               nothing; `folder_contents` (any file) unless the command knows better (`run_contents`).

    Reads the folder only and returns it as a Path. Raises a ScratchBertError when path is a file
    or cannot be written, or when it holds something and neither --overwrite nor --resume says
    what to do with it.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ScratchBertError(f"--output-dir {path} is a file, not a directory: choose another path.")
    check_writable(path)
    if overwrite or resume:
        return path
    contents = held(path)
    if contents is None:
        return path
    choices = "pass --resume to continue it, --overwrite to start over" if resume is not None else "pass --overwrite to replace it"
    raise ScratchBertError(f"--output-dir {path} already holds {contents}: {choices}, or choose another --output-dir.")


def check_writable(path: Path) -> None:
    """Refuse a folder the command could not write, before any long work: the folder itself, or
    the nearest existing folder above it, where it would be made."""
    existing = next(folder for folder in (path, *path.absolute().parents) if folder.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "it" if existing == path else f"{existing}, where it would be made,"
        raise ScratchBertError(
            f"--output-dir {path}: {where} is read-only for this user: choose another --output-dir, or make it writable."
        )


# ---------------------------------------------------------------------------------------------
# 3. Progress bars: --no-progress-bar silences the libraries' bars too
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def progress_bars(enabled: bool) -> Iterator[None]:
    """Inside the block the progress bars of datasets and transformers (saving a model) are off unless `enabled`.

    Their global switches are restored after. (With bars on, every `map` here shows one bar
    with its rate in documents per second, also when it runs in several processes.)
    """
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as transformers_logging

    switches = (
        (lambda: not are_progress_bars_disabled(), disable_progress_bars, enable_progress_bars),
        (transformers_logging.is_progress_bar_enabled, transformers_logging.disable_progress_bar, transformers_logging.enable_progress_bar),
    )
    switched_off = []
    for is_on, switch_off, switch_on in switches if not enabled else ():
        if is_on():
            switch_off()
            switched_off.append(switch_on)
    try:
        yield
    finally:
        for switch_on in switched_off:
            switch_on()


__all__ = [
    "LOCK_FILE",
    "ConfigFile",
    "OutputDirLock",
    "check_output_folder",
    "check_writable",
    "folder_contents",
    "add_config_arguments",
    "config_from_args",
    "format_sources",
    "numbers_read_as_text",
    "progress_bars",
    "read_config_file",
    "resolve_args",
]
