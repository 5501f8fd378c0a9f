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

import os
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Encoding, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from transformers.tokenization_utils_base import BatchEncoding, PaddingStrategy, TruncationStrategy

from scratchbert.configuration_scratchbert import ScratchBertConfig
from scratchbert.errors import MissingFileError, ScratchBertError
from scratchbert.ingestion import read_lines, text_batches
from scratchbert.weights import hub_snapshot, is_hub_name
from scratchbert.wordpiece_trainer import train_wordpiece_vocab

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
        deterministic: True: scratchbert's trainer (`wordpiece_trainer`), the same
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
# The algorithm, written out
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
