"""The parts of ``bench/scale.py`` (`make bench-scale`): kwok's fake nodes (``kwok``), the
hollow step executor that runs each step pod's real ``keelgate step`` work (``executor``), the
runs kept in flight (``load``), what is watched and sampled (``watch``, ``sample``), the pure
counting behind every figure (``counting``, unit-tested) and the report with its plot
(``report``). A bench-local package: it imports Keelgate as installed and the local control
plane from ``e2e/``, never the tests.
"""
