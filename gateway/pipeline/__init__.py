"""The admission pipeline, the same for every transport: prepare an effect, reserve its
price in the ledger, deliver it through an `Upstream`, settle it, and approve or reject
what escalated. Its outcome is protocol-neutral; routes render it."""
