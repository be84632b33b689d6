"""irrev for LangGraph (`pip install 'irrev[langgraph]'`): the Idempotency-Key of a
node's effect when the node is no model's tool call (a payment step of a graph).

LangGraph re-runs a node whose step was not checkpointed: after a crash (the effect
was made, the checkpoint not written), and in every process that resumes one parked
interrupt. What all those re-runs share, and nothing else does, is the thread id,
the node (with the subgraphs above it), the step, and the task's place in the step;
`step_key_of` is `irrev.client.step_key` of exactly these, so the gateway answers a
re-run with the first run's answer instead of making the effect again. LangGraph's
own task id is not stable: it derives from the checkpoint each run writes, so every
resumer has its own (docs/clients.md measures it: k resumers, k payments).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .client import step_key
from .extras import missing_extra

try:
    from langgraph.config import get_config
except ModuleNotFoundError as exc:
    raise missing_extra(__name__, "langgraph", exc) from exc


def step_key_of(*more: str | int, config: Mapping[str, Any] | None = None) -> str:
    """The effect key of the running node (its `config`, or LangGraph's current one):
    thread id, node path, step and the task's path in the step (which tells apart the
    tasks `Send` makes of one node in one step). `more`: parts of your own, e.g.
    `step_key_of(state["attempt"])` with an attempt counter the program raises in the
    state to make the effect again on purpose."""
    config = get_config() if config is None else config
    metadata = config.get("metadata", {})
    thread = config.get("configurable", {}).get("thread_id")
    if thread is None or "langgraph_step" not in metadata:
        raise ValueError("step_key_of needs a LangGraph node's config, with a thread_id")
    return step_key(
        str(thread),
        _node_path(metadata),
        int(metadata["langgraph_step"]),
        json.dumps(metadata.get("langgraph_path", [])),
        *more,
    )


def _node_path(metadata: Mapping[str, Any]) -> str:
    """`outer|inner` of the namespace `outer:<task id>|inner:<task id>`: the nodes,
    without the task ids, which differ from one run of the step to the next."""
    namespace = str(metadata.get("langgraph_checkpoint_ns", ""))
    names = [part.split(":", 1)[0] for part in namespace.split("|") if part]
    return "|".join(names) or str(metadata["langgraph_node"])
