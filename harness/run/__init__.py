"""The run: what is measured (matrix), in which worker processes, and figures assembled from them."""
