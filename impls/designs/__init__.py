"""The article's designs A (``dict``), B (``list``), C (``flat``), ``flat-rows``, and compiled twins of A and B."""
