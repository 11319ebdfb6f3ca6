"""Tools: each kind (python, http, mcp) is one module implementing the core Tool protocol."""
