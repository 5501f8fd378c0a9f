"""Run configurations as dataclasses: YAML/JSON files, command-line flags, and where each value came from.

A run configuration (`PretrainConfig`, `FinetuneConfig`) is a dataclass whose fields carry
`metadata={"help": ...}` (and optionally "choices", "flag", "metavar", "positional", "file_only").
`add_config_arguments` turns the fields into flags, grouped by the dataclass that declares
them (as transformers' example scripts group model, data and training arguments);
`config_from_args` layers the flags the user typed over a `--config` file. This module knows
nothing about any one job, so fine-tuning uses it without importing the pretraining code.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import typing
from pathlib import Path

import yaml

from scratchbert.errors import MissingFileError, ScratchBertError


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


__all__ = ["ConfigFile", "add_config_arguments", "config_from_args", "format_sources", "numbers_read_as_text", "read_config_file", "resolve_args"]
