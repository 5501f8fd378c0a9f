"""`--streaming`: train from the first batch while the corpus is still being read.

Without it, `corpus.build_datasets` turns the whole corpus into examples in datasets' Arrow
cache before the first step (prepared once, reused by later runs). With it, nothing is
written: documents are read from the files (or a streamed `--dataset`), tokenized and packed
on the fly by datasets' `IterableDataset`, and training starts as soon as the first batch is
ready. For corpora that do not fit on disk twice, or a first look at a new one.

    files --read--> documents --hash--> held out (about --eval-fraction of them) -> a fixed eval set
                                     \\-> training --tokenize, pack--> examples
                                               --ExampleStream--> shuffled windows
                                               --StreamLoader--> global batches -> this process's share

- **Held out by content**: a document is held out when a hash of its text says so, so the
  split needs no pass over the corpus, a document repeated in the corpus always lands on the
  same side, and the evaluation set is the first `--max-eval-examples` examples of the held-out
  documents (read once, at the start).
- **Several processes share out global batches**: every process reads, tokenizes and packs the
  whole stream, and `StreamLoader` keeps this process's share of each optimizer step's N * B * k
  examples (`optimization.py`): the examples, their order and their masks are those of one
  process with the whole batch, on any number of processes and machines, and a checkpoint
  resumes on another number of them. The price: each process does the whole corpus's reading
  and tokenization, which a fast tokenizer does at hundreds of thousands of tokens a second a core.
- **Shuffled in windows**: a stream cannot be permuted whole; `ExampleStream` shuffles each
  window of `STREAM_WINDOW` consecutive examples with a generator seeded by (seed, epoch,
  window). datasets' own shuffle buffer is not used: its content is not part of its state, so a
  resumed run would draw other examples.
- **Exact resume**: a checkpoint records datasets' state of the stream (the same in every
  process) at the current window's start, the window's number and how many of its examples were used; `--resume`
  re-reads at most that one window, not the corpus before it.
- **Epochs**: the stream's length is unknown until it ends; the run needs `--max-steps` or
  `--time-budget`; when the stream ends (its last examples short of a whole step left out) it
  starts over with the next epoch's windows.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
from collections.abc import Iterator

import datasets
import torch

from scratchbert.errors import ScratchBertError

STREAM_WINDOW = 10_000  # examples shuffled together; also the most a resume re-reads

TOKENIZER_SAMPLE_BYTES = 100_000_000  # text a streamed run trains its tokenizer on (without --tokenizer)


def is_held_out(text: str, eval_fraction: float) -> bool:
    """A fixed function of the document's text: about `eval_fraction` of documents are held out."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < eval_fraction


def split_stream(documents: datasets.IterableDataset, eval_fraction: float):
    """(the training documents, the held-out documents), both streams."""
    held_out = documents.filter(lambda example: is_held_out(example["text"], eval_fraction))
    training = documents.filter(lambda example: not is_held_out(example["text"], eval_fraction))
    return training, held_out


def first_texts(documents: datasets.IterableDataset, max_bytes: int = TOKENIZER_SAMPLE_BYTES) -> Iterator[str]:
    """The stream's first documents, up to `max_bytes` of text: what a streamed run trains its tokenizer on."""
    read = 0
    for example in documents:
        yield example["text"]
        read += len(example["text"])
        if read >= max_bytes:
            return


def materialize(examples: datasets.IterableDataset, max_examples: int | None, what: str) -> datasets.Dataset:
    """The first `max_examples` examples of a stream (None: all), as an in-memory Dataset (the fixed evaluation set)."""
    rows = list(itertools.islice(examples, max_examples))
    if not rows:
        raise ScratchBertError(
            f"the {what} stream produced no examples: the held-out documents are too short or too few. "
            "Raise --eval-fraction, lower --max-seq-length or add text."
        )
    return datasets.Dataset.from_list(rows, features=examples.features)


class ExampleStream(torch.utils.data.IterableDataset):
    """A datasets `IterableDataset` of examples, shuffled per window, that knows where it is.

    Yields (index, example) like `masking.IndexedDataset`, so `SeededCollator` draws masks
    from the examples' indices; an index is the example's place in the stream.
    `state_dict()` / `load_state_dict()` record and restore the position (see the module
    docstring); `set_epoch` picks the epoch whose windows the next iteration draws.
    """

    def __init__(self, examples: datasets.IterableDataset, seed: int, window: int | None = None):
        self.examples = examples
        self.seed = seed
        self.window = window or STREAM_WINDOW
        self.epoch = 0
        self._start = examples.state_dict()  # the state of a stream read from its beginning
        self._where = {"epoch": 0, "window": 0, "used": 0, "window_state": self._start}
        self._resume_at: dict | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def state_dict(self) -> dict:
        return copy.deepcopy(self._where)

    def load_state_dict(self, state: dict) -> None:
        """Continue where `state` was taken: the next iteration starts inside that window."""
        self._resume_at = copy.deepcopy(state)
        self.epoch = state["epoch"]

    def _window_order(self, window: int, size: int) -> list[int]:
        key = f"{self.seed}:{self.epoch}:{window}".encode()
        seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1
        return torch.randperm(size, generator=torch.Generator().manual_seed(seed)).tolist()

    def __iter__(self):
        resume_at, self._resume_at = self._resume_at, None
        if resume_at is not None and resume_at["epoch"] == self.epoch:
            self.examples.load_state_dict(resume_at["window_state"])
            window, used = resume_at["window"], resume_at["used"]
        else:
            self.examples.load_state_dict(self._start)
            window, used = 0, 0
        examples = iter(self.examples)
        while True:
            window_state = self.examples.state_dict()
            buffer = list(itertools.islice(examples, self.window))
            if not buffer:
                return
            order = self._window_order(window, len(buffer))
            for position in range(used, len(buffer)):
                self._where = {"epoch": self.epoch, "window": window, "used": position + 1, "window_state": window_state}
                yield window * self.window + order[position], buffer[order[position]]
            window, used = window + 1, 0


class StreamLoader:
    """This process's batches of an `ExampleStream`, on the training device, with the loader interface `pretrain.train` uses.

    Reads one optimizer step's examples at a time, `batch_size * accumulation * world_size` of
    them, and hands out this process's micro-batches of it: micro-batch j of the step is batch
    j * world_size + rank of the step's batches, the share Accelerate deals a process of a
    map-style dataset (`optimization.py`). A stream's last examples short of a whole step are left out.
    One reader in the training process (a DataLoader worker would read the stream again); the
    stream's position, the same in every process, goes into every checkpoint through `state_dict`.
    """

    def __init__(self, stream: ExampleStream, batch_size: int, accumulation: int, collate_fn, device: torch.device, rank: int = 0, world_size: int = 1):
        self.stream = stream
        self.batch_size, self.accumulation = batch_size, accumulation
        self.collate_fn = collate_fn
        self.device = device
        self.rank, self.world_size = rank, world_size

    def set_epoch(self, epoch: int) -> None:
        self.stream.set_epoch(epoch)

    def state_dict(self) -> dict:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state)

    def __iter__(self):
        examples = iter(self.stream)
        step_examples = self.batch_size * self.accumulation * self.world_size
        while len(step := list(itertools.islice(examples, step_examples))) == step_examples:
            for micro_batch in range(self.accumulation):
                first = (micro_batch * self.world_size + self.rank) * self.batch_size
                batch = self.collate_fn(step[first : first + self.batch_size])
                yield {name: value.to(self.device) for name, value in batch.items()}


__all__ = ["STREAM_WINDOW", "ExampleStream", "StreamLoader", "first_texts", "is_held_out", "materialize", "split_stream"]
