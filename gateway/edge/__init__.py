"""The HTTP edge: who is calling (one bearer parser), one bound on every request body
and one reader of it, canonical forwarding, the request's wire records, problem+json
refusals and the words a model reads of them (advice), the HTTP rendering of a
decision, logs, metrics and tracing. Nothing here decides an effect. It reads the
pipeline's records through protocols of its own (responses.Decided, auth.Door), so it
imports no pipeline module but the Answer it renders, and no state but the refusal
counts."""
