"""The HTTP edge: who is calling (one bearer parser), one bound on every request body,
canonical forwarding, the request's wire records, problem+json refusals and the HTTP
rendering of a decision, logs, metrics and tracing. Nothing here decides an effect."""
