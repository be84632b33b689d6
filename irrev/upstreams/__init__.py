"""Small real tool APIs to put the gateway in front of: the demo supplier (with its
faults and the parser readings), a Stripe-like payments API, and an MCP server."""
