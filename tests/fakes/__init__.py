"""Real servers on 127.0.0.1 that speak real wire formats: model APIs, a shop, an MCP server."""
