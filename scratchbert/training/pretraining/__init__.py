"""Pretraining BERT: its options, its data, the loop, its checkpoints and processes."""
