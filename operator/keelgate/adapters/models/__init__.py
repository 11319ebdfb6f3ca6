"""Model providers: each turns a ModelRequest into a ModelReply in its own wire format."""
