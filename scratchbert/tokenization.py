"""BERT's WordPiece tokenizer: assembled from `tokenizers`, trained or loaded, wrapped for transformers.

How BERT turns text into ids (Devlin et al. 2018, section 3; google-research/bert `tokenization.py`):

    text -> normalize   (drop control characters, put spaces around CJK ideographs,
                         optionally lowercase and strip accents)
         -> pre-tokenize (split on whitespace and around every punctuation character)
         -> WordPiece    (each word -> longest vocabulary prefix, then `##`-prefixed
                          continuations; a word with no split, or over 100 characters,
                          becomes [UNK])
         -> template     ([CLS] A [SEP]  or  [CLS] A [SEP] B [SEP], segment ids 0 / 1)

`build_pipeline` wires exactly these components from the Rust `tokenizers` library, one
per line. `train_tokenizer` learns a vocabulary for it from any text; `tokenizer_from_vocab`
loads an existing `vocab.txt` (e.g. bert-base-uncased's). Both return a
`ScratchBertTokenizer`, a transformers tokenizer that saves with `save_pretrained` and
reloads with `AutoTokenizer.from_pretrained`.

`ScratchBertTokenizer` is transformers' Rust-backed tokenizer plus two fixes that make it
give the same ids as the original BERT reference (reproduced by transformers' pure-Python
`BertTokenizerLegacy`), where transformers v5's own `BertTokenizer` does not:

* a pair of long texts is truncated one token at a time from the longer segment, from
  the second on a tie (google-research/bert `_truncate_seq_pair`); the Rust
  "longest_first" strategy shares the budget differently;
* a pair whose second text is empty still ends with its own [SEP]
  (`[CLS] A [SEP] [SEP]`); `BertTokenizer` drops the empty text and the [SEP].

Its normalizer also reproduces three details of the reference that the Rust
`BertNormalizer` misses (see `build_pipeline`), so on real text the ids are identical. What
remains different: characters added to Unicode after the version of the Rust library's
tables (e.g. U+09FD, U+09FE, from Unicode 10) can be classed differently (punctuation or
accent) than Python's `unicodedata` classes them.

`wordpiece_tokenize` is the algorithm written out in Python, the readable reference the
tests prove equal to the Rust model.

Saved tokenizers reload with `AutoTokenizer.from_pretrained(dir)`; this module registers
`ScratchBertTokenizer` with AutoTokenizer when imported. Without scratchbert, transformers
loads the same folder as a generic `TokenizersBackend` from `tokenizer.json`: same
normalizer and casing, but transformers' own pair truncation and empty-pair handling.
"""

from __future__ import annotations

import heapq
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from tokenizers import Encoding, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from tqdm.auto import tqdm
from transformers.tokenization_utils_base import BatchEncoding, PaddingStrategy, TruncationStrategy

from scratchbert.configuration_scratchbert import ScratchBertConfig
from scratchbert.errors import MissingFileError, ScratchBertError
from scratchbert.ingestion import read_lines, text_batches
from scratchbert.weights import hub_snapshot, is_hub_name

PAD_TOKEN = "[PAD]"
UNK_TOKEN = "[UNK]"
CLS_TOKEN = "[CLS]"
SEP_TOKEN = "[SEP]"
MASK_TOKEN = "[MASK]"
# Order matters: the trainer gives special tokens the first ids, so [PAD] gets 0, the
# model's `pad_token_id`.
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN)
DEFAULT_SPECIAL_TOKENS = {"pad_token": PAD_TOKEN, "unk_token": UNK_TOKEN, "cls_token": CLS_TOKEN, "sep_token": SEP_TOKEN, "mask_token": MASK_TOKEN}
CONTINUING_SUBWORD_PREFIX = "##"
# BERT's WordpieceTokenizer gives up on longer words (they become [UNK]): greedy
# longest-match is quadratic in the word length.
MAX_INPUT_CHARS_PER_WORD = 100
# Characters of Unicode category C (control, format, unassigned, private use, surrogate)
# other than tab and newlines: BERT's reference `_clean_text` deletes them.
UNICODE_OTHER = r"[\p{C}&&[^\t\n\r]]"
# A capital sigma after a cased letter and not followed (past case-ignorable characters)
# by another: Python's `str.lower()` makes it the final form "ς" (Unicode's Final_Sigma).
FINAL_CAPITAL_SIGMA = r"(?<=[\p{Lu}\p{Ll}\p{Lt}])Σ(?![\p{Mn}\p{Me}\p{Cf}\p{Lm}\p{Sk}'.:·\u0387\u2018\u2019\u2024\u2027]*[\p{Lu}\p{Ll}\p{Lt}])"


# --------------------------------------------------------------------------------------
# The pipeline
# --------------------------------------------------------------------------------------


def build_pipeline(
    model: models.WordPiece,
    *,
    lowercase: bool = True,
    strip_accents: bool | None = None,
    handle_chinese_chars: bool = True,
    clean_text: bool = True,
) -> Tokenizer:
    """BERT's normalizer, pre-tokenizer and decoder around a WordPiece `model`.

    The post-processor is added by `add_bert_template` once the vocabulary (and so the
    ids of [CLS] and [SEP]) is known. `strip_accents=None` follows `lowercase`, as in BERT.

    `BertNormalizer` does BERT's normalization in Rust, but three details of the reference
    (Python) code differ from it, so three small normalizers run first:

    * `clean_text` drops every character of Unicode category C (control, format,
      unassigned, private use) except tab and newlines; the Rust one keeps unassigned
      code points and some format characters (e.g. the tag characters of flag emoji);
    * the reference composes characters (NFC) first, so "e" + U+0301 and "é" are the
      same word even when accents are kept;
    * Python's `str.lower()` writes a capital sigma that ends a word as "ς"; the Rust
      lowercasing maps it to "σ" whatever follows.
    """
    steps = []
    if clean_text:
        steps.append(normalizers.Replace(Regex(UNICODE_OTHER), ""))  # the reference's `_clean_text`
    steps.append(normalizers.NFC())  # composed characters, as the reference sees them
    if lowercase:
        steps.append(normalizers.Replace(Regex(FINAL_CAPITAL_SIGMA), "ς"))  # Python's `str.lower()`
    steps.append(
        normalizers.BertNormalizer(
            clean_text=clean_text,  # drop NUL and U+FFFD, map every whitespace character to " "
            handle_chinese_chars=handle_chinese_chars,  # every CJK ideograph becomes its own word
            strip_accents=strip_accents,
            lowercase=lowercase,
        )
    )
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()  # whitespace, then each punctuation char alone
    tokenizer.decoder = decoders.WordPiece(prefix=CONTINUING_SUBWORD_PREFIX)  # "play ##ing" -> "playing"
    return tokenizer


def wordpiece_pipeline(
    vocab: dict[str, int] | None, *, lowercase: bool, strip_accents: bool | None, handle_chinese_chars: bool, clean_text: bool
) -> Tokenizer:
    """BERT's pipeline around a WordPiece model: with `vocab` (token -> id) ready to use, without it ready to train."""
    model = models.WordPiece(
        vocab,
        unk_token=UNK_TOKEN,
        continuing_subword_prefix=CONTINUING_SUBWORD_PREFIX,
        max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD,
    )
    return build_pipeline(
        model,
        lowercase=lowercase,
        strip_accents=strip_accents,
        handle_chinese_chars=handle_chinese_chars,
        clean_text=clean_text,
    )


def add_bert_template(tokenizer: Tokenizer) -> None:
    """Add the post-processor `[CLS] A [SEP]` / `[CLS] A [SEP] B [SEP]` (segment ids 0, then 1).

    The ids of [CLS] and [SEP] are read from the tokenizer's own vocabulary.
    """
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    missing = [token for token, index in ids.items() if index is None]
    if missing:
        raise ScratchBertError(
            f"the vocabulary has no {', '.join(missing)}: BERT needs the special tokens "
            f"{' '.join(SPECIAL_TOKENS)}; add them as lines of vocab.txt."
        )
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS_TOKEN}:0 $A:0 {SEP_TOKEN}:0",
        pair=f"{CLS_TOKEN}:0 $A:0 {SEP_TOKEN}:0 $B:1 {SEP_TOKEN}:1",
        special_tokens=[(CLS_TOKEN, ids[CLS_TOKEN]), (SEP_TOKEN, ids[SEP_TOKEN])],
    )


# --------------------------------------------------------------------------------------
# The transformers tokenizer
# --------------------------------------------------------------------------------------


def reference_pair_lengths(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """How many tokens of segments A and B BERT keeps when a pair must fit in `budget`.

    google-research/bert's `_truncate_seq_pair`: while the pair is too long, drop the last
    token of the longer segment, of B when they are equally long. So a short segment
    is kept whole and two long ones end up sharing the budget, A getting the odd token.
    """
    budget = max(budget, 0)
    while len_a + len_b > budget:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    return len_a, len_b


class ScratchBertTokenizer(PreTrainedTokenizerFast):
    """BERT's WordPiece tokenizer for scratchbert: a transformers Rust-backed tokenizer.

    Build one with `train_tokenizer` or `tokenizer_from_vocab`, or as `BertTokenizer` is built:
    `ScratchBertTokenizer(vocab={...} or "vocab.txt", do_lower_case=..., strip_accents=...,
    tokenize_chinese_chars=...)` (also `vocab_file="vocab.txt"`). Reload a saved one with
    `AutoTokenizer.from_pretrained(directory)` (after `import scratchbert`, which registers
    this class). The whole pipeline, casing included, is read back from `tokenizer.json` as
    it is, not rebuilt from keyword arguments (which is how v5's `BertTokenizer` loses
    `do_lower_case=False` when a config does not repeat it).

    Differences from transformers' `BertTokenizer`, both towards the BERT reference:
    pairs truncated with "longest_first" follow `reference_pair_lengths`, and a pair whose
    second text is empty keeps its closing [SEP].
    """

    vocab_files_names = {"vocab_file": "vocab.txt", "tokenizer_file": "tokenizer.json"}
    model_input_names = ["input_ids", "token_type_ids", "attention_mask"]

    def __init__(
        self,
        vocab: dict[str, int] | str | os.PathLike | None = None,
        do_lower_case: bool = True,
        unk_token: str = UNK_TOKEN,
        sep_token: str = SEP_TOKEN,
        pad_token: str = PAD_TOKEN,
        cls_token: str = CLS_TOKEN,
        mask_token: str = MASK_TOKEN,
        tokenize_chinese_chars: bool = True,
        strip_accents: bool | None = None,
        **kwargs,
    ):
        """`BertTokenizer`'s arguments, with its meaning: `vocab` (token -> id, or a vocab.txt path; or
        `vocab_file=`) builds BERT's WordPiece pipeline with those normalizer options. A loaded or wrapped
        pipeline (`tokenizer_file`, `tokenizer_object`) is kept as it is. No vocabulary at all: the five
        special tokens alone, as `BertTokenizer()` builds. Other special tokens than BERT's are refused."""
        specials = dict(unk_token=unk_token, sep_token=sep_token, pad_token=pad_token, cls_token=cls_token, mask_token=mask_token)
        loaded = kwargs.get("tokenizer_object") is not None or os.path.isfile(str(kwargs.get("tokenizer_file") or ""))
        if not loaded:
            for name, token in specials.items():
                if str(token) != DEFAULT_SPECIAL_TOKENS[name]:
                    raise ScratchBertError(
                        f"{name}={str(token)!r}: ScratchBertTokenizer builds BERT's special tokens {' '.join(SPECIAL_TOKENS)}; "
                        "put those in the vocabulary, or use transformers' BertTokenizer for other special tokens."
                    )
            vocab_file = kwargs.pop("vocab_file", None)
            vocab = vocab if vocab is not None else vocab_file
            if vocab is None:
                vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}  # BertTokenizer()'s vocabulary
            elif not isinstance(vocab, dict):
                vocab = read_vocab_file(Path(vocab))
            pipeline = wordpiece_pipeline(
                dict(vocab), lowercase=do_lower_case, strip_accents=strip_accents, handle_chinese_chars=tokenize_chinese_chars, clean_text=True
            )
            add_bert_template(pipeline)
            kwargs["tokenizer_object"] = pipeline
            kwargs.setdefault("clean_up_tokenization_spaces", False)
        super().__init__(
            do_lower_case=do_lower_case, tokenize_chinese_chars=tokenize_chinese_chars, strip_accents=strip_accents, **specials, **kwargs
        )

    @classmethod
    def convert_to_native_format(cls, trust_remote_code=False, **kwargs):
        """Hand a saved tokenizer.json to `__init__` to load as it is, as transformers does for a class
        without an `__init__` of its own (`trust_remote_code=True` selects that branch), rather than
        extracting its vocabulary for `__init__` to rebuild a pipeline from keyword arguments."""
        return super().convert_to_native_format(trust_remote_code=True, **kwargs)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        """Write `vocab.txt`: one token per line, line number = id (BERT's format)."""
        vocab = self._tokenizer.get_vocab(with_added_tokens=False)
        tokens = sorted(vocab, key=vocab.get)
        if [vocab[token] for token in tokens] != list(range(len(tokens))):
            raise ScratchBertError("the WordPiece ids are not 0..N-1, so they cannot be written as vocab.txt lines.")
        name = (filename_prefix + "-" if filename_prefix else "") + self.vocab_files_names["vocab_file"]
        path = os.path.join(save_directory, name)
        with open(path, "w", encoding="utf-8") as file:
            file.writelines(token + "\n" for token in tokens)
        return (path,)

    def _save_pretrained(self, save_directory, file_names, legacy_format=None, filename_prefix=None):
        # The Rust-backed base writes only tokenizer.json; add vocab.txt so the folder also
        # loads in BERT's original code and in any WordPiece tokenizer.
        file_names = super()._save_pretrained(save_directory, file_names, legacy_format, filename_prefix)
        return file_names + self.save_vocabulary(str(save_directory), filename_prefix)

    def _encode_plus(
        self,
        text,
        text_pair=None,
        add_special_tokens: bool = True,
        padding_strategy: PaddingStrategy = PaddingStrategy.DO_NOT_PAD,
        truncation_strategy: TruncationStrategy = TruncationStrategy.DO_NOT_TRUNCATE,
        max_length: int | None = None,
        stride: int = 0,
        is_split_into_words: bool = False,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_tensors=None,
        return_token_type_ids: bool | None = None,
        return_attention_mask: bool | None = None,
        return_overflowing_tokens: bool = False,
        return_special_tokens_mask: bool = False,
        return_offsets_mapping: bool = False,
        return_length: bool = False,
        verbose: bool = True,
        split_special_tokens: bool | None = None,
        **kwargs,
    ) -> BatchEncoding:
        """Pairs are encoded here (see the class docstring); everything else by the base class."""
        options = dict(
            add_special_tokens=add_special_tokens,
            padding_strategy=padding_strategy,
            truncation_strategy=truncation_strategy,
            max_length=max_length,
            stride=stride,
            is_split_into_words=is_split_into_words,
            pad_to_multiple_of=pad_to_multiple_of,
            padding_side=padding_side,
            return_tensors=return_tensors,
            return_token_type_ids=return_token_type_ids,
            return_attention_mask=return_attention_mask,
            return_overflowing_tokens=return_overflowing_tokens,
            return_special_tokens_mask=return_special_tokens_mask,
            return_offsets_mapping=return_offsets_mapping,
            return_length=return_length,
            verbose=verbose,
            split_special_tokens=split_special_tokens,
        )
        handled_here = (
            text_pair is not None
            and truncation_strategy in (TruncationStrategy.DO_NOT_TRUNCATE, TruncationStrategy.LONGEST_FIRST)
            and not return_overflowing_tokens  # the reference cannot return them for longest_first pairs either
            and not kwargs
        )
        if not handled_here:
            return super()._encode_plus(text, text_pair, **options, **kwargs)
        return self._encode_pairs(text, text_pair, **options)

    def _encode_pairs(
        self,
        text,
        text_pair,
        *,
        add_special_tokens,
        padding_strategy,
        truncation_strategy,
        max_length,
        stride,
        is_split_into_words,
        pad_to_multiple_of,
        padding_side,
        return_tensors,
        split_special_tokens,
        verbose,
        **return_options,
    ) -> BatchEncoding:
        """Encode A and B apart, truncate as BERT does, then add [CLS]/[SEP] and pad."""
        firsts, seconds, is_batched = _pair_batch(text, text_pair, is_split_into_words)
        # Truncation and padding are done below on the Encoding objects, so the Rust
        # tokenizer must do neither.
        self.set_truncation_and_padding(
            padding_strategy=PaddingStrategy.DO_NOT_PAD,
            truncation_strategy=TruncationStrategy.DO_NOT_TRUNCATE,
            max_length=max_length,
            stride=stride,
            pad_to_multiple_of=None,
            padding_side=padding_side,
        )
        self._tokenizer.encode_special_tokens = self.split_special_tokens if split_special_tokens is None else split_special_tokens
        encodings_a, encodings_b = self._encode_segments(firsts, seconds, is_split_into_words)
        truncate_to = max_length if truncation_strategy == TruncationStrategy.LONGEST_FIRST else None
        encodings = self._join_pairs(encodings_a, encodings_b, add_special_tokens, truncate_to)
        if padding_strategy != PaddingStrategy.DO_NOT_PAD:
            self._pad_encodings(encodings, padding_strategy, max_length, pad_to_multiple_of, padding_side)
        columns = self._encoding_columns(encodings, verbose, return_options)
        for input_ids in columns["input_ids"]:
            self._eventual_warn_about_too_long_sequence(input_ids, max_length, verbose)
        if not is_batched and return_tensors is None:
            # A single pair: one list per key, not a batch of one.
            return BatchEncoding({key: value[0] for key, value in columns.items()}, encodings)
        return BatchEncoding(columns, encodings, tensor_type=return_tensors)

    def _encode_segments(self, firsts: list, seconds: list, is_split_into_words: bool) -> tuple[list[Encoding], list[Encoding]]:
        """Each text of the pairs on its own, with no post-processor at all.

        Even with add_special_tokens=False the post-processor marks an encoding as sequence 0, and
        `post_process(a, b)` then lets B's sequence-0 mark overwrite A's: every token of A would
        report `sequence_ids()` None. Encodings that carry no mark get 0 and 1, as `encode(a, b)` gives.
        """
        backend = self._tokenizer
        post_processor, backend.post_processor = backend.post_processor, None
        try:
            encodings_a = backend.encode_batch(firsts, add_special_tokens=False, is_pretokenized=is_split_into_words)
            encodings_b = backend.encode_batch(seconds, add_special_tokens=False, is_pretokenized=is_split_into_words)
        finally:
            backend.post_processor = post_processor
        return encodings_a, encodings_b

    def _join_pairs(self, encodings_a, encodings_b, add_special_tokens: bool, truncate_to: int | None) -> list[Encoding]:
        """Each pair cut to `truncate_to` tokens by BERT's rule (`reference_pair_lengths`), then [CLS] A [SEP] B [SEP]."""
        num_special = self._tokenizer.num_special_tokens_to_add(True) if add_special_tokens else 0
        encodings: list[Encoding] = []
        for encoding_a, encoding_b in zip(encodings_a, encodings_b):
            if truncate_to is not None:
                keep_a, keep_b = reference_pair_lengths(len(encoding_a), len(encoding_b), truncate_to - num_special)
                encoding_a.truncate(keep_a, direction=self.truncation_side)
                encoding_b.truncate(keep_b, direction=self.truncation_side)
            encodings.append(self._tokenizer.post_process(encoding_a, encoding_b, add_special_tokens))
        return encodings

    def _pad_encodings(self, encodings: list[Encoding], padding_strategy, max_length, pad_to_multiple_of, padding_side) -> None:
        """Pad in place to the longest pair (or `max_length`), rounded up to `pad_to_multiple_of`."""
        target = max(len(e) for e in encodings) if padding_strategy == PaddingStrategy.LONGEST else max_length
        if pad_to_multiple_of and target % pad_to_multiple_of:
            target += pad_to_multiple_of - target % pad_to_multiple_of
        for encoding in encodings:
            encoding.pad(
                target,
                direction=padding_side or self.padding_side,
                pad_id=self.pad_token_id,
                pad_type_id=self.pad_token_type_id,
                pad_token=self.pad_token,
            )

    def _encoding_columns(self, encodings: list[Encoding], verbose: bool, return_options: dict) -> dict[str, list]:
        """The encodings as transformers' output columns (input_ids, token_type_ids, ... as `return_options` ask)."""
        columns: dict[str, list] = {}
        for encoding in encodings:
            converted, _ = self._convert_encoding(encoding=encoding, verbose=verbose, **return_options)
            for key, value in converted.items():
                columns.setdefault(key, []).extend(value)
        return columns


def _pair_batch(text, text_pair, is_split_into_words: bool) -> tuple[list, list, bool]:
    """(segments A, segments B, whether a batch was given): one pair or a batch of pairs, as lists."""
    if is_split_into_words:
        is_batched = isinstance(text, (list, tuple)) and bool(text) and isinstance(text[0], (list, tuple))
    else:
        is_batched = isinstance(text, (list, tuple))
    if not is_batched:
        return [text], [text_pair], False
    if isinstance(text_pair, str) or len(text) != len(text_pair):
        raise ValueError("when tokenizing a batch of pairs, `text_pair` must be a list as long as `text`.")
    return list(text), list(text_pair), True


# Transformers' v5 naming: the Rust-backed class carries the plain name, "Fast" is an alias.
ScratchBertTokenizerFast = ScratchBertTokenizer

# `import scratchbert` (or this module) makes AutoTokenizer find the class, both from the
# `tokenizer_class` recorded in tokenizer_config.json and for a ScratchBertConfig checkpoint.
AutoTokenizer.register(ScratchBertConfig, tokenizer_class=ScratchBertTokenizer, exist_ok=True)


def wrap_tokenizer(
    tokenizer: Tokenizer,
    *,
    lowercase: bool,
    strip_accents: bool | None,
    handle_chinese_chars: bool,
    model_max_length: int,
) -> ScratchBertTokenizer:
    """Wrap a `tokenizers.Tokenizer` built by `build_pipeline` as a transformers tokenizer.

    The normalizer options are also recorded as BERT's `tokenizer_config.json` keys
    (`do_lower_case`, ...), so other BERT tokenizer classes that read them, such as
    transformers' `BertTokenizer`, load the folder with the same casing.
    """
    if not isinstance(model_max_length, int) or model_max_length <= 0:
        raise ScratchBertError(f"model_max_length={model_max_length!r}: it must be a positive integer (the model's max_position_embeddings).")
    add_bert_template(tokenizer)
    return ScratchBertTokenizer(
        tokenizer_object=tokenizer,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        cls_token=CLS_TOKEN,
        sep_token=SEP_TOKEN,
        mask_token=MASK_TOKEN,
        model_max_length=model_max_length,
        do_lower_case=lowercase,
        strip_accents=strip_accents,
        tokenize_chinese_chars=handle_chinese_chars,
        clean_up_tokenization_spaces=False,  # decode exactly what the WordPiece decoder joins
    )


# --------------------------------------------------------------------------------------
# Training and loading
# --------------------------------------------------------------------------------------


def train_tokenizer(
    texts,
    vocab_size: int = 30522,
    min_frequency: int = 2,
    lowercase: bool = True,
    strip_accents: bool | None = None,
    handle_chinese_chars: bool = True,
    clean_text: bool = True,
    model_max_length: int = 512,
    show_progress: bool = True,
    deterministic: bool = True,
) -> ScratchBertTokenizer:
    """Learn a WordPiece vocabulary of `vocab_size` tokens from `texts` and return the tokenizer.

    Args:
        texts: a file path or glob, a list of them (UTF-8, one or more texts per line;
            .gz/.bz2/.xz are read too), or any iterable of strings or of lists of strings,
            streamed in batches so the corpus need not fit in memory (`ingestion.text_batches`).
            A list of strings is read as file paths only when every string names an existing file.
        vocab_size: tokens in the final vocabulary, the five special tokens included.
        min_frequency: a pair of pieces seen fewer times is never merged.
        lowercase, strip_accents, handle_chinese_chars, clean_text: BertNormalizer's
            options (`strip_accents=None` follows `lowercase`).
        model_max_length: longest input the model takes (its `max_position_embeddings`).
        show_progress: show the trainer's progress bars.
        deterministic: True: scratchbert's trainer (`train_wordpiece_vocab`), the same
            vocabulary for the same texts and options in every run and process. False: the
            `tokenizers` library's `WordPieceTrainer` (Rust, on every core, faster), whose
            vocabulary changes from run to run (huggingface/tokenizers#1794).

    Returns a `ScratchBertTokenizer` whose special tokens [PAD] [UNK] [CLS] [SEP] [MASK]
    have ids 0-4. Raises ValueError for an empty corpus or a vocabulary too small to hold
    the special tokens (and, when deterministic, every character of the corpus).
    """
    if not isinstance(vocab_size, int) or vocab_size <= len(SPECIAL_TOKENS):
        raise ScratchBertError(f"vocab_size={vocab_size!r}: it must be an integer above {len(SPECIAL_TOKENS)} (the special tokens).")
    if not isinstance(min_frequency, int) or min_frequency < 0:
        raise ScratchBertError(f"min_frequency={min_frequency!r}: it must be a non-negative integer.")
    options = dict(lowercase=lowercase, strip_accents=strip_accents, handle_chinese_chars=handle_chinese_chars, clean_text=clean_text)
    tokenizer = wordpiece_pipeline(None, **options)
    if deterministic:
        vocab = train_wordpiece_vocab(
            text_batches(texts),
            normalizer=tokenizer.normalizer,  # the words the finished tokenizer will see
            pre_tokenizer=tokenizer.pre_tokenizer,
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=SPECIAL_TOKENS,
            continuing_subword_prefix=CONTINUING_SUBWORD_PREFIX,
            show_progress=show_progress,
        )
        tokenizer = wordpiece_pipeline({token: index for index, token in enumerate(vocab)}, **options)
    else:
        _train_with_tokenizers(tokenizer, texts, vocab_size, min_frequency, show_progress)
    options.pop("clean_text")  # the pipeline's; the wrapper records the casing options
    return wrap_tokenizer(tokenizer, model_max_length=model_max_length, **options)


def _train_with_tokenizers(tokenizer: Tokenizer, texts, vocab_size: int, min_frequency: int, show_progress: bool) -> None:
    """Train `tokenizer`'s WordPiece model in place with the `tokenizers` library's trainer."""
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        continuing_subword_prefix=CONTINUING_SUBWORD_PREFIX,
        show_progress=show_progress,
    )
    # Count the texts the trainer actually sees, to tell an empty corpus from a small one.
    seen = {"texts": 0, "non_blank": 0}

    def counted_batches() -> Iterator[list[str]]:
        for batch in text_batches(texts):
            seen["texts"] += len(batch)
            seen["non_blank"] += sum(1 for text in batch if text.strip())
            yield batch

    tokenizer.train_from_iterator(counted_batches(), trainer=trainer)
    if seen["non_blank"] == 0:
        raise ScratchBertError(
            f"the training corpus is empty ({seen['texts']} texts, none with any non-space character): "
            "pass files or strings that contain text."
        )


def read_vocab_file(vocab_file: Path) -> dict[str, int]:
    """A BERT `vocab.txt` as token -> id (one token per line, line number = id)."""
    if not vocab_file.is_file():
        raise MissingFileError(f"no such vocabulary file: {vocab_file}")
    vocab: dict[str, int] = {}
    for index, line in enumerate(read_lines([vocab_file])):
        token = line.rstrip("\n")  # only the newline ends a token, as in BERT's loader
        if token in vocab:
            raise ScratchBertError(
                f"{vocab_file} lists {token!r} twice (lines {vocab[token] + 1} and {index + 1}); "
                "a vocab.txt holds each token once, its line number being its id."
            )
        vocab[token] = index
    if not vocab:
        raise ScratchBertError(f"{vocab_file} is empty: a vocab.txt lists one token per line.")
    return vocab


def tokenizer_from_vocab(
    vocab_file: str | os.PathLike,
    lowercase: bool = True,
    strip_accents: bool | None = None,
    handle_chinese_chars: bool = True,
    clean_text: bool = True,
    model_max_length: int = 512,
) -> ScratchBertTokenizer:
    """Build the tokenizer from an existing BERT `vocab.txt` (one token per line, line = id).

    Use `lowercase=True` for an uncased vocabulary (bert-base-uncased), False for a cased one.
    """
    vocab = read_vocab_file(Path(vocab_file))
    tokenizer = wordpiece_pipeline(
        vocab, lowercase=lowercase, strip_accents=strip_accents, handle_chinese_chars=handle_chinese_chars, clean_text=clean_text
    )
    return wrap_tokenizer(
        tokenizer,
        lowercase=lowercase,
        strip_accents=strip_accents,
        handle_chinese_chars=handle_chinese_chars,
        model_max_length=model_max_length,
    )


# --------------------------------------------------------------------------------------
# Learning the vocabulary, written out: scratchbert's deterministic WordPiece trainer
# --------------------------------------------------------------------------------------
# Learning a WordPiece vocabulary, deterministically: the algorithm written out in Python.
#
# BERT's vocabulary is learned the way the `tokenizers` library's `WordPieceTrainer` learns it,
# which is byte-pair encoding (Sennrich et al. 2016) with a continuing-subword prefix:
#
#     1. count words      normalize every text and split it into words with the same
#                         normalizer and pre-tokenizer the finished tokenizer uses;
#     2. alphabet         every character of those words is a token, and so is its
#                         `##`-prefixed form when it occurs inside a word ("##g" in "dog");
#                         `limit_alphabet` keeps only the most frequent characters;
#     3. split words      each word starts as its characters: "dog" -> d ##o ##g;
#     4. merge            count every adjacent pair of pieces (weighted by how often the
#                         word occurs), merge the most frequent pair everywhere into one
#                         new token (d + ##o -> do, ##o + ##g -> ##og), repeat until the
#                         vocabulary holds `vocab_size` tokens or no pair is seen
#                         `min_frequency` times.
#
# The special tokens come first, so [PAD] is id 0. Rare words are not dropped: like
# `tokenizers`, `min_frequency` applies to pairs, so a pair seen fewer times is never merged.
#
# Why not just call `tokenizers.trainers.WordPieceTrainer`? It is not reproducible: the ids of
# the `##` pieces follow the iteration order of a Rust HashMap, and ties between equally
# frequent pairs are broken by those ids, so the same corpus gives a different vocabulary in
# every process and every call (huggingface/tokenizers#1794). Here every id is canonical:
# special tokens in the order given, characters by code point, their `##` forms by code
# point, then merged tokens in the order learned. Ties are broken as `tokenizers` breaks them,
# by those ids: among equally frequent pairs the one with the smaller left id wins, then the
# smaller right id, which favours pairs of older pieces (characters, then the earliest
# merges). Breaking ties by the pairs' strings instead would favour `##` pieces and digits,
# which sort before letters, and drift away from `tokenizers`' vocabularies. The same corpus
# and options give the same vocabulary, byte for byte, in any process, and it differs from a
# `tokenizers` one about as much as two `tokenizers` runs differ from each other.
#
# Two deliberate differences from `tokenizers`, both about rare cases:
# * a character left out by `limit_alphabet` splits its word there (no pair spans it);
#   `tokenizers` drops the character and lets its neighbours merge as if it were not there,
#   learning pieces of text that never occurs;
# * a pair is merged in every word that holds it at once; `tokenizers` can merge a pair in
#   two installments when the pair gained words after it was queued.
#
# Counting words is most of the time on a large corpus, so each text is normalized (in Rust)
# and cut at spaces by Python's `str.split`, and the pre-tokenizer then runs once per distinct
# space-separated chunk ("movie," occurs thousands of times, is split once). That needs a
# pre-tokenizer that splits at spaces and drops them, as BERT's does; `count_words` checks.
#
# Merging is incremental, so training takes time proportional to the pieces that change,
# not to the corpus times the number of merges: the trainer keeps
#     pair_counts   (left id, right id) -> how many times the pair occurs in the corpus,
#     where         (left id, right id) -> indices of the distinct words that may hold it,
#     heap          (-count, left id, right id) entries, the smallest being the pair to
#                   merge next, one pushed whenever a pair's count changes; an entry whose
#                   count is no longer the pair's count is stale and skipped when popped
#                   ("lazy deletion"), so counts never have to be updated inside the heap.
#
# `segmentation_stats` judges a trained vocabulary: tokens per word on held-out text.


def count_words(batches_of_texts: Iterable[list[str]], normalizer=None, pre_tokenizer=None) -> Counter[str]:
    """How often each word occurs: step 1, with `tokenizers` components.

    `normalizer` is a `tokenizers.normalizers.Normalizer` (None: texts as they are) and
    `pre_tokenizer` a `tokenizers.pre_tokenizers.PreTokenizer` that splits at spaces and
    drops them, like BERT's (None: each normalized text is one word, as `tokenizers` does
    without a pre-tokenizer). The words are those the tokenizer itself would see.
    The counter lists words in the order first seen, which the training does not depend on.
    """
    if pre_tokenizer is not None and [word for word, _span in pre_tokenizer.pre_tokenize_str("a b")] != ["a", "b"]:
        raise ScratchBertError(
            f"pre_tokenizer {pre_tokenizer} does not split 'a b' into 'a' and 'b': this trainer counts space-separated "
            "chunks before pre-tokenizing them, so it needs a pre-tokenizer that splits at spaces and drops them "
            "(BertPreTokenizer, Whitespace, WhitespaceSplit); use tokenizers' own trainer for others."
        )
    chunks: Counter[str] = Counter()  # space-separated pieces of normalized text (or whole texts)
    for batch in batches_of_texts:
        if isinstance(batch, str):
            raise ValueError("batches_of_texts must yield lists of strings, not single strings; wrap each text in a list.")
        for text in batch:
            if not isinstance(text, str):
                raise ValueError(f"texts must be strings; found {type(text).__name__}: {text!r:.60}")
            if normalizer is not None:
                text = normalizer.normalize_str(text)
            if pre_tokenizer is None:
                chunks[text] += 1
            else:
                chunks.update(text.split(" "))  # counted in C; "" from runs of spaces is dropped below
    chunks.pop("", None)
    if pre_tokenizer is None:
        return chunks
    words: Counter[str] = Counter()
    for chunk, count in chunks.items():
        for word, _span in pre_tokenizer.pre_tokenize_str(chunk):
            words[word] += count
    return words


def _alphabet(word_counts: Counter[str], limit_alphabet: int | None) -> list[str]:
    """The characters that become tokens (step 2), sorted by code point.

    Each character is weighted by the counts of the words it occurs in; with
    `limit_alphabet`, only that many of the most frequent survive, ties going to the
    smaller code point.
    """
    char_counts: Counter[str] = Counter()
    for word, count in word_counts.items():
        for char in word:
            char_counts[char] += count
    chars = sorted(char_counts, key=lambda char: (-char_counts[char], char))
    if limit_alphabet is not None:
        chars = chars[:limit_alphabet]
    return sorted(chars)


def _split_words(word_counts: Counter[str], alphabet: set[str], prefix: str) -> tuple[list[str], list[list[str]], list[int]]:
    """Each word as a list of one-character pieces (step 3), and the `##` pieces that occur.

    A character outside the alphabet cannot become a token, so it splits its word in
    two parts that never merge with each other; the part after it starts with a
    continuation piece, since it is not the start of a word.
    Returns (continuation pieces sorted by code point, pieces of each part, count of each part).
    """
    continuations: set[str] = set()
    parts: list[list[str]] = []
    part_counts: list[int] = []
    for word, count in word_counts.items():
        pieces: list[str] = []
        for position, char in enumerate(word):
            if char not in alphabet:
                if len(pieces) > 1:  # a lone piece has no pairs and never changes
                    parts.append(pieces)
                    part_counts.append(count)
                pieces = []
                continue
            piece = char if position == 0 else prefix + char
            if position > 0:
                continuations.add(piece)
            pieces.append(piece)
        if len(pieces) > 1:
            parts.append(pieces)
            part_counts.append(count)
    return sorted(continuations), parts, part_counts


def _initial_vocab(
    word_counts: Counter[str], special_tokens: Sequence[str], limit_alphabet: int | None, prefix: str, vocab_size: int
) -> tuple[list[str], list[list[int]], list[int]]:
    """Steps 2-3: special tokens, then the alphabet, then its `##` forms; the words split into their ids.

    Returns (the vocabulary so far in id order, the pieces of each word part as ids, the count
    of each part). Raises when `vocab_size` cannot hold that vocabulary.
    """
    alphabet = _alphabet(word_counts, limit_alphabet)
    continuations, parts, part_counts = _split_words(word_counts, set(alphabet), prefix)
    vocab = list(dict.fromkeys([*special_tokens, *alphabet, *continuations]))  # a special token may also be a character
    if vocab_size < len(vocab):
        raise ScratchBertError(
            f"vocab_size={vocab_size} is too small: the {len(special_tokens)} special tokens and the corpus's "
            f"{len(alphabet)} characters (alone and as {prefix}-continuations) already take "
            f"{len(vocab)} tokens; raise vocab_size to at least {len(vocab)}, or set limit_alphabet."
        )
    ids = {token: index for index, token in enumerate(vocab)}
    return vocab, [[ids[piece] for piece in pieces] for pieces in parts], part_counts


class _PairIndex:
    """Step 4's bookkeeping (module docstring): the words as ids, `pair_counts`, `where` and the heap.

    Every adjacent pair is counted once, here; after that, counts change only where merges happen.
    """

    def __init__(self, words: list[list[int]], counts: list[int], min_frequency: int):
        self.words, self.counts = words, counts  # pieces as ids, merged in place; how often each word occurs
        self.pair_counts: defaultdict[tuple[int, int], int] = defaultdict(int)
        self.where: defaultdict[tuple[int, int], set[int]] = defaultdict(set)
        for index, (word, count) in enumerate(zip(words, counts)):
            for pair in zip(word, word[1:]):
                self.pair_counts[pair] += count
                self.where[pair].add(index)
        # Pairs below the threshold are never merged, so they stay out of the heap until
        # their count reaches it. Ties go to the pair with the smaller ids.
        self.threshold = max(min_frequency, 1)
        self.heap = [(-count, a, b) for (a, b), count in self.pair_counts.items() if count >= self.threshold]
        heapq.heapify(self.heap)

    def most_frequent(self) -> tuple[int, int] | None:
        """The pair to merge next, or None when no pair is seen `min_frequency` times."""
        while self.heap:
            negative_count, a, b = heapq.heappop(self.heap)
            if self.pair_counts.get((a, b)) == -negative_count:
                return a, b
            # else stale: the pair's count changed (a newer entry holds it) or it was merged
        return None

    def merge(self, a: int, b: int, new: int) -> None:
        """Replace every (a, b) by `new` in the words that hold it, and update the pair counts."""
        deltas, gained = self._replace(a, b, new)
        for pair, delta in deltas.items():
            if delta == 0:
                continue
            count = self.pair_counts[pair] + delta
            if count > 0:
                self.pair_counts[pair] = count
                if count >= self.threshold:
                    heapq.heappush(self.heap, (-count, *pair))
            else:
                del self.pair_counts[pair]
        # `where` may keep words that lost a pair: merging there finds nothing, which is cheaper
        # than tracking each word's pairs.
        for pair, indices in gained.items():
            self.where[pair].update(indices)

    def _replace(self, a: int, b: int, new: int):
        """Merge (a, b) left to right in each word that holds it; return how the pair counts change.

        In  x a b y  the pairs (x, a), (a, b) and (b, y) go, (x, new) and (new, y) come, each as
        often as the word occurs. Overlaps come out right on their own: in  a a a  merging
        (a, a) also removes the second (a, a). Returns (count change per pair, words gaining each pair).
        """
        deltas: defaultdict[tuple[int, int], int] = defaultdict(int)
        gained: defaultdict[tuple[int, int], list[int]] = defaultdict(list)
        for index in self.where.pop((a, b)):
            word, count = self.words[index], self.counts[index]
            i = 0
            while i < len(word) - 1:
                if word[i] == a and word[i + 1] == b:
                    deltas[a, b] -= count
                    if i > 0:
                        deltas[word[i - 1], a] -= count
                        deltas[word[i - 1], new] += count
                        gained[word[i - 1], new].append(index)
                    if i + 2 < len(word):
                        deltas[b, word[i + 2]] -= count
                        deltas[new, word[i + 2]] += count
                        gained[new, word[i + 2]].append(index)
                    word[i : i + 2] = [new]
                i += 1
        return deltas, gained


def _check_options(vocab_size, min_frequency, limit_alphabet, continuing_subword_prefix) -> None:
    """Refuse options the trainer cannot honour, before the corpus is read."""
    if not isinstance(vocab_size, int) or vocab_size < 1:
        raise ScratchBertError(f"vocab_size={vocab_size!r}: it must be a positive integer.")
    if not isinstance(min_frequency, int) or min_frequency < 0:
        raise ScratchBertError(f"min_frequency={min_frequency!r}: it must be a non-negative integer.")
    if limit_alphabet is not None and (not isinstance(limit_alphabet, int) or limit_alphabet < 1):
        raise ScratchBertError(f"limit_alphabet={limit_alphabet!r}: it must be a positive integer or None.")
    if not continuing_subword_prefix:
        raise ScratchBertError("continuing_subword_prefix must be a non-empty string (BERT's is '##').")


def train_wordpiece_vocab(
    batches_of_texts: Iterable[list[str]],
    *,
    normalizer=None,
    pre_tokenizer=None,
    vocab_size: int,
    min_frequency: int = 0,
    limit_alphabet: int | None = None,
    special_tokens: Sequence[str] = (),
    continuing_subword_prefix: str = "##",
    show_progress: bool = False,
) -> list[str]:
    """Learn a WordPiece vocabulary from `batches_of_texts`, the same in every process and call.

    Args:
        batches_of_texts: an iterable of lists of strings, read once (streamed).
        normalizer, pre_tokenizer: the `tokenizers` components of the tokenizer the
            vocabulary is for (e.g. `tokenizer.normalizer`, `tokenizer.pre_tokenizer`).
        vocab_size: tokens in the vocabulary, special tokens included. Fewer come back
            when the corpus runs out of pairs seen `min_frequency` times.
        min_frequency: a pair of pieces seen fewer times is never merged (0 and 1 both
            allow every pair, as in `tokenizers`).
        limit_alphabet: keep only this many of the most frequent characters (None: all).
        special_tokens: tokens given the first ids, in this order.
        continuing_subword_prefix: marks a piece that continues a word ("##ing").
        show_progress: show a progress bar over the merges (tqdm, on stderr).

    Returns the vocabulary in id order: special tokens, the characters (by code point),
    their prefixed forms (by code point), then one token per merge in the order learned.
    Raises ValueError for an empty corpus or a `vocab_size` too small to hold the special
    tokens and the alphabet.
    """
    _check_options(vocab_size, min_frequency, limit_alphabet, continuing_subword_prefix)
    word_counts = count_words(batches_of_texts, normalizer, pre_tokenizer)  # 1.
    if not word_counts:
        raise ScratchBertError(
            "the training corpus is empty (no words after normalization and pre-tokenization): "
            "pass files or strings that contain text."
        )
    vocab, words, counts = _initial_vocab(word_counts, special_tokens, limit_alphabet, continuing_subword_prefix, vocab_size)
    ids = {token: index for index, token in enumerate(vocab)}  # token -> id; vocab is id -> token
    pairs = _PairIndex(words, counts, min_frequency)  # 4.
    with tqdm(total=vocab_size - len(vocab), desc="WordPiece merges", unit=" tokens", disable=not show_progress) as progress:
        while len(vocab) < vocab_size and (pair := pairs.most_frequent()) is not None:
            a, b = pair
            # The new token joins the two strings, dropping the right one's `##`:
            # "play" + "##ing" -> "playing", "##in" + "##g" -> "##ing".
            token = vocab[a] + vocab[b].removeprefix(continuing_subword_prefix)
            if token not in ids:  # "abc" can come from "ab" + "##c" and from "a" + "##bc"
                ids[token] = len(vocab)
                vocab.append(token)
                progress.update(1)
            pairs.merge(a, b, ids[token])
    return vocab


def segmentation_stats(tokenizer, texts: Sequence[str]) -> dict[str, float]:
    """How finely a trained tokenizer cuts `texts`: the usual measure of a vocabulary's quality.

    `tokenizer` is a transformers tokenizer with a Rust backend (what `train_tokenizer`
    returns). Returns the counts of `words` (after pre-tokenization) and `tokens`,
    `tokens_per_word` (1.0 would mean every word is in the vocabulary; fewer pieces per
    word leave more of the model's sequence length for text) and `unknown_share`, the
    fraction of tokens that are the unknown token.
    """
    backend = tokenizer.backend_tokenizer
    unknown_id = backend.token_to_id(backend.model.unk_token)
    words = tokens = unknown = 0
    for encoding in backend.encode_batch(list(texts), add_special_tokens=False):
        words += len({word for word in encoding.word_ids if word is not None})
        tokens += len(encoding.ids)
        unknown += encoding.ids.count(unknown_id)
    if words == 0:
        raise ScratchBertError("segmentation_stats needs texts with at least one word.")
    return {"words": words, "tokens": tokens, "tokens_per_word": tokens / words, "unknown_share": unknown / tokens}


# --------------------------------------------------------------------------------------
# Tokenizing, written out
# --------------------------------------------------------------------------------------


def wordpiece_tokenize(
    word: str,
    vocab,
    unk_token: str = UNK_TOKEN,
    prefix: str = CONTINUING_SUBWORD_PREFIX,
    max_input_chars_per_word: int = MAX_INPUT_CHARS_PER_WORD,
) -> list[str]:
    """Split one pre-tokenized word into WordPiece tokens: greedy longest-match-first.

    This is the algorithm of BERT's `WordpieceTokenizer` in plain Python, the readable
    reference for the Rust `models.WordPiece` (the tests check they agree). From the
    start of the word, take the longest piece that is in `vocab`, then continue after it
    with `prefix`-marked pieces. If at some point no piece matches, the whole word is
    `unk_token` (not just the unmatched rest).

        >>> vocab = {"un", "##aff", "##able"}
        >>> wordpiece_tokenize("unaffable", vocab)
        ['un', '##aff', '##able']
        >>> wordpiece_tokenize("unaffablex", vocab)  # "##x" is not in the vocabulary
        ['[UNK]']
    """
    if len(word) > max_input_chars_per_word:
        return [unk_token]
    pieces: list[str] = []
    start = 0
    while start < len(word):
        # Try word[start:], then one character shorter, and so on.
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else prefix + word[start:end]
            if piece in vocab:
                break
        else:
            return [unk_token]
        pieces.append(piece)
        start = end
    return pieces


def python_tokenize(tokenizer: ScratchBertTokenizer, text: str, vocab=None) -> list[str]:
    """`tokenizer.tokenize(text)` with the WordPiece step done by `wordpiece_tokenize`.

    Normalization and pre-tokenization are the tokenizer's own (Rust) steps; special
    tokens written in the text (e.g. "[MASK]") are not recognised here. Pass `vocab`
    (`tokenizer.get_vocab()`) when calling this many times: copying it out of Rust costs
    more than tokenizing a text.
    """
    backend = tokenizer.backend_tokenizer
    vocab = backend.get_vocab(with_added_tokens=False) if vocab is None else vocab
    normalized = backend.normalizer.normalize_str(text)
    words = [word for word, _span in backend.pre_tokenizer.pre_tokenize_str(normalized)]
    return [piece for word in words for piece in wordpiece_tokenize(word, vocab)]


def _vocab_is_cased(vocab_file: Path) -> bool:
    """True when the vocabulary holds upper-case tokens, i.e. it was built without lowercasing.

    An uncased BERT vocabulary has no upper-case letters outside bracketed special tokens
    such as `[CLS]`, so lowercasing its input loses nothing; a cased one needs the case kept.
    """
    with open(vocab_file, encoding="utf-8") as file:
        return any(token != token.lower() and not token.startswith("[") for token in (line.rstrip("\n") for line in file))


def check_vocabulary(vocab_size: int, tokenizer, where: str | os.PathLike) -> None:
    """Refuse, in one line, a tokenizer with ids the model's embedding table does not have."""
    if len(tokenizer) > vocab_size:
        raise ScratchBertError(
            f"the tokenizer of {where} has {len(tokenizer)} tokens but the model's vocabulary only {vocab_size}: they are not "
            "a pair. Use the tokenizer the model was trained with, or resize the model first "
            "(model.resize_token_embeddings(len(tokenizer)), then save it)."
        )


def load_tokenizer(path: str | os.PathLike, max_length: int = 512):
    """The tokenizer saved in a folder (a model's, or one written by `train-tokenizer`), or a Hub repository's.

    A folder with a saved tokenizer (`tokenizer.json` or `tokenizer_config.json`) loads it
    with `AutoTokenizer`, exactly as saved. A folder with only BERT's `vocab.txt` (older
    checkpoints), or a `vocab.txt` itself, gets scratchbert's WordPiece tokenizer built from
    it, lowercasing unless the vocabulary itself holds upper-case tokens.
    """
    path = Path(path)
    if not path.exists() and is_hub_name(str(path)):  # "bert-base-uncased": the Hub repository's tokenizer
        path = hub_snapshot(str(path), weights=False)
    if path.is_file() and path.suffix == ".txt":
        return tokenizer_from_vocab(path, lowercase=not _vocab_is_cased(path), model_max_length=max_length)
    if not path.is_dir():
        raise MissingFileError(f"no such tokenizer folder: {path} (pass a folder saved by save_pretrained, or a vocab.txt)")
    if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError, KeyError) as err:
            raise ScratchBertError(
                f"could not load the tokenizer in {path} ({str(err).splitlines()[0]}); save it again with "
                "tokenizer.save_pretrained, or pass another folder (e.g. one written by `scratchbert train-tokenizer`)."
            ) from None
    if (path / "vocab.txt").is_file():
        return load_tokenizer(path / "vocab.txt", max_length)
    raise MissingFileError(
        f"{path} has no tokenizer (no tokenizer.json, tokenizer_config.json or vocab.txt): "
        "save it next to the model with tokenizer.save_pretrained(folder)."
    )
