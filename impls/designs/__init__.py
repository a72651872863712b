"""The article's designs A (``dict``), B (``list``) and C (``flat``), ``flat-rows`` (C's table in two levels), and
the compiled twins of A and B."""
