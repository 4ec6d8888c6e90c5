"""Knowledge graphs on disk: triples, entity vocabularies, aliases, descriptions, embeddings."""
