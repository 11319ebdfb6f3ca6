"""The parts of ``bench/loop_vs_commits.py``: the loop under test (``loop``), the raw baseline
(``raw``), the stores both run on (``backends``), the measurements (``measure``) and the report
(``report``). A bench-local package: it imports Keelgate as installed, never the tests.
"""
