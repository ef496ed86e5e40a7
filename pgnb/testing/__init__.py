"""Distributed tests on warm pgnb ranks: the pytest plugin and the world pool it runs on.

``pgnb.testing.plugin`` is the pytest plugin (registered as ``pgnb`` through the
``pytest11`` entry point, inert unless a test asks for a world);
``pgnb.testing.worlds`` keeps one warm ``pgnb.Sandbox`` per configuration.
docs/testing_distributed_code.md says how to use them.
"""
