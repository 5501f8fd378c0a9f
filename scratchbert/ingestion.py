"""Where text comes from: the one place that turns what a user names into data.

Every command that reads data (`train-tokenizer`, `pretrain`, `finetune`) names it the
same ways, and this module resolves each of them the same way:

    a file              corpus.txt, reviews.jsonl, train.csv, data.parquet (each also .gz, .bz2, .xz)
    a glob              'corpus/*.txt', 'shards/**/*.jsonl.gz' (quoted or expanded by the shell)
    a saved dataset     a folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`
    a dataset in memory a `datasets.Dataset`, `IterableDataset` or `DatasetDict`
    a hub name          'wikitext' or 'owner/name' (needs network access or the local cache)
    the embedded corpus `default_corpus_documents()`: CPython's own documentation, no download

Plain-text files are read by this module line by line (they may exceed memory), with a
clear error naming the line that is not valid text; table files (JSON lines, CSV, TSV,
Parquet) go through the matching `datasets` builder. `streaming=True` returns an
`IterableDataset` that reads lazily instead of an Arrow-cached `Dataset`.

The functions, from what the user typed to data:

    expand_files(patterns)           paths and globs -> existing files, in a stable order
    open_text(path)                  one UTF-8 reader for plain and compressed text files
    text_batches(texts)              files or strings -> batches of strings (tokenizer training)
    load_documents(source)           any source above -> Dataset["text"], one row per document
    load_table(files)                table files -> Dataset with their columns (fine-tuning data)
    load_named_dataset(name)         a hub or local `datasets` name -> DatasetDict
"""

from __future__ import annotations

import bz2
import codecs
import glob
import gzip
import lzma
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from scratchbert.errors import MissingFileError, ScratchBertError
from scratchbert.weights import quiet_hub_retries

# A compression suffix is looked through to find the format: reviews.jsonl.gz is JSON lines.
COMPRESSIONS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
# Table files -> the `datasets` builder that reads them.
TABLE_FORMATS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
# Tagged words, CoNLL-style (a word and its tag per line, a blank line between sentences) -> columns tokens and tags.
TABLE_FORMATS.update(dict.fromkeys((".conll", ".iob", ".bio"), "conll"))
BATCH_SIZE = 1000  # strings per batch handed to a tokenizer trainer


class DataError(ScratchBertError):
    """Data that cannot be used as given: undecodable text, a missing column, no rows at all."""


# ---------------------------------------------------------------------------
# 1. Names -> files
# ---------------------------------------------------------------------------


def expand_files(patterns: str | os.PathLike | Sequence[str | os.PathLike], what: str = "text file") -> list[str]:
    """Paths and globs -> the files they name, each glob's matches sorted, in the order given.

    Globs are expanded here, so a pattern quoted on the command line ('corpus/*.txt') works
    as well as one the shell expanded; `**` matches folders recursively.

    Raises FileNotFoundError for a path that does not exist or a glob that matches no
    file, and for a folder (with the glob to pass instead).
    """
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    files: list[str] = []
    for item in patterns:
        pattern = os.fspath(item)
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matches:
                raise MissingFileError(f"no {what} matches the glob {pattern!r}")
            files.extend(matches)
        elif os.path.isfile(pattern):
            files.append(pattern)
        elif os.path.isdir(pattern):
            raise MissingFileError(
                f"{pattern!r} is a folder, not a {what} (nor a saved `datasets` dataset); pass its files with a glob, "
                f"e.g. {os.path.join(pattern, '*.txt')!r}"
            )
        else:
            raise MissingFileError(f"no such {what}: {pattern}")
    return files


def format_of(path: str | os.PathLike) -> str:
    """'text' for plain-text files, else the `datasets` builder of a table file (through a compression suffix)."""
    suffixes = [s.lower() for s in Path(path).suffixes if s.lower() not in COMPRESSIONS]
    if suffixes and suffixes[-1] in TABLE_FORMATS:
        return TABLE_FORMATS[suffixes[-1]]
    return "text"


def looks_like_hub_name(name: str) -> bool:
    """'wikitext' or 'owner/name'; anything with a file suffix or a path prefix is meant as a path."""
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", name) is not None and Path(name).suffix == ""


def is_saved_dataset(path: str | os.PathLike) -> bool:
    path = Path(path)
    return path.is_dir() and any((path / name).is_file() for name in ("dataset_info.json", "state.json", "dataset_dict.json"))


# ---------------------------------------------------------------------------
# 2. Plain-text files
# ---------------------------------------------------------------------------


def open_text(path: str | os.PathLike, encoding: str = "utf-8"):
    """Open a text file for reading, decompressing .gz / .bz2 / .xz by its suffix."""
    opener = COMPRESSIONS.get(Path(path).suffix.lower(), open)
    return opener(path, "rt", encoding=encoding)


def _undecodable(path: str | os.PathLike, encoding: str, err: UnicodeDecodeError) -> DataError:
    """The error for a file that is not valid `encoding` text, naming the first bad line."""
    decoder = codecs.getincrementaldecoder(encoding)()
    opener = COMPRESSIONS.get(Path(path).suffix.lower(), open)
    number = 0
    with opener(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                decoder.decode(raw)
            except UnicodeDecodeError:
                break
    return DataError(
        f"{path} is not valid {encoding} text ({err.reason} on line {number}). Convert it to {encoding}, e.g. "
        f"`iconv -f latin1 -t {encoding} {Path(path).name} > {Path(path).stem}.{encoding}.txt` for a Latin-1 file."
    )


# What the decompressors raise for a file cut short (EOFError) or one that is not what its suffix
# says (gzip.BadGzipFile and bz2's "Invalid data stream" are OSErrors; lzma has its own).
DAMAGED_COMPRESSION = (EOFError, OSError, lzma.LZMAError)


def _damaged(path: str | os.PathLike, err: Exception) -> DataError:
    """The error for a compressed file that is cut short or not compressed the way its suffix says."""
    suffix = Path(path).suffix.lower()
    what = "ends before its compressed stream does (cut short: a partial download or copy?)" if isinstance(err, EOFError) else f"is not a valid {suffix} file ({err})"
    return DataError(f"{path} {what}. Download or copy it again, or name it without {suffix} if it is plain text.")


def _reading(path: str | os.PathLike, encoding: str, err: Exception) -> Exception:
    """A user's error for `err` raised while reading `path`, or `err` itself when it is not one."""
    if isinstance(err, UnicodeDecodeError):
        return _undecodable(path, encoding, err)
    if Path(path).suffix.lower() in COMPRESSIONS and isinstance(err, DAMAGED_COMPRESSION):
        return _damaged(path, err)
    return err


def read_lines(paths: Sequence[str | os.PathLike], encoding: str = "utf-8") -> Iterator[str]:
    """Every line of every file (compressed files too), one file after the other."""
    for path in paths:
        try:
            with open_text(path, encoding) as handle:
                yield from handle
        except (UnicodeDecodeError, *DAMAGED_COMPRESSION) as err:
            raise _reading(path, encoding, err) from None


def read_documents(files: Sequence[str], one_document_per_file: bool = False, encoding: str = "utf-8") -> Iterator[dict[str, str]]:
    """Yield {"text": document} from text files: documents are separated by blank lines, or are whole files."""
    for path in files:
        try:
            with open_text(path, encoding) as handle:
                if one_document_per_file:
                    document = handle.read().strip()
                    if document:
                        yield {"text": document}
                    continue
                lines: list[str] = []
                for line in handle:
                    if line.strip():
                        lines.append(line.rstrip("\n"))
                    elif lines:
                        yield {"text": "\n".join(lines)}
                        lines = []
                if lines:
                    yield {"text": "\n".join(lines)}
        except (UnicodeDecodeError, *DAMAGED_COMPRESSION) as err:
            raise _reading(path, encoding, err) from None


def _is_path_list(texts) -> bool:
    """True when `texts` names files: a path, or a list of paths/strings that all name files."""
    if isinstance(texts, (str, os.PathLike)):
        return True
    if not isinstance(texts, (list, tuple)) or not texts:
        return False
    if all(isinstance(item, os.PathLike) for item in texts):
        return True
    # A list of strings is text, unless every one of them names an existing file.
    return all(isinstance(item, str) and "\n" not in item and os.path.isfile(item) for item in texts)


def text_batches(texts, batch_size: int = BATCH_SIZE) -> Iterator[list[str]]:
    """Stream `texts` as lists of at most `batch_size` strings.

    `texts` may be one file path or glob, a list of them (files are read line by line), or
    any iterable whose items are strings or lists of strings (e.g. a `datasets` column, or
    `batch["text"]` for each batch of `Dataset.iter(batch_size=...)`). Nothing is held in
    memory beyond one batch.
    """
    if isinstance(texts, str) and glob.has_magic(texts) or _is_path_list(texts):
        items: Iterable = read_lines(expand_files(texts))  # every file is checked before any is read
    elif isinstance(texts, (str, bytes)) or not isinstance(texts, Iterable):
        raise DataError(f"texts must be file paths or an iterable of strings, not {type(texts).__name__}.")
    else:
        items = texts
    batch: list[str] = []
    for item in items:
        for piece in [item] if isinstance(item, str) else item:
            if not isinstance(piece, str):
                raise DataError(f"texts must contain strings; found {type(piece).__name__}: {piece!r:.60}")
            batch.append(piece)
            if len(batch) == batch_size:
                yield batch
                batch = []
    if batch:
        yield batch


# ---------------------------------------------------------------------------
# 3. Documents: any source -> Dataset["text"]
# ---------------------------------------------------------------------------

# reST heading underlines in pydoc's topics ("*****", "=====", "-----"): layout, not text.
_HEADING_UNDERLINE = re.compile(r"([*=\-~^#+\"'])\1{2,}")


def default_corpus_documents() -> list[str]:
    """The embedded corpus: CPython's own documentation, one document per help topic.

    Every CPython install carries the text that `help("assert")` prints, in
    `pydoc_data.topics` (79 topics in CPython 3.11, about 460k characters of English
    with code examples), so this corpus needs no download. Topics are returned in sorted
    order with their reST heading underlines removed; the heading text stays as a
    paragraph of its own.
    """
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise MissingFileError(
            "this Python install lacks pydoc_data (some minimal distributions strip it), which holds the "
            "default corpus; pass your own text files instead (load_documents('corpus/*.txt'))"
        ) from None

    documents = []
    for name in sorted(topics):
        lines = [line for line in topics[name].splitlines() if not _HEADING_UNDERLINE.fullmatch(line.strip())]
        document = "\n".join(lines).strip()
        if document:
            documents.append(document)
    return documents


def load_documents(
    source,
    *,
    text_column: str = "text",
    streaming: bool = False,
    split: str = "train",
    one_document_per_file: bool = False,
    encoding: str = "utf-8",
    config_name: str | None = None,
    cache_dir: str | os.PathLike | None = None,
):
    """Load a corpus as a `datasets` dataset with a single "text" column, one row per document.

    Args:
        source: any source of the module docstring, or a list of files and globs. Plain-text
            files hold documents separated by blank lines (or one per file with
            `one_document_per_file=True`); table files (.jsonl, .csv, .parquet, ...) one per
            row, in `text_column`.
        text_column: the column holding the documents (renamed to "text"; others are dropped).
        streaming: return an `IterableDataset` that reads lazily, for corpora larger than
            memory or disk. Otherwise a `Dataset` (files are converted once into an Arrow
            cache, so tokenization maps over it are cached too).
        split: the split to take from a `DatasetDict`, a saved dataset dict or a hub dataset.
        one_document_per_file: for text files, treat each whole file as one document.
        encoding: text encoding of plain-text files; anything not decodable is an error, never skipped.
        config_name: the configuration of a hub dataset that has several.
        cache_dir: where `datasets` keeps its Arrow cache (its default cache otherwise).

    Raises:
        FileNotFoundError: a path or glob matches no file, or a hub dataset cannot be loaded.
        DataError (a ValueError): a file is not valid text in `encoding`; the column is missing
            or not text; the corpus holds no documents.
    """
    import datasets

    if isinstance(source, (datasets.Dataset, datasets.IterableDataset, datasets.DatasetDict, datasets.IterableDatasetDict)):
        return _text_column(_pick_split(source, split, repr(type(source).__name__)), text_column, streaming)
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not sources:
        raise DataError("load_documents got an empty list of sources; pass a file, a glob or a dataset name")
    only = os.fspath(sources[0])
    if len(sources) == 1 and is_saved_dataset(only):
        return _text_column(_pick_split(datasets.load_from_disk(only), split, only), text_column, streaming)
    if len(sources) == 1 and not os.path.exists(only) and not glob.has_magic(only) and looks_like_hub_name(only):
        return _text_column(_load_hub(only, config_name, split, streaming, cache_dir), text_column, streaming)
    files = expand_files(sources, "corpus file")
    formats = {format_of(path) for path in files}
    if formats == {"text"}:
        return _load_text_files(files, one_document_per_file, encoding, streaming, cache_dir)
    return _text_column(load_table(files, "the corpus", streaming=streaming, cache_dir=cache_dir), text_column, streaming)


def _load_text_files(files: list[str], one_document_per_file: bool, encoding: str, streaming: bool, cache_dir):
    import datasets
    from datasets.exceptions import DatasetGenerationError
    from datasets.fingerprint import Hasher

    gen_kwargs = {"files": files, "one_document_per_file": one_document_per_file, "encoding": encoding}
    # Reading up to the first document is cheap and turns an empty corpus into a clear error.
    if next(read_documents(**gen_kwargs), None) is None:
        raise DataError(f"no documents in {_describe(files)}: the files are empty or hold only whitespace")
    if streaming:
        return datasets.IterableDataset.from_generator(read_documents, gen_kwargs=gen_kwargs)
    # Size and modification time go into the cache key, so an edited file is read again.
    signature = [(os.path.abspath(path), os.path.getsize(path), os.path.getmtime(path)) for path in files]
    try:
        return datasets.Dataset.from_generator(
            read_documents,
            gen_kwargs=gen_kwargs,
            features=datasets.Features({"text": datasets.Value("string")}),
            cache_dir=cache_dir,
            fingerprint=Hasher.hash([signature, one_document_per_file, encoding]),
        )
    except DatasetGenerationError as err:
        if isinstance(err.__cause__, ScratchBertError):
            raise err.__cause__ from None  # our own message, not the generic wrapper
        if isinstance(err.__cause__, OSError):
            raise DataError(f"could not read {_describe(files)}: {err.__cause__}") from None
        raise


def _describe(files: Sequence[str]) -> str:
    return files[0] if len(files) == 1 else f"{len(files)} files ({files[0]}, ...)"


def _pick_split(dataset, split: str, what: str):
    import datasets

    if isinstance(dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        if split not in dataset:
            raise DataError(f"{what} has no split {split!r}; choose one of {sorted(dataset)} with split=... (--split)")
        return dataset[split]
    return dataset


def _text_column(dataset, text_column: str, streaming: bool):
    """Keep only `text_column`, named "text"; check that it holds text and that there is some."""
    import datasets

    columns = dataset.column_names
    if columns is not None and text_column not in columns:
        raise DataError(f"the dataset has no column {text_column!r}; its columns are {columns}; pass text_column=... (--text-column)")
    feature = (dataset.features or {}).get(text_column)
    if feature is not None and getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise DataError(f"column {text_column!r} holds {feature}, not text; pass the column of documents (--text-column)")
    dataset = dataset.select_columns([text_column])
    if text_column != "text":
        dataset = dataset.rename_column(text_column, "text")
    if streaming and isinstance(dataset, datasets.Dataset):
        return dataset.to_iterable_dataset()
    if isinstance(dataset, datasets.Dataset) and len(dataset) == 0:
        raise DataError("the dataset holds no documents")
    return dataset


# ---------------------------------------------------------------------------
# 4. Tables and named datasets
# ---------------------------------------------------------------------------


def load_table(files: Sequence[str | os.PathLike], what: str = "the data", streaming: bool = False, cache_dir=None):
    """Read table files (all of one format: CSV, TSV, JSON / JSON lines, Parquet) into one `Dataset`.

    `what` names the data in errors ("the train data"). Globs are expanded.
    """
    import datasets

    paths = expand_files(files, what="data file")
    formats = {format_of(path) for path in paths}
    if "text" in formats:
        plain = next(p for p in paths if format_of(p) == "text")
        raise DataError(f"{plain}: not a table file; {what} must be .csv, .tsv, .json, .jsonl, .parquet or CoNLL's .conll (optionally .gz).")
    if len(formats) > 1:
        raise DataError(f"{what} mixes formats ({', '.join(sorted(formats))}); give files of one kind.")
    builder = formats.pop()
    if builder == "conll":
        tagged = read_conll(paths, what)
        return tagged.to_iterable_dataset() if streaming else tagged
    options = {"delimiter": "\t"} if all(".tsv" in (s.lower() for s in Path(p).suffixes) for p in paths) else {}
    try:
        return datasets.load_dataset(builder, data_files=paths, split="train", streaming=streaming, cache_dir=cache_dir, **options)
    except (datasets.exceptions.DatasetGenerationError, *DAMAGED_COMPRESSION) as err:
        # A compressed file cut short fails inside the builder (wrapped, or not, by `datasets`).
        damaged = _first_damaged(paths)
        if damaged is not None:
            raise damaged from None
        if not isinstance(err, datasets.exceptions.DatasetGenerationError):
            raise
        # e.g. a JSON column holding strings in some rows and numbers in others
        raise DataError(f"could not read {what} from {_describe(paths)}: {err.__cause__ or err}") from None
    except ValueError as err:
        if "corresponds to no data" in str(err):  # how `datasets` reports files without a single row
            raise DataError(f"{what} is empty: {_describe(paths)} holds no rows.") from None
        raise
    except StopIteration:  # how its JSON builder reports them, inferring the columns from a first table that is not there
        raise DataError(f"{what} is empty: {_describe(paths)} holds no rows.") from None


def read_conll(paths: Sequence[str], what: str = "the data"):
    """CoNLL-style files as a `Dataset` of sentences, columns "tokens" and "tags" (the `conll2003` dataset's).

    Each line is a word, any further columns, and its tag last ("EU NNP B-NP B-ORG": word "EU", tag "B-ORG");
    a blank line ends a sentence; -DOCSTART- lines are skipped. A line with one column fails, naming it.
    """
    from datasets import Dataset

    sentences = {"tokens": [], "tags": []}
    words, tags = [], []
    for path in paths:
        for number, line in enumerate(read_lines([path]), start=1):
            fields = line.split()
            if fields and fields[0] == "-DOCSTART-":
                continue
            if fields and len(fields) < 2:
                raise DataError(f"line {number} of {path} is {line.strip()!r}: a CoNLL line is a word and its tag, separated by a space or a tab.")
            if fields:
                words.append(fields[0])
                tags.append(fields[-1])
            elif words:
                sentences["tokens"].append(words)
                sentences["tags"].append(tags)
                words, tags = [], []
        if words:  # a file's last sentence needs no blank line after it
            sentences["tokens"].append(words)
            sentences["tags"].append(tags)
            words, tags = [], []
    if not sentences["tokens"]:
        raise DataError(f"{what} is empty: {_describe(paths)} holds no tagged words.")
    return Dataset.from_dict(sentences)


def _first_damaged(paths: Sequence[str]) -> DataError | None:
    """The error for the first compressed file in `paths` that does not decompress to its end, if any.

    Only called once a read has failed, so reading the files through costs nothing on a good run.
    """
    for path in paths:
        opener = COMPRESSIONS.get(Path(path).suffix.lower())
        if opener is None:
            continue
        try:
            with opener(path, "rb") as handle:
                while handle.read(1 << 20):
                    pass
        except DAMAGED_COMPRESSION as err:
            return _damaged(path, err)
    return None


def _load_hub(name: str, config_name: str | None, split: str | None, streaming: bool, cache_dir=None):
    import datasets

    try:
        with quiet_hub_retries():
            return datasets.load_dataset(name, config_name, split=split, streaming=streaming, cache_dir=cache_dir)
    except Exception as err:  # offline, unknown name, missing config: all reach the user as one message
        first_line = str(err).splitlines()[0] if str(err) else ""
        raise MissingFileError(
            f"{name!r} is not an existing file, glob or saved dataset folder, and loading it as a `datasets` name "
            f"failed ({type(err).__name__}: {first_line}); without network access, pass local files"
        ) from None


def load_named_dataset(name: str, config_name: str | None = None):
    """A dataset by name (a saved folder, a local dataset script/folder, or the hub) as a `DatasetDict`."""
    import datasets

    loaded = datasets.load_from_disk(name) if is_saved_dataset(name) else _load_hub(name, config_name, None, False)
    if not isinstance(loaded, datasets.DatasetDict):
        loaded = datasets.DatasetDict({"train": loaded})
    return loaded


__all__ = [
    "COMPRESSIONS",
    "TABLE_FORMATS",
    "DataError",
    "default_corpus_documents",
    "expand_files",
    "format_of",
    "load_documents",
    "load_named_dataset",
    "load_table",
    "read_conll",
    "open_text",
    "read_documents",
    "read_lines",
    "text_batches",
]
