"""The kernel side without IPython.

A world's lifecycle at the bottom, cells, tracing and showing on it, Sandbox on top.
"""
