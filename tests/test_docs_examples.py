"""Every ```python block of README.md and docs/*.md runs, or says why it cannot.

The test reads a document the way a user does: it pastes the document's Python blocks, in
order, into one Python session (one namespace per document), started in a folder that
holds what the documents refer to:

    runs/tiny/          a tiny checkpoint with its WordPiece tokenizer, laid out as
                        `make demo` leaves it (random weights: the blocks must run, not
                        predict well); the README's blocks run against a `packed`-recipe
                        checkpoint (ScratchBertForMaskedLM) and a `paper`-recipe one
                        (ScratchBertForPreTraining)
    corpus/*.txt        two small text files, documents separated by blank lines
    train.csv, dev.csv  a small labelled data set with `text` and `label` columns

A block that cannot run here in seconds (it needs a GPU, a download, a long run) carries
an HTML comment right before its fence, which must say why:

    <!-- not-tested: downloads bert-base-uncased from the Hugging Face hub -->
    ```python

A block that raises fails its document's test, with the document's file name and line in
the traceback; only a block that imports an optional package which is not installed
(`OPTIONAL_MODULES`, the ONNX runtime) skips the rest of its document, saying so. docs/walkthrough.md is left to tests/test_walkthrough.py, which runs it with
real BERT weights and also checks the output it shows.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from scratchbert import ScratchBertConfig, ScratchBertForMaskedLM, ScratchBertForPreTraining, train_tokenizer

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN_ELSEWHERE = {"docs/walkthrough.md": "tests/test_walkthrough.py"}  # runs it with real weights and checks its printed output
OPTIONAL_MODULES = ("onnxruntime", "onnxscript")  # ONNX export and inference; tests/test_onnx_export.py skips without them too

FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"<!--\s*not-tested:(.*?)-->", re.DOTALL)


@dataclass
class Block:
    code: str
    line: int  # line of the document where the code starts (after the fence)
    skip_reason: str | None  # the not-tested comment's reason, "" when it gives none


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of a markdown text, each with the not-tested reason written right before it."""
    blocks = []
    for fence in FENCE.finditer(text):
        if fence.group(1) != "python":
            continue
        before = text[: fence.start()].rstrip()
        markers = list(MARKER.finditer(before))
        marked = bool(markers) and markers[-1].end() == len(before)
        blocks.append(
            Block(
                code=fence.group(2),
                line=text.count("\n", 0, fence.start(2)) + 1,
                skip_reason=markers[-1].group(1).strip() if marked else None,
            )
        )
    return blocks


def name_of(document: Path) -> str:
    return document.relative_to(REPO).as_posix()


# ---------------------------------------------------------------------------------------
# The folder the documents' blocks run in
# ---------------------------------------------------------------------------------------


def _corpus_documents() -> list[str]:
    """A few help topics of CPython's documentation, the text `make demo` trains on (no download)."""
    from pydoc_data.topics import topics

    return [topics[name].strip() for name in ("assert", "break", "continue", "for", "if", "while")]


def _labelled_rows() -> list[tuple[str, str]]:
    good = ["a clear and helpful example.", "the explanation is short and useful.", "a lovely, readable function."]
    bad = ["the error message is confusing.", "a slow and broken loop.", "this code is hard to read."]
    return [(text, "positive") for text in good] + [(text, "negative") for text in bad]


@pytest.fixture(scope="session")
def workspace(tmp_path_factory) -> Path:
    """corpus/, train.csv and dev.csv, a tokenizer, and one checkpoint per recipe (copied to runs/tiny per test)."""
    root = tmp_path_factory.mktemp("docs-workspace")
    documents = _corpus_documents()
    (root / "corpus").mkdir()
    for index, name in enumerate(("a.txt", "b.txt")):
        (root / "corpus" / name).write_text("\n\n".join(documents[index::2]) + "\n", encoding="utf-8")
    for name, repeats in (("train.csv", 4), ("dev.csv", 1)):
        with open(root / name, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["text", "label"])
            writer.writerows(_labelled_rows() * repeats)

    tokenizer = train_tokenizer(documents, vocab_size=400, show_progress=False, model_max_length=128)
    config = ScratchBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    for recipe, model_class in (("packed", ScratchBertForMaskedLM), ("paper", ScratchBertForPreTraining)):
        model_class(config).save_pretrained(root / "checkpoints" / recipe)
        tokenizer.save_pretrained(root / "checkpoints" / recipe)
    return root


@contextlib.contextmanager
def working_directory(path: Path):
    """`contextlib.chdir` of Python 3.11, for 3.10."""
    previous = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


@contextlib.contextmanager
def restored_torch_state():
    """A document may switch off gradients or change print options; the test session gets its own back."""
    grad_enabled, threads = torch.is_grad_enabled(), torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_grad_enabled(grad_enabled)
        torch.set_num_threads(threads)
        torch.set_printoptions(profile="default", sci_mode=None)


def run_document(document: Path, workspace: Path, run_dir: Path, recipe: str) -> list[Block]:
    """Run the document's testable blocks in order, in one namespace, inside `run_dir`; return them."""
    for item in ("corpus", "train.csv", "dev.csv"):
        source = workspace / item
        (shutil.copytree if source.is_dir() else shutil.copy)(source, run_dir / item)
    shutil.copytree(workspace / "checkpoints" / recipe, run_dir / "runs" / "tiny")
    blocks = [block for block in python_blocks(document.read_text(encoding="utf-8")) if block.skip_reason is None]
    namespace: dict = {"__name__": "__docs__"}
    with restored_torch_state(), working_directory(run_dir), contextlib.redirect_stdout(io.StringIO()):
        for block in blocks:
            # Compiled with the document's name and line numbers: a failure points at the markdown.
            code = compile("\n" * (block.line - 1) + block.code, str(document), "exec")
            try:
                exec(code, namespace)
            except ModuleNotFoundError as err:
                if err.name not in OPTIONAL_MODULES:
                    raise
                pytest.skip(f"{name_of(document)}:{block.line} and after need {err.name}, which is not installed")
    return blocks


# ---------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------

TESTED_HERE = [document for document in DOCUMENTS if name_of(document) not in RUN_ELSEWHERE]


@pytest.mark.parametrize("document", TESTED_HERE, ids=name_of)
def test_python_blocks_run(document, workspace, tmp_path, fresh_accelerator_state):
    run_document(document, workspace, tmp_path, recipe="packed")


def test_readme_blocks_run_on_a_paper_recipe_checkpoint(workspace, tmp_path):
    """`--recipe paper` saves ScratchBertForPreTraining, whose output has `prediction_logits`, not `logits`:
    the README's ten lines must work on it too (they once raised KeyError 'logits' in the fill-mask pipeline)."""
    assert run_document(REPO / "README.md", workspace, tmp_path, recipe="paper"), "the README should have Python to run"


@pytest.mark.parametrize("document", DOCUMENTS, ids=name_of)
def test_every_skipped_block_says_why(document):
    text = document.read_text(encoding="utf-8")
    blocks = python_blocks(text)
    for block in blocks:
        assert block.skip_reason != "", f"{name_of(document)}:{block.line}: a not-tested comment must give its reason"
    skipped = sum(block.skip_reason is not None for block in blocks)
    assert len(MARKER.findall(text)) == skipped, (
        f"{name_of(document)}: every <!-- not-tested: ... --> comment must sit right before a ```python fence"
    )


def test_the_documents_are_mostly_run():
    """The extraction finds the blocks (a broken regex would skip everything and pass), and most of them run."""
    blocks = {name_of(document): python_blocks(document.read_text(encoding="utf-8")) for document in TESTED_HERE}
    run = sum(block.skip_reason is None for found in blocks.values() for block in found)
    skipped = sum(block.skip_reason is not None for found in blocks.values() for block in found)
    assert [block for block in blocks["README.md"] if block.skip_reason is None], "the README's ten lines must run"
    assert run >= 5 and run > skipped, (run, skipped)
    for document, runner in RUN_ELSEWHERE.items():
        assert document in (REPO / "tests" / Path(runner).name).read_text(encoding="utf-8")


def test_block_extraction_reads_markers_and_line_numbers():
    text = (
        "# t\n\n```python\nx = 1\n```\n\n<!-- not-tested: needs a GPU -->\n```python\ny = 2\n```\n\n"
        "<!-- not-tested: -->\n\n```python\nz = 3\n```\n\n```bash\necho 1\n```\n\n<!-- a comment -->\n```python\nw\n```\n"
    )
    blocks = python_blocks(text)
    assert [(block.code, block.line, block.skip_reason) for block in blocks] == [
        ("x = 1\n", 4, None),
        ("y = 2\n", 9, "needs a GPU"),
        ("z = 3\n", 15, ""),
        ("w\n", 24, None),
    ]
