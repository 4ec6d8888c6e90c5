"""Converters: the data sets people have (COCO, VQA, XNLI, parallel text, MSR-VTT, audio
corpora, knowledge graphs, span annotations) written as webdataset shards; one module per family."""
