"""Helpers shared by Keelgate's tests: real stores, real servers.

Nothing here is a mock: ``stores`` opens the real store backends over real files and databases
(the PostgreSQL server is ``keelgate.testing.pgserver``'s, started from the machine's programs).
"""
