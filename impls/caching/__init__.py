"""Designs with prefix caching (the contract's optional part): A, B and C each with a content-hash cache."""
