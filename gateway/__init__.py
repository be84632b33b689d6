"""irrev gateway: the trusted proxy, decision API and admin API."""
