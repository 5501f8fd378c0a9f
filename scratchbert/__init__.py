"""scratchbert: BERT written from scratch, readable line by line, as a Hugging Face model package."""

from scratchbert.configuration_scratchbert import ScratchBertConfig

__version__ = "0.1.0"
__all__ = ["ScratchBertConfig"]
