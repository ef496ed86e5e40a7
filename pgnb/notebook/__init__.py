"""The notebook face: magics, the status view, %pg_show's HTML.

The only place that imports IPython's magics or ipywidgets.
"""
