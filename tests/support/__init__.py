"""Helpers shared by Keelgate's tests, benchmarks and `make up`: real servers and real stores.

Nothing here is a mock: ``pgserver`` starts a real PostgreSQL server from the machine's programs,
``stores`` opens the real store backends over real files and databases.
"""
