"""What a gateway process keeps and syncs beside the requests: tenants' policies and
their changes, upstream clients (HTTP, MCP, stdio MCP) and credentials, managed keys,
the sweeper, webhooks and the events they carry, reconciliation, the fleet watcher and
the refusal counts."""
