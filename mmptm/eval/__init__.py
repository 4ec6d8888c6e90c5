"""Evaluation of trained runs: retrieval, classification (XNLI), VQA, cross-lingual retrieval."""
