"""The kernel side without IPython: a world's lifecycle at the bottom, cells, tracing and showing on it, Sandbox on top."""
