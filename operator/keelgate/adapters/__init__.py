"""Adapters between Keelgate and the outside: model providers and tools.

Each provider or tool kind is one module. Adapters translate; they never decide whether a call
may run (the gateway does) and never retry a WRITE.
"""
