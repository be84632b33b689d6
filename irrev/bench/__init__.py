"""`irrev bench ledger|gateway|cli`: throughput, latency and start-up measurements."""
