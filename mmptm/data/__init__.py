"""Data: shard lists and tar reading, skip-and-count, decoding, mixing, packing, the loader."""
