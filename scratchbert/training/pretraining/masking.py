"""Dynamic masking for BERT pretraining, and the loaders whose batches it masks.

`DataCollatorForPretraining` pads a batch, chooses the tokens to predict and corrupts them;
`make_dataloaders` hands out the examples in each epoch's order, whole global batches only, each
example masked from its own seed (`SeededCollator`).

Masks are drawn when a batch is formed, not when the dataset is built, so every epoch
(and every resumed run) sees fresh masks of the same examples ("dynamic masking", as
in RoBERTa; BERT's original script fixed ten masks per example in advance).

The rule from the BERT paper, per batch:
1. Candidates are the real tokens: not padding, not special tokens ([CLS], [SEP], [PAD],
   [UNK], [MASK] and any other id in `tokenizer.all_special_ids`).
2. Each candidate (or, with whole-word masking, each word) is chosen with probability
   `mlm_probability` (15%). The label of a chosen position is its original token;
   every other label is -100, the ignore index of the loss.
3. Of the chosen positions 80% become [MASK], 10% a random non-special token and 10%
   stay as they are, so the model cannot tell from the input which tokens it predicts.

Randomness comes from torch's global generator by default, which Accelerate saves and
restores with `save_state`/`load_state` (exact resume); pass a `torch.Generator` to
use a separate stream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import datasets
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from scratchbert.errors import ScratchBertError
from scratchbert.modeling_scratchbert import IGNORE_INDEX  # the label of positions the loss skips
from scratchbert.training.pretraining import optimization, streaming
from scratchbert.training.pretraining.config import PretrainConfig
from scratchbert.training.pretraining.evaluation import EVAL_MLM_PROBABILITY

# What a pretraining batch hands to the model (the collator also makes nothing else).
MLM_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "labels")
MODEL_INPUTS = (*MLM_INPUTS, "next_sentence_label")  # with NSP


class DataCollatorForPretraining:
    """Collate examples into a padded, dynamically masked MLM (+ NSP) batch.

    Args:
        tokenizer: a transformers tokenizer; uses `pad_token_id`, `mask_token_id`,
            `all_special_ids`, `len(tokenizer)` and, for whole-word masking,
            `convert_ids_to_tokens`.
        mlm_probability: share of candidate tokens to predict, in (0, 1].
        whole_word_mask: choose whole words: a token whose text starts with
            `subword_prefix` ("##", WordPiece's marker) belongs to the word before it,
            and all pieces of a chosen word are predicted together. Each piece then gets
            its own 80/10/10 draw, as in BERT's whole-word-masking release.
        pad_to_multiple_of: pad the length up to a multiple of this (8 suits tensor cores).
        generator: a `torch.Generator` for the masks; None uses torch's global generator.
        mask_replace_prob: share of chosen tokens replaced by [MASK] (0.8 in BERT).
        random_replace_prob: share of chosen tokens replaced by a random token (0.1 in
            BERT); the rest keep their original token.
        subword_prefix: marker of word-continuation pieces for whole-word masking.

    Call it on a list of examples, each a mapping with "input_ids" (list, tuple or
    1-D tensor) and optionally "token_type_ids", "attention_mask" and
    "next_sentence_label" (present in all examples or none); other keys are not used.
    Sequences are padded on the right to the longest one in the batch.

    Returns a dict of tensors (batch = number of examples, seq = padded length):
        input_ids (batch, seq) long, masked and corrupted
        token_type_ids (batch, seq) long, 0 where the examples gave none and on padding
        attention_mask (batch, seq) long, 1 on real tokens
        labels (batch, seq) long, original ids at predicted positions, -100 elsewhere
        next_sentence_label (batch,) long, when the examples carry it

    Every row that has at least one candidate gets at least one prediction (its unit
    with the smallest draw is chosen when the coin flips chose none): a batch never
    has an all-ignored loss, which would be NaN. This raises the rate only for very
    short rows (a row of n candidates picks none with probability 0.85**n).
    """

    def __init__(
        self,
        tokenizer,
        mlm_probability: float = 0.15,
        whole_word_mask: bool = False,
        pad_to_multiple_of: int | None = None,
        generator: torch.Generator | None = None,
        *,
        mask_replace_prob: float = 0.8,
        random_replace_prob: float = 0.1,
        subword_prefix: str = "##",
    ):
        if not 0.0 < mlm_probability <= 1.0:
            raise ScratchBertError(f"mlm_probability={mlm_probability!r} must be in (0, 1]; BERT uses 0.15")
        if mask_replace_prob < 0 or random_replace_prob < 0 or mask_replace_prob + random_replace_prob > 1:
            raise ScratchBertError(
                f"mask_replace_prob={mask_replace_prob!r} and random_replace_prob={random_replace_prob!r} must be "
                "non-negative and sum to at most 1; BERT uses 0.8 and 0.1"
            )
        if pad_to_multiple_of is not None and (not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1):
            raise ScratchBertError(f"pad_to_multiple_of={pad_to_multiple_of!r} must be a positive integer (e.g. 8) or None")
        if tokenizer.pad_token_id is None or tokenizer.mask_token_id is None:
            raise ScratchBertError("masked-language-model batches need a tokenizer with both a [PAD] and a [MASK] token")
        self.tokenizer = tokenizer
        self.mlm_probability = mlm_probability
        self.whole_word_mask = whole_word_mask
        self.pad_to_multiple_of = pad_to_multiple_of
        self.generator = generator
        self.mask_replace_prob = mask_replace_prob
        self.random_replace_prob = random_replace_prob
        self.subword_prefix = subword_prefix

        self.vocab_size = len(tokenizer)
        # Lookup tables indexed by token id, built once: (vocab,) bool.
        self._is_special = torch.zeros(self.vocab_size, dtype=torch.bool)
        self._is_special[sorted(set(tokenizer.all_special_ids))] = True
        self._replacement_ids = torch.nonzero(~self._is_special).squeeze(1)  # (vocab - specials,)
        if len(self._replacement_ids) == 0:
            raise ScratchBertError("the tokenizer has only special tokens; there is nothing to predict or to sample from")
        self._continues_word = None
        if whole_word_mask:
            tokens = tokenizer.convert_ids_to_tokens(list(range(self.vocab_size)))
            self._continues_word = torch.tensor([t is not None and t.startswith(subword_prefix) for t in tokens])

    # -- padding -----------------------------------------------------------------

    def pad(self, examples: Sequence[Mapping]) -> dict[str, torch.Tensor]:
        """Stack examples into right-padded (batch, seq) tensors; no masking."""
        if len(examples) == 0:
            raise ValueError("cannot collate an empty list of examples")
        rows = []
        for number, example in enumerate(examples):
            if not isinstance(example, Mapping) or "input_ids" not in example:
                raise ValueError(f"example {number} is not a mapping with 'input_ids' (got {type(example).__name__})")
            ids = torch.as_tensor(example["input_ids"], dtype=torch.long)
            if ids.dim() != 1 or ids.numel() == 0:
                raise ValueError(f"example {number}: input_ids must be a non-empty 1-D sequence, got shape {tuple(ids.shape)}")
            rows.append(ids)
        length = max(len(ids) for ids in rows)
        if self.pad_to_multiple_of is not None:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of  # round up
        batch_size = len(rows)
        input_ids = torch.full((batch_size, length), self.tokenizer.pad_token_id, dtype=torch.long)
        token_type_ids = torch.zeros((batch_size, length), dtype=torch.long)
        attention_mask = torch.zeros((batch_size, length), dtype=torch.long)
        for row, (ids, example) in enumerate(zip(rows, examples)):
            n = len(ids)
            input_ids[row, :n] = ids
            if example.get("token_type_ids") is not None:
                token_type_ids[row, :n] = torch.as_tensor(example["token_type_ids"], dtype=torch.long)
            if example.get("attention_mask") is not None:
                attention_mask[row, :n] = torch.as_tensor(example["attention_mask"], dtype=torch.long)
            else:
                attention_mask[row, :n] = 1
        too_large = input_ids.max().item()
        if too_large >= self.vocab_size or input_ids.min().item() < 0:
            raise ScratchBertError(
                f"token id {too_large} is outside the tokenizer's vocabulary of {self.vocab_size}; the examples "
                "were made with a different tokenizer"
            )
        batch = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
        has_label = ["next_sentence_label" in example for example in examples]
        if any(has_label):
            if not all(has_label):
                raise ValueError("some examples have a next_sentence_label and some do not; give it to all or none")
            batch["next_sentence_label"] = torch.tensor(
                [int(example["next_sentence_label"]) for example in examples], dtype=torch.long
            )
        return batch

    # -- masking -----------------------------------------------------------------

    def uniform(self, attention_mask: torch.Tensor, row_generators: Sequence[torch.Generator] | None = None) -> torch.Tensor:
        """(batch, seq) uniform draws in [0, 1) for a batch of this (batch, seq) attention mask.

        From `self.generator` (or torch's global one) for the whole batch; or, with `row_generators`,
        each row from its own generator, as many draws as the row has real tokens (padding gets 1.0,
        which no rule chooses): an example's draws then do not depend on which batch it is in, nor on
        how far that batch is padded.
        """
        if row_generators is None:
            return torch.rand(attention_mask.shape, generator=self.generator)
        draws = torch.ones(attention_mask.shape)
        for row, (generator, length) in enumerate(zip(row_generators, attention_mask.sum(dim=1).tolist())):
            draws[row, :length] = torch.rand(length, generator=generator)
        return draws

    def choose_positions(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, row_generators: Sequence[torch.Generator] | None = None
    ) -> torch.Tensor:
        """(batch, seq) ids and mask -> (batch, seq) bool: the positions to predict.

        Works on "units": single candidate tokens, or whole words with whole-word
        masking. A unit is identified by its first token; every token of a chosen unit
        is chosen. `row_generators`: one generator per row (`uniform`).
        """
        candidate = attention_mask.bool() & ~self._is_special[input_ids]  # (batch, seq)
        if self.whole_word_mask:
            previous_is_candidate = torch.zeros_like(candidate)
            previous_is_candidate[:, 1:] = candidate[:, :-1]
            # A piece continues a word only if the token before it is part of that word.
            starts = candidate & ~(self._continues_word[input_ids] & previous_is_candidate)
        else:
            starts = candidate
        if not starts.any():
            return candidate  # e.g. rows of only [UNK]s: nothing to predict
        # Number the units across the flattened batch; a continuation piece inherits
        # the number of its word's first piece. (batch, seq), -1 before the first unit.
        unit_of = torch.cumsum(starts.flatten(), dim=0).view_as(starts) - 1

        draw = self.uniform(attention_mask, row_generators)  # (batch, seq)
        chosen_starts = starts & (draw < self.mlm_probability)
        # Rows with candidates but no chosen unit: choose the unit that drew lowest.
        needs_one = starts.any(dim=1) & ~chosen_starts.any(dim=1)  # (batch,)
        if needs_one.any():
            lowest = draw.masked_fill(~starts, 2.0).argmin(dim=1)  # (batch,)
            rows = torch.nonzero(needs_one).squeeze(1)
            chosen_starts[rows, lowest[rows]] = True

        unit_chosen = torch.zeros(int(starts.sum()), dtype=torch.bool)  # (units,)
        unit_chosen[unit_of[starts]] = chosen_starts[starts]
        return candidate & unit_chosen[unit_of.clamp(min=0)]

    def corrupt(
        self, input_ids: torch.Tensor, chosen: torch.Tensor, attention_mask: torch.Tensor,
        row_generators: Sequence[torch.Generator] | None = None,
    ) -> torch.Tensor:
        """The 80/10/10 rule: chosen positions become [MASK], a random non-special token, or stay."""
        action = self.uniform(attention_mask, row_generators)  # (batch, seq)
        to_mask = chosen & (action < self.mask_replace_prob)
        to_random = chosen & (action >= self.mask_replace_prob) & (action < self.mask_replace_prob + self.random_replace_prob)
        # A uniform draw scaled to the replacement table: (batch, seq) indices in [0, len).
        picks = (self.uniform(attention_mask, row_generators) * len(self._replacement_ids)).long()
        random_ids = self._replacement_ids[picks.clamp(max=len(self._replacement_ids) - 1)]  # never a special token
        corrupted = input_ids.masked_fill(to_mask, self.tokenizer.mask_token_id)
        return torch.where(to_random, random_ids, corrupted)

    def __call__(self, examples: Sequence[Mapping], row_generators: Sequence[torch.Generator] | None = None) -> dict[str, torch.Tensor]:
        """Pad, choose and corrupt; `row_generators` (one per example) make each example's masks its own (`uniform`)."""
        batch = self.pad(examples)
        chosen = self.choose_positions(batch["input_ids"], batch["attention_mask"], row_generators)
        batch["labels"] = batch["input_ids"].masked_fill(~chosen, IGNORE_INDEX)
        batch["input_ids"] = self.corrupt(batch["input_ids"], chosen, batch["attention_mask"], row_generators)
        return batch


# ---------------------------------------------------------------------------------------------
# Masks that a resumed run draws again exactly
# ---------------------------------------------------------------------------------------------
class SeededCollator:
    """Runs the MLM collator with one generator per example, seeded by (seed, epoch, example index).

    An example's masks are then a pure function of which example it is and of the epoch:
    independent of the batch it lands in, of how many batches the DataLoader prefetched, of the
    process count, of `num_workers` and of the batch size. So a resumed run draws exactly the
    masks the uninterrupted run drew, a run on N processes of batch B draws the masks of one
    process with batch N * B, and the global RNG is left to dropout alone. Set `epoch` before each
    epoch. Only `model_inputs` are passed on (without NSP the model takes no next_sentence_label).
    """

    def __init__(self, collator: DataCollatorForPretraining, seed: int, epoch: int = 0, model_inputs=MODEL_INPUTS):
        self.collator = collator
        self.seed = seed
        self.epoch = epoch
        self.model_inputs = model_inputs

    def example_seed(self, index: int) -> int:
        key = f"{self.seed}:{self.epoch}:{index}".encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1

    def __call__(self, items):
        indices, examples = zip(*items)
        generators = [torch.Generator().manual_seed(self.example_seed(index)) for index in indices]
        batch = self.collator(list(examples), row_generators=generators)
        return {name: batch[name] for name in self.model_inputs if name in batch}


def seeded_collator(tokenizer, seed: int, nsp: bool, **masking) -> SeededCollator:
    """A run's collator: `DataCollatorForPretraining(tokenizer, **masking)` drawing each example's masks from
    (`seed`, epoch, index), handing the model its MLM inputs and, with `nsp`, the next-sentence labels."""
    return SeededCollator(DataCollatorForPretraining(tokenizer, **masking), seed, model_inputs=MODEL_INPUTS if nsp else MLM_INPUTS)


# ---------------------------------------------------------------------------------------------
# The loaders: examples with their index, in each epoch's order, masked as they are drawn
# ---------------------------------------------------------------------------------------------
class IndexedDataset(torch.utils.data.Dataset):
    """Yields `(index, example)` so the collator can seed each example's masks from which example it is (`SeededCollator`)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        return index, self.dataset[index]


class EpochPermutation(torch.utils.data.Sampler[int]):
    """Every example at most once an epoch, in an order drawn from (seed, epoch): `set_epoch` before each.

    `step_examples`: the examples of one optimizer step over every process (`optimization.py`).
    Only whole steps are handed out: the last `len % step_examples` indices of an epoch's order are
    left out (other examples each epoch), so every step, on any number of processes, trains on
    the same examples as one process with the whole batch.

    The order is one int32 tensor, 4 bytes an example. torch's `RandomSampler` (and Accelerate's
    seedable one, built on it) turns its permutation into a Python list, about 36 bytes an
    example: 0.5 GB for the 13 million examples of a 4 GB corpus, memory that grew with the corpus.
    """

    CHUNK = 4096  # indices handed out per list conversion

    def __init__(self, num_examples: int, seed: int, step_examples: int = 1):
        self.num_examples, self.seed, self.epoch = num_examples, seed, 0
        self.step_examples = step_examples

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_examples // self.step_examples * self.step_examples

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.num_examples, generator=generator, dtype=torch.int32)[: len(self)]
        for start in range(0, len(order), self.CHUNK):
            yield from order[start : start + self.CHUNK].tolist()


def _masking(config: PretrainConfig, evaluation: bool = False) -> dict:
    """The masking of training batches or, with `evaluation`, of held-out ones (`masking.seeded_collator`'s options).

    Evaluation masks at BERT's 15% with BERT's 80/10/10 whatever the training recipe: every
    evaluation, and every recipe, is scored on the same kind of task. Without NSP the model takes
    no next_sentence_label (sentence pairs still carry one).
    """
    if evaluation:
        return {"nsp": config.nsp, "mlm_probability": EVAL_MLM_PROBABILITY, "whole_word_mask": config.whole_word_mask}
    return {"nsp": config.nsp, "mlm_probability": config.mlm_probability, "mask_replace_prob": config.mask_replace_prob,
            "random_replace_prob": config.random_replace_prob, "whole_word_mask": config.whole_word_mask}  # fmt: skip


def _shuffled_loader(config: PretrainConfig, dataset: datasets.Dataset, collate: SeededCollator, batch_size: int, seed: int, num_processes: int) -> DataLoader:
    """Batches of `dataset` in `EpochPermutation`'s order: whole optimizer steps of every process only."""
    examples = IndexedDataset(dataset)
    step_examples = optimization.examples_per_step(batch_size, config.gradient_accumulation_steps, num_processes)
    if len(dataset) < step_examples:
        raise ScratchBertError(
            f"the training split has {len(dataset)} examples, fewer than one optimizer step's "
            f"{optimization.describe(batch_size, config.gradient_accumulation_steps, num_processes)}. "
            "Add text, or lower --batch-size or --gradient-accumulation-steps."
        )
    # Each DataLoader gets its own generator: starting an iteration draws a worker base seed
    # from it, and from torch's global RNG (dropout's stream) if it had none — which would
    # shift dropout in a resumed run, since it starts iterating at a different moment.
    sampler = EpochPermutation(len(dataset), seed, step_examples)
    return DataLoader(examples, batch_size=batch_size, sampler=sampler, collate_fn=collate, num_workers=config.num_workers,
                      generator=torch.Generator().manual_seed(seed))  # fmt: skip


def make_dataloaders(config: PretrainConfig, tokenizer, train_dataset, eval_dataset, accelerator: Accelerator | None = None):
    """The training loader (shuffled by epoch, or a stream's), the held-out loader, and the training collator."""
    train_masking, eval_masking = _masking(config), _masking(config, evaluation=True)
    train_collate = seeded_collator(tokenizer, config.seed, **train_masking)
    eval_collate = seeded_collator(tokenizer, config.seed + 1, **eval_masking)
    held_out = IndexedDataset(eval_dataset)
    num_processes = accelerator.num_processes if accelerator is not None else 1
    if isinstance(train_dataset, datasets.IterableDataset):
        train_loader = streaming.StreamLoader(
            streaming.ExampleStream(train_dataset, config.seed), config.batch_size, config.gradient_accumulation_steps,
            train_collate, accelerator.device, rank=accelerator.process_index, world_size=num_processes,
        )  # fmt: skip
    else:
        train_loader = _shuffled_loader(config, train_dataset, train_collate, config.batch_size, config.seed, num_processes)
    eval_loader = DataLoader(held_out, batch_size=config.batch_size, collate_fn=eval_collate, num_workers=config.num_workers,
                             generator=torch.Generator().manual_seed(config.seed + 1))  # fmt: skip
    return train_loader, eval_loader, train_collate


def make_long_loader(config: PretrainConfig, tokenizer, long_dataset: datasets.Dataset, num_processes: int = 1) -> tuple[DataLoader, SeededCollator]:
    """--long-phase: batches of long examples, about the tokens of a regular batch (BERT kept 256 examples of 512)."""
    long_length = config.long_seq_length or config.max_position_embeddings
    batch_size = max(1, config.batch_size * config.max_seq_length // long_length)
    collate = seeded_collator(tokenizer, config.seed + 2, **_masking(config))
    return _shuffled_loader(config, long_dataset, collate, batch_size, config.seed + 2, num_processes), collate


__all__ = [
    "IGNORE_INDEX", "MLM_INPUTS", "MODEL_INPUTS", "DataCollatorForPretraining", "EpochPermutation", "IndexedDataset", "SeededCollator",
    "make_dataloaders", "make_long_loader", "seeded_collator",
]  # fmt: skip
