"""Stage 1: the corpus, the WordPiece tokenizer and preprocessing into .bin/.idx."""
