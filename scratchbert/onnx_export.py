"""Export a saved model to ONNX, and check the graph against PyTorch before calling it done.

    export_onnx("runs/tiny", "runs/tiny-onnx", task="fill-mask")

writes `runs/tiny-onnx/model.onnx` with the tokenizer files (and config.json, for the label
names) beside it. The graph takes `input_ids`, `attention_mask` and `token_type_ids`, each
(batch, sequence) int64 with both axes dynamic, and returns one tensor per task:

    feature-extraction        last_hidden_state (batch, sequence, H)   `ScratchBertModel`
    fill-mask                 logits (batch, sequence, V)              `ScratchBertForMaskedLM`
    sequence-classification   logits (batch, num_labels)               `ScratchBertForSequenceClassification`
                              (any `classifier_pooling`: [CLS], or the mean of the real tokens)

The graph records the padded computation: under an exporter the model leaves out everything
it decides from the mask's values (`bert_padding.is_tracing`), so one graph is right for every
batch. It therefore computes vectors at padded positions where scratchbert in PyTorch returns
zeros; only real tokens are compared.

That the graph is right is checked, not assumed: when onnxruntime is installed, the graph runs on
a few batches of other shapes than the one it was exported with (one sequence, a padded batch,
two segments), and the export fails unless its outputs match PyTorch's at every real token
within `TOLERANCE`.
"""

from __future__ import annotations

import importlib.util
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from scratchbert.errors import ScratchBertError
from scratchbert.export import check_export_folder
from scratchbert.modeling_scratchbert import (
    ScratchBertForMaskedLM,
    ScratchBertForSequenceClassification,
    ScratchBertModel,
    ScratchBertPreTrainedModel,
)
from scratchbert.weights import check_weights, model_folder

# task -> (the model class that loads the checkpoint, its output the graph returns, that output's dynamic axes)
TASKS: dict[str, tuple[type[ScratchBertPreTrainedModel], str, dict[int, str]]] = {
    "feature-extraction": (ScratchBertModel, "last_hidden_state", {0: "batch", 1: "sequence"}),
    "fill-mask": (ScratchBertForMaskedLM, "logits", {0: "batch", 1: "sequence"}),
    "sequence-classification": (ScratchBertForSequenceClassification, "logits", {0: "batch"}),
}
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
ONNX_FILE = "model.onnx"
# The oldest opset torch's dynamo exporter has operator implementations for (it converts down to
# older ones, not always successfully); the TorchScript exporter writes it too.
DEFAULT_OPSET = 18
TOLERANCE = 1e-4  # largest absolute difference from PyTorch allowed at a real token (fp32)
# The int8 graph against `quantize_dynamic`, as a share of the largest |value| PyTorch gives at a real
# token: both round alike, but a value within fp32's last bits of an int8 step's midpoint (the two
# engines' attention and LayerNorm differ there) rounds to neighbouring steps, and the layers after it
# then differ by int8's own error. Measured on all-MiniLM-L6-v2: up to 2.4% (0.14 of 5.9), tokens'
# cosine >= 0.994 (docs/deployment.md). Allowed: this share, or twice int8's own distance from fp32 on
# the same batches where that is larger: a classifier's two logits carry all of a flip's effect (an
# IMDB classifier on an Intel Xeon with AMX went past 5%, and int8 itself moved them as far).
INT8_TOLERANCE = 0.05
# Copied beside model.onnx when the checkpoint has them: what a tokenizer (and a pipeline) loads.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "added_tokens.json")


@dataclass
class OnnxExport:
    """What `export_onnx` wrote: the graph's path and how far onnxruntime is from PyTorch.

    max_abs_diff: the largest absolute difference at a real token over the check batches, or
    None when onnxruntime is not installed and nothing was checked.
    """

    path: Path
    max_abs_diff: float | None  # int8: as a share of the largest |value| PyTorch gives at a real token
    int8: bool = False  # whether the encoder's Linears are int8 (checked against `quantize_dynamic`)

    def __str__(self) -> str:
        if self.max_abs_diff is None:
            return f"{self.path} (not checked: onnxruntime is not installed)"
        if self.int8:
            return f"{self.path} (onnxruntime matches scratchbert.quantize_dynamic to {self.max_abs_diff:.1%} of the largest output at real tokens)"
        return f"{self.path} (onnxruntime matches PyTorch to {self.max_abs_diff:.1e} at real tokens)"


class _GraphInputs(nn.Module):
    """The model as the exporters see it: the three inputs positionally, one output tensor."""

    def __init__(self, model: ScratchBertPreTrainedModel, output: str):
        super().__init__()
        self.model = model
        self.output = output

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, return_dict=True)
        return outputs[self.output]


def export_onnx(
    model_dir: str | Path,
    output: str | Path,
    task: str = "feature-extraction",
    opset: int = DEFAULT_OPSET,
    dynamo: bool = True,
    int8: bool = False,
) -> OnnxExport:
    """Export the model saved in `model_dir` to `output`/model.onnx and check it.

    model_dir: a folder written by `save_pretrained` (scratchbert or transformers BERT).
    output: the folder to write model.onnx, config.json and the tokenizer files to (created).
    task: "feature-extraction", "fill-mask" or "sequence-classification" (see the module docstring).
    opset: the ONNX opset to write (at least 18 with dynamo=True).
    dynamo: True exports through torch.export (torch's default exporter), False through the
        TorchScript tracer; both record the same padded graph.
    int8: the encoder's Linears in int8 as `quantize_dynamic` computes them (`int8_graph`): the
        fp32 graph is checked against PyTorch first, then the int8 one against `quantize_dynamic`.
    Returns an `OnnxExport` (the path, and onnxruntime's largest difference from PyTorch).
    Raises (all one line) FileNotFoundError without a saved model, `ScratchBertError` without
    weights, `CorruptCheckpointError` for truncated or unreadable ones (`weights.check_weights`),
    `ScratchBertError` for a checkpoint without the task's head or a graph that does not match PyTorch.
    """
    if task not in TASKS:
        raise ScratchBertError(f"task={task!r} is not one scratchbert exports; use one of {', '.join(TASKS)}.")
    model_dir, output = model_folder(model_dir), Path(output)  # a Hub name: its copy in the Hub's cache
    check_export_folder(model_dir, output)
    model = load_for_task(model_dir, task)
    output.mkdir(parents=True, exist_ok=True)
    path = output / ONNX_FILE
    _, output_name, output_axes = TASKS[task]
    graph = _GraphInputs(model, output_name).eval()
    example = example_batch(model.config.vocab_size, lengths=(8, 5))
    if dynamo:
        _export_dynamo(graph, example, path, opset, model.config.max_position_embeddings)
    else:
        _export_torchscript(graph, example, path, opset, output_axes)
    for name in ("config.json", *TOKENIZER_FILES):
        if (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, output / name)
    if not onnxruntime_installed():
        if int8:
            raise ScratchBertError("--int8 checks the int8 graph in onnxruntime, which is not installed: pip install onnxruntime.")
        return OnnxExport(path=path, max_abs_diff=None)
    max_abs_diff = verify_onnx(path, graph, TOLERANCE)
    if int8:
        import onnx

        from scratchbert.quantization import quantize_dynamic

        onnx.save(int8_graph(onnx.load(str(path)), model.config.num_hidden_layers), str(path))
        batches = check_batches(model.config.vocab_size)
        with torch.no_grad():
            fp32_outputs = [graph(**batch) for batch in batches]  # before quantize_dynamic changes the model in place
            quantized = _GraphInputs(quantize_dynamic(model), output_name).eval()
            own_error = max(difference(quantized(**batch), out, batch, relative=True) for batch, out in zip(batches, fp32_outputs))
        max_abs_diff = verify_onnx(path, quantized, max(INT8_TOLERANCE, 2 * own_error), relative=True)
    return OnnxExport(path=path, max_abs_diff=max_abs_diff, int8=int8)


def load_for_task(model_dir: Path, task: str) -> ScratchBertPreTrainedModel:
    """The task's model, in fp32 and eval mode, with every weight it uses read from `model_dir`.

    A checkpoint without the task's head (say, a pretrained encoder exported for
    sequence-classification) is refused: its head would be random numbers.
    """
    check_weights(model_dir)  # a missing, truncated or unreadable weights file: the one-line error every command gives
    model_class = TASKS[task][0]
    extra = {"add_pooling_layer": False} if model_class is ScratchBertModel else {}  # the graph returns no pooled vector
    model, info = model_class.from_pretrained(model_dir, dtype=torch.float32, output_loading_info=True, **extra)
    if info["missing_keys"]:
        missing = sorted(info["missing_keys"])
        raise ScratchBertError(
            f"{model_dir} has no weights for {missing[0]} ({len(missing)} missing): it holds no {task} head. "
            "Fine-tune it for that task first, or export it with task='feature-extraction'."
        )
    return model.eval()


def example_batch(vocab_size: int, lengths: tuple[int, ...], seed: int = 0, segments: bool = False) -> dict[str, torch.Tensor]:
    """A batch of random token ids, right-padded to the longest of `lengths`: three (len(lengths), max) int64 tensors.

    segments=True gives each sequence a second segment (token type 1) over its second half.
    """
    gen = torch.Generator().manual_seed(seed)
    batch, seq = len(lengths), max(lengths)
    attention_mask = (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, S)
    input_ids = torch.randint(0, vocab_size, (batch, seq), generator=gen) * attention_mask  # padding -> id 0
    token_type_ids = torch.zeros_like(input_ids)
    if segments:
        second_half = torch.arange(seq)[None, :] >= (torch.tensor(lengths)[:, None] + 1) // 2  # (B, S)
        token_type_ids = second_half.long() * attention_mask
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)


def _export_dynamo(graph: nn.Module, example: dict, path: Path, opset: int, max_length: int) -> None:
    """torch.export -> ONNX, batch and sequence declared dynamic (the sequence up to `max_length`)."""
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence", max=max_length)
    axes = {name: {0: batch, 1: sequence} for name in INPUT_NAMES}
    with warnings.catch_warnings():
        # Notes from torch's internals, not about the model: one Dim shared by three inputs keeps its
        # name once ("will not be used"), and a pytree deprecation inside torch.export.
        warnings.filterwarnings("ignore", message=".*axis name", category=UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        torch.onnx.export(
            graph,
            tuple(example[name] for name in INPUT_NAMES),
            path,
            dynamo=True,
            input_names=list(INPUT_NAMES),
            output_names=[graph.output],
            dynamic_shapes=axes,
            opset_version=opset,
            external_data=False,  # one self-contained file (fine below ONNX's 2 GB limit: bert-large is 1.3 GB)
            verbose=False,
        )


def _export_torchscript(graph: nn.Module, example: dict, path: Path, opset: int, output_axes: dict[int, str]) -> None:
    """The TorchScript tracer -> ONNX, with named dynamic axes on every input and the output."""
    with warnings.catch_warnings():
        # Its deprecation notice, and the tracer's notes on the Python-side shape checks (check_inputs).
        warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning, torch.jit.TracerWarning))
        torch.onnx.export(
            graph,
            tuple(example[name] for name in INPUT_NAMES),
            path,
            dynamo=False,
            input_names=list(INPUT_NAMES),
            output_names=[graph.output],
            dynamic_axes={**{name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}, graph.output: output_axes},
            opset_version=opset,
        )


def per_token_int8_nodes(x: str) -> list:
    """The nodes that quantize tensor `x` (..., K) per token: "{x}_int8" (..., K) int8 and its scales "{x}_int8_scale" (..., 1),
    as `quantize_rows` computes them (the constants int8_tiny, int8_inverse_max and int8_last_axis are `int8_graph`'s)."""
    from onnx import TensorProto, helper

    p = f"{x}_int8"
    return [
        helper.make_node("Abs", [x], [f"{p}_abs"]),
        helper.make_node("ReduceMax", [f"{p}_abs", "int8_last_axis"], [f"{p}_absmax"], keepdims=1),
        helper.make_node("Max", [f"{p}_absmax", "int8_tiny"], [f"{p}_absmax_pos"]),
        helper.make_node("Mul", [f"{p}_absmax_pos", "int8_inverse_max"], [f"{p}_scale"]),  # (..., 1)
        helper.make_node("Reciprocal", [f"{p}_scale"], [f"{p}_inverse_scale"]),
        helper.make_node("Mul", [x, f"{p}_inverse_scale"], [f"{p}_scaled"]),
        helper.make_node("Round", [f"{p}_scaled"], [f"{p}_rounded"]),
        helper.make_node("Cast", [f"{p}_rounded"], [p], to=TensorProto.INT8),  # (..., K)
    ]


def int8_graph(model_proto, num_layers: int):
    """`model_proto` with the encoder's Linears as `quantize_dynamic` computes them: int8 weights per output
    channel, activations quantized per token at run time, int8 x int8 -> int32 products (MatMulInteger).

    The exporter writes each encoder Linear as MatMul(x, W) with W a (K, O) initializer, followed by the
    bias's Add, six per layer in forward order (Q, K, V, attention output, intermediate, output); the
    heads' products after them stay fp32, as `quantize_dynamic` leaves them. Each MatMul becomes

        s = max(max|x| over the last axis, tiny) / 127                    (..., 1)   one scale per token
        q = Cast<int8>(Round(x * (1 / s)))                               (..., K)   once per input: Q/K/V share it
        y = Cast<float>(MatMulInteger(q, W_q)) * w_scale * s             (..., O)   W_q (K, O) int8, w_scale (O,)

    with W_q and w_scale from `Int8Linear`, so that both round alike.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from scratchbert.quantization import INT8_MAX, Int8Linear

    graph = model_proto.graph
    weights = {init.name: init for init in graph.initializer}
    linears = [i for i, n in enumerate(graph.node) if n.op_type == "MatMul" and n.input[1] in weights and len(weights[n.input[1]].dims) == 2]
    if len(linears) < 6 * num_layers:
        raise ScratchBertError(f"the exported graph has {len(linears)} weight products, fewer than the encoder's {6 * num_layers}: "
                               "it cannot be quantized; export without --int8 and report the torch version.")
    constants = [numpy_helper.from_array(np.array(torch.finfo(torch.float32).tiny, dtype=np.float32), "int8_tiny"),
                 numpy_helper.from_array(np.array(1.0 / INT8_MAX, dtype=np.float32), "int8_inverse_max"),
                 numpy_helper.from_array(np.array([-1], dtype=np.int64), "int8_last_axis")]
    graph.initializer.extend(constants)
    quantized_inputs: dict[str, tuple[str, str]] = {}  # fp32 input -> (its int8 tensor, its scales)
    new_nodes: dict[int, list] = {}  # position of a MatMul in graph.node -> the nodes replacing it
    for index in linears[: 6 * num_layers]:
        node = graph.node[index]
        x, w, y = node.input[0], node.input[1], node.output[0]
        nodes = []
        if x not in quantized_inputs:
            nodes += per_token_int8_nodes(x)
            quantized_inputs[x] = (f"{x}_int8", f"{x}_int8_scale")
        q, scale = quantized_inputs[x]
        layer = Int8Linear(torch.from_numpy(numpy_helper.to_array(weights[w]).copy()).t(), None)  # from (K, O): (O, K)
        graph.initializer.extend([numpy_helper.from_array(layer.weight_t.numpy(), f"{w}_int8"),
                                  numpy_helper.from_array(layer.weight_scale.numpy(), f"{w}_scale")])
        nodes += [
            helper.make_node("MatMulInteger", [q, f"{w}_int8"], [f"{y}_int32"]),  # (..., O)
            helper.make_node("Cast", [f"{y}_int32"], [f"{y}_float"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [f"{y}_float", f"{w}_scale"], [f"{y}_channel_scaled"]),
            helper.make_node("Mul", [f"{y}_channel_scaled", scale], [y]),
        ]
        new_nodes[index] = nodes
    rebuilt = []
    for index, node in enumerate(graph.node):
        rebuilt.extend(new_nodes.get(index, [node]))
    used = {name for node in rebuilt for name in node.input}
    kept = [init for init in graph.initializer if init.name in used]  # the fp32 weights that were quantized go
    del graph.node[:], graph.initializer[:]
    graph.node.extend(rebuilt)
    graph.initializer.extend(kept)
    onnx.checker.check_model(model_proto)
    return model_proto


def onnxruntime_installed() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None


def check_batches(vocab_size: int) -> list[dict[str, torch.Tensor]]:
    """The batches the graph is checked on, none of the export example's shape: one full sequence,
    a right-padded batch of three, and four two-segment sequences."""
    return [
        example_batch(vocab_size, lengths=(11,), seed=1),
        example_batch(vocab_size, lengths=(16, 9, 3), seed=2),
        example_batch(vocab_size, lengths=(6, 13, 13, 2), seed=3, segments=True),
    ]


def verify_onnx(path: Path, graph: nn.Module, tolerance: float, relative: bool = False) -> float:
    """Run `path` in onnxruntime on `check_batches` and compare with `graph` in PyTorch at real tokens.

    Returns the largest absolute difference (relative=True: divided by the largest |value| PyTorch
    gives there); raises `ScratchBertError` when it exceeds `tolerance`.
    PyTorch runs eagerly, so on its padding-free path: the check also shows that the padded graph
    and the padding-free computation agree at real tokens.
    """
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for batch in check_batches(graph.model.config.vocab_size):
        (ours,) = session.run(None, {name: batch[name].numpy() for name in INPUT_NAMES})
        with torch.no_grad():
            expected = graph(**batch)
        worst = max(worst, difference(torch.from_numpy(ours), expected, batch, relative))
    if worst > tolerance:
        raise ScratchBertError(
            f"{path} does not match PyTorch: onnxruntime's outputs differ by up to {worst:.2e}{' of the largest output' if relative else ''} "
            f"at real tokens (allowed: {tolerance:.1e}); do not use it, and report the checkpoint and the torch/onnxruntime versions."
        )
    return worst


def difference(ours: torch.Tensor, expected: torch.Tensor, batch: dict[str, torch.Tensor], relative: bool) -> float:
    """The largest |ours - expected| at real tokens (relative=True: divided by the largest |expected| there)."""
    diff = (ours - expected).abs()  # (B, S, ...) or (B, num_labels)
    if diff.dim() == 3:  # a vector per token: compare the real ones
        real = batch["attention_mask"].bool()
        diff, expected = diff[real], expected[real]  # (T, H) or (T, V)
    return float(diff.max() / expected.abs().max() if relative else diff.max())


__all__ = ["TASKS", "OnnxExport", "export_onnx", "int8_graph"]
