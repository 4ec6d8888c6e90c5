"""Data: shard lists and readers, the pipeline and loader, tokenizer, converters, toyworld."""
