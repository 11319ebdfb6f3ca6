"""Helpers for testing code built on Keelgate, shipped with it so other packages can use them.

``keelgate.testing.store_contract`` is the store contract suite: the checks every store backend
must pass, runnable against a third-party store. Nothing here may import pytest or a store
backend: a third party's test file imports only what it uses.
"""
