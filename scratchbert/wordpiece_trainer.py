"""Learning a WordPiece vocabulary, deterministically: the algorithm written out in Python.

BERT's vocabulary is learned the way the `tokenizers` library's `WordPieceTrainer` learns it,
which is byte-pair encoding (Sennrich et al. 2016) with a continuing-subword prefix:

    1. count words      normalize every text and split it into words with the same
                        normalizer and pre-tokenizer the finished tokenizer uses;
    2. alphabet         every character of those words is a token, and so is its
                        `##`-prefixed form when it occurs inside a word ("##g" in "dog");
                        `limit_alphabet` keeps only the most frequent characters;
    3. split words      each word starts as its characters: "dog" -> d ##o ##g;
    4. merge            count every adjacent pair of pieces (weighted by how often the
                        word occurs), merge the most frequent pair everywhere into one
                        new token (d + ##o -> do, ##o + ##g -> ##og), repeat until the
                        vocabulary holds `vocab_size` tokens or no pair is seen
                        `min_frequency` times.

The special tokens come first, so [PAD] is id 0. Rare words are not dropped: like
`tokenizers`, `min_frequency` applies to pairs, so a pair seen fewer times is never merged.

Why not just call `tokenizers.trainers.WordPieceTrainer`? It is not reproducible: the ids of
the `##` pieces follow the iteration order of a Rust HashMap, and ties between equally
frequent pairs are broken by those ids, so the same corpus gives a different vocabulary in
every process and every call (huggingface/tokenizers#1794). Here every id is canonical:
special tokens in the order given, characters by code point, their `##` forms by code
point, then merged tokens in the order learned. Ties are broken as `tokenizers` breaks them,
by those ids: among equally frequent pairs the one with the smaller left id wins, then the
smaller right id, which favours pairs of older pieces (characters, then the earliest
merges). Breaking ties by the pairs' strings instead would favour `##` pieces and digits,
which sort before letters, and drift away from `tokenizers`' vocabularies. The same corpus
and options give the same vocabulary, byte for byte, in any process, and it differs from a
`tokenizers` one about as much as two `tokenizers` runs differ from each other.

Two deliberate differences from `tokenizers`, both about rare cases:
* a character left out by `limit_alphabet` splits its word there (no pair spans it);
  `tokenizers` drops the character and lets its neighbours merge as if it were not there,
  learning pieces of text that never occurs;
* a pair is merged in every word that holds it at once; `tokenizers` can merge a pair in
  two installments when the pair gained words after it was queued.

Counting words is most of the time on a large corpus, so each text is normalized (in Rust)
and cut at spaces by Python's `str.split`, and the pre-tokenizer then runs once per distinct
space-separated chunk ("movie," occurs thousands of times, is split once). That needs a
pre-tokenizer that splits at spaces and drops them, as BERT's does; `count_words` checks.

Merging is incremental, so training takes time proportional to the pieces that change,
not to the corpus times the number of merges: the trainer keeps
    pair_counts   (left id, right id) -> how many times the pair occurs in the corpus,
    where         (left id, right id) -> indices of the distinct words that may hold it,
    heap          (-count, left id, right id) entries, the smallest being the pair to
                  merge next, one pushed whenever a pair's count changes; an entry whose
                  count is no longer the pair's count is stale and skipped when popped
                  ("lazy deletion"), so counts never have to be updated inside the heap.

`segmentation_stats` judges a trained vocabulary: tokens per word on held-out text.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from tqdm.auto import tqdm

from scratchbert.errors import ScratchBertError

__all__ = ["count_words", "segmentation_stats", "train_wordpiece_vocab"]


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
