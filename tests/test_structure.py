"""The package's shape, as a reader meets it: short functions, and imports that run one way.

A library function does one job in at most 60 lines; the orchestrators, which read top to bottom
(`ORCHESTRATORS`: the fine-tuning run, the pretraining loop's setup and its step loop), may take up
to 100 where splitting would only nest calls. Two modules never import each other, except the one documented pair: the
model and its CPU fast path (`cpu_kernels` subclasses the model's modules, and the model swaps them
in by class when `config.cpu_kernels` is on). Fine-tuning imports nothing of pretraining.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "scratchbert"
MAX_FUNCTION_LINES = 60
MAX_ORCHESTRATOR_LINES = 100
ORCHESTRATORS = {
    "scratchbert.training.finetuning.run:finetune",
    "scratchbert.training.finetuning.question_answering:finetune_question_answering",
    "scratchbert.training.finetuning.token_classification:finetune_token_classification",
    "scratchbert.training.pretraining.loop:setup",
    "scratchbert.training.pretraining.loop:train",
}
DOCUMENTED_LOOPS = {("scratchbert.cpu_kernels", "scratchbert.modeling_scratchbert")}


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    named = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        named[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return named


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports, by absolute or relative import."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                stem = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(stem + ([node.module] if node.module else []))
            candidates = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found |= {candidate for candidate in candidates if candidate in known and candidate != name}
    return found


def test_no_library_function_is_longer_than_sixty_lines_but_the_orchestrators_a_hundred():
    long, found = [], set()
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines, where = node.end_lineno - node.lineno + 1, f"{name}:{node.name}"
                found.add(where)
                if lines > (MAX_ORCHESTRATOR_LINES if where in ORCHESTRATORS else MAX_FUNCTION_LINES):
                    long.append(f"{where} ({lines} lines)")
    assert not long, "split these into functions that each do one job: " + ", ".join(long)
    assert ORCHESTRATORS <= found  # each allowance names a function that is there


def test_no_two_modules_import_each_other_but_the_documented_pair():
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    loops = {tuple(sorted((a, b))) for a, targets in graph.items() for b in targets if a in graph.get(b, ())}
    assert loops <= DOCUMENTED_LOOPS, sorted(loops - DOCUMENTED_LOOPS)
    assert DOCUMENTED_LOOPS <= loops  # the pair is still there; when it goes, this test and the docs say so


def test_the_import_reader_sees_relative_and_absolute_imports(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\nfrom pkg.c import thing\n")
    known = {"pkg": package / "__init__.py", "pkg.a": package / "a.py", "pkg.b": package / "b.py", "pkg.c": package / "c.py"}
    assert imports_of("pkg.a", package / "a.py", known) == {"pkg", "pkg.b", "pkg.c"}


def imported_closure(start: str, known: dict[str, Path]) -> set[str]:
    """`start` and the package's modules it imports, the modules those import, and so on (`imports_of`)."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += sorted(imports_of(name, known[name], known))
    return seen


def test_fine_tuning_imports_nothing_of_pretraining():
    """What the fine-tuning run and its command import, however indirectly (the `scratchbert.commands` package,
    which lists every command, is not an import of `commands.finetune`)."""
    known = modules()
    for start in ("scratchbert.training.finetuning.run", "scratchbert.commands.finetune"):
        closure = imported_closure(start, known)
        assert "scratchbert.training.finetuning.data" in closure  # the walk follows imports
        pretraining = sorted(name for name in closure if name.startswith("scratchbert.training.pretraining"))
        assert not pretraining, f"{start} imports {pretraining}"
