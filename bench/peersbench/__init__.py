"""The parts of ``bench/peers.py``: the same loop iteration (a zero-latency plan, one WRITE, an
accepting verify) through Keelgate (``keelgate_peer``), DBOS Transact (``dbos_peer``) and
LangGraph (``langgraph_peer``) on the same SQLite disk and PostgreSQL server (``places``), counted
(``counting``), timed and sized (``measure``), killed mid-WRITE (``crash``) and reported
(``report``). A bench-local package: it imports Keelgate as installed and the peers from the
``bench`` extra, and never the tests; Keelgate itself never imports it.
"""
