"""The static site (``kvblock-bench site``): runs of several machines and the committed studies, browsable offline."""
