"""Fine-tuning a pretrained scratchbert checkpoint with transformers.Trainer."""
