"""docs/walkthrough.md runs: every ```python block, in order, in one namespace, against the real package.

Each ```python block that prints is followed in the document by a ```text block with what it
printed. The test checks that printed output too, so the document can go stale neither in
its code nor in the numbers it shows: words must match exactly, numbers to within the
precision they are printed with (different CPUs and torch builds round the last digit
differently). After a deliberate change to the model or the document, refresh the printed
output with

    python tests/test_walkthrough.py --write

Its pretraining sections quote the lines of scratchbert/training/pretraining/loop.py where each
part of a step runs, as lines like  > loop.py, `train`: `run.optimizer.step()`  ; a second test
checks that the named function of loop.py still holds each quoted line.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

DOC = Path(__file__).resolve().parents[1] / "docs" / "walkthrough.md"
# "> loop.py, `train`: `run.optimizer.step()`": a line of that function of loop.py, quoted in the document.
LOOP_QUOTE = re.compile(r"^> loop\.py, `(\w+)`: (.+)$", re.MULTILINE)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
# Numbers as torch and Python print them: 12, -0.0431, 3.4e+38, -3.4028234663852886e+38.
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
REGENERATE_HINT = "refresh the printed output with `python tests/test_walkthrough.py --write`"


@dataclass
class Block:
    code: str
    line: int  # line of the document where the code starts (after the ```python fence)
    output: str | None  # the ```text block that follows, if any
    output_span: tuple[int, int] | None  # its character span in the document, fences included
    insert_at: int  # where an output block goes when there is none yet


def read_blocks(text: str) -> list[Block]:
    """The ```python blocks of `text`, each with the ```text block right after it (blank lines between allowed)."""
    fences = list(FENCE.finditer(text))
    blocks = []
    for index, match in enumerate(fences):
        if match.group(1) != "python":
            continue
        following = fences[index + 1] if index + 1 < len(fences) else None
        is_output = following is not None and following.group(1) == "text" and not text[match.end() : following.start()].strip()
        blocks.append(
            Block(
                code=match.group(2),
                line=text.count("\n", 0, match.start(2)) + 1,
                output=following.group(2) if is_output else None,
                output_span=(following.start(), following.end()) if is_output else None,
                insert_at=match.end(),
            )
        )
    return blocks


@contextlib.contextmanager
def restored_torch_state():
    """The document may switch off gradients and change print options; give the test session its own back."""
    grad_enabled = torch.is_grad_enabled()
    try:
        yield
    finally:
        torch.set_grad_enabled(grad_enabled)
        torch.set_printoptions(profile="default", sci_mode=None)


def run_blocks(blocks: list[Block]) -> list[str]:
    """Execute the blocks in order in one namespace; return what each printed.

    Each block is compiled with the document's name and its own line numbers, so a failure's
    traceback points at the line of docs/walkthrough.md that raised.
    """
    namespace: dict = {"__name__": "walkthrough"}
    outputs = []
    with restored_torch_state():
        for block in blocks:
            code = compile("\n" * (block.line - 1) + block.code, str(DOC), "exec")
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                exec(code, namespace)
            outputs.append(buffer.getvalue())
    return outputs


def _tokens(text: str) -> list[str]:
    """Split printed text into numbers and the words between them; whitespace and line wrapping are ignored."""
    pieces = []
    position = 0
    for match in NUMBER.finditer(text):
        pieces.extend(text[position : match.start()].split())
        pieces.append(match.group())
        position = match.end()
    pieces.extend(text[position:].split())
    return pieces


def _same_number(expected: str, actual: str) -> bool:
    if expected == actual:
        return True
    if not re.search(r"[.eE]", expected + actual):
        return False  # integers (ids, shapes, counts) must match exactly
    a, b = float(expected), float(actual)
    decimals = len(expected.split(".")[1].split("e")[0].split("E")[0]) if "." in expected else 0
    # One unit in the last printed digit, plus a relative slack for large or exponent-form values.
    return math.isclose(a, b, rel_tol=1e-3, abs_tol=1.01 * 10.0**-decimals) or (a == b == 0)


def output_differences(expected: str, actual: str) -> str | None:
    """None when `actual` prints the same as `expected` (numbers to printed precision), else a description."""
    want, got = _tokens(expected), _tokens(actual)
    for index, (w, g) in enumerate(zip(want, got)):
        same = _same_number(w, g) if NUMBER.fullmatch(w) and NUMBER.fullmatch(g) else w == g
        if not same:
            context = " ".join(want[max(0, index - 6) : index + 1])
            return f"after `{context}`: the document shows {w!r}, the code now prints {g!r}"
    if len(want) != len(got):
        return f"the document shows {len(want)} printed items, the code now prints {len(got)}"
    return None


def test_walkthrough_runs_and_shows_its_real_output(minilm_dir, rxnfp_dir, fresh_accelerator_state):
    # The fixtures skip (with the reason) when the packages holding the real weights are absent;
    # the document runs `pretrain` in-process, so Accelerate's process-wide state starts empty.
    assert minilm_dir.is_dir() and rxnfp_dir.is_dir()
    blocks = read_blocks(DOC.read_text(encoding="utf-8"))
    assert len(blocks) >= 12, "the walkthrough should cover every step of BERT"
    outputs = run_blocks(blocks)
    for block, printed in zip(blocks, outputs):
        where = f"docs/walkthrough.md block at line {block.line}"
        if block.output is None:
            assert not printed.strip(), f"{where} prints but shows no ```text output; {REGENERATE_HINT}"
            continue
        difference = output_differences(block.output, printed)
        assert difference is None, f"{where}: {difference}; {REGENERATE_HINT}"


def quoted_loop_lines(text: str) -> list[tuple[str, str]]:
    """(function, code) for every code span of the document's `> loop.py, `function`: ...` lines."""
    return [(match.group(1), code) for match in LOOP_QUOTE.finditer(text) for code in re.findall(r"`([^`]+)`", match.group(2))]


def test_the_loop_lines_it_quotes_are_in_loop_py():
    import inspect

    from scratchbert.training.pretraining import loop

    quotes = quoted_loop_lines(DOC.read_text(encoding="utf-8"))
    assert len(quotes) >= 10, "each pretraining section should quote the lines of loop.py where its part runs"
    for function, code in quotes:
        source = " ".join(inspect.getsource(getattr(loop, function)).split())
        assert " ".join(code.split()) in source, f"docs/walkthrough.md quotes `{code}` from loop.{function}, which no longer holds it"


def test_output_comparison_tolerates_last_digit_rounding_only():
    assert output_differences("tensor([0.1234, -2.5000])", "tensor([ 0.1235,\n -2.5000])") is None
    assert output_differences("tensor([0.1234])", "tensor([0.1254])") is not None
    assert output_differences("torch.Size([1, 20, 384])", "torch.Size([1, 21, 384])") is not None
    assert output_differences("['[CLS]', 'the', 'cat']", "['[CLS]', 'the', 'dog']") is not None
    assert output_differences("loss 7.5", "loss 7.5 extra") is not None
    assert output_differences("-3.4028234663852886e+38", "-3.4028234663852886e+38") is None


def write_outputs() -> None:
    """Run the document and rewrite every ```text output block with what its code prints now."""
    text = DOC.read_text(encoding="utf-8")
    blocks = read_blocks(text)
    outputs = run_blocks(blocks)
    # Edit from the end of the document backwards so earlier spans stay valid.
    for block, printed in reversed(list(zip(blocks, outputs))):
        body = printed if printed.endswith("\n") or not printed else printed + "\n"
        fenced = f"```text\n{body}```"
        if block.output_span is not None:
            start, end = block.output_span
            text = text[:start] + fenced + text[end:] if printed.strip() else text[:start].rstrip("\n") + text[end:]
        elif printed.strip():
            text = text[: block.insert_at] + "\n\n" + fenced + text[block.insert_at :]
    DOC.write_text(text, encoding="utf-8")
    print(f"rewrote the output of {sum(1 for p in outputs if p.strip())} blocks in {DOC}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_walkthrough.py --write   (run the walkthrough, refresh its printed output)")
    write_outputs()
