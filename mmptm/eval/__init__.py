"""Evaluation of pre-trained checkpoints (retrieval; later VQA, XNLI)."""
