"""The article's designs A (``dict``), B (``list``) and C (``flat``), and the compiled twins of A and B."""
