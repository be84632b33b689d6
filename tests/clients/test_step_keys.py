"""What `irrev.langgraph.step_key_of` gives a node in LangGraph's own runs (in
memory, no gateway): the keys docs/clients.md promises. A re-run of a step (crash,
resumers) is one key: tests/clients/test_langgraph.py measures those with processes."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from irrev.langgraph import step_key_of


class Run(TypedDict, total=False):
    n: int
    keys: Annotated[list[str], operator.add]


def pay(state: Run) -> dict[str, Any]:
    return {"keys": [step_key_of()]}


def pay_attempt(state: Run) -> dict[str, Any]:
    """Keyed by the state's `n` too: the program's attempt counter."""
    return {"keys": [step_key_of(state["n"])]}


def paying_graph(node: Any = pay) -> Any:
    graph: StateGraph[Run] = StateGraph(Run)
    graph.add_node("prepare", lambda state: {"n": 1})
    graph.add_node("pay", node)
    graph.add_edge(START, "prepare")
    graph.add_edge("prepare", "pay")
    graph.add_edge("pay", END)
    return graph.compile(checkpointer=InMemorySaver())


def test_time_travel_runs_the_step_again_under_a_new_key_and_forks_of_one_checkpoint_share_one() -> (
    None
):
    """Replaying or forking from the checkpoint before `pay` runs it at a later step:
    a new key, a new effect (what re-running on purpose means). Two forks of one
    checkpoint run it at the same step: one key, unless a part of the caller's tells
    them apart."""
    graph, config = paying_graph(), {"configurable": {"thread_id": "t-travel"}}
    first = graph.invoke({}, config)["keys"]
    before = next(s for s in graph.get_state_history(config) if s.next == ("pay",))
    replayed = graph.invoke(None, before.config)["keys"]
    forks = [
        graph.invoke(None, graph.update_state(before.config, {"n": n}))["keys"] for n in (5, 6)
    ]
    assert replayed[-1] != first[0]
    assert forks[0][-1] == forks[1][-1] == replayed[-1]


def test_an_attempt_part_tells_forks_of_one_checkpoint_apart() -> None:
    graph, config = paying_graph(pay_attempt), {"configurable": {"thread_id": "t-attempt"}}
    graph.invoke({}, config)
    before = next(s for s in graph.get_state_history(config) if s.next == ("pay",))
    keys = [
        graph.invoke(None, graph.update_state(before.config, {"n": n}))["keys"][-1]
        for n in (2, 3, 3)
    ]
    assert keys[0] != keys[1] == keys[2]


def test_each_task_send_makes_of_one_node_in_one_step_has_its_own_key() -> None:
    graph: StateGraph[Run] = StateGraph(Run)
    graph.add_node("pay", pay)
    graph.add_conditional_edges(START, lambda state: [Send("pay", {"n": i}) for i in range(3)])
    graph.add_edge("pay", END)
    keys = graph.compile().invoke({}, {"configurable": {"thread_id": "t-send"}})["keys"]
    assert len(set(keys)) == 3


def test_a_subgraphs_node_is_keyed_by_its_path_not_its_name_alone() -> None:
    inner: StateGraph[Run] = StateGraph(Run)
    inner.add_node("pay", pay)
    inner.add_edge(START, "pay")
    inner.add_edge("pay", END)
    outer: StateGraph[Run] = StateGraph(Run)
    outer.add_node("checkout", inner.compile())
    outer.add_edge(START, "checkout")
    outer.add_edge("checkout", END)
    config: RunnableConfig = {"configurable": {"thread_id": "t-sub"}}
    nested = outer.compile().invoke({}, config)["keys"]
    flat: StateGraph[Run] = StateGraph(Run)
    flat.add_node("pay", pay)
    flat.add_edge(START, "pay")
    flat.add_edge("pay", END)
    assert nested != flat.compile().invoke({}, config)["keys"]


def test_outside_a_node_there_is_no_step_to_key() -> None:
    with pytest.raises((ValueError, RuntimeError)):
        step_key_of()
    with pytest.raises(ValueError, match="thread_id"):
        step_key_of(config={"configurable": {}, "metadata": {"langgraph_step": 1}})
