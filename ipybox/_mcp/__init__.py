"""The MCP client side: server parameters, sessions, OAuth, and what servers ask during a call."""
