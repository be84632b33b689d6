"""The gateway's rooms, read from its import statements (tests/test_layers.py's
reader: every import, also those inside functions): each module lives in one of
edge, pipeline, routes and state, beside the four that put them together, and the
routes (what the app serves) are imported by the app alone, so that what starts,
stops and keeps a worker's state never depends on how a request is answered."""

from __future__ import annotations

from tests.test_layers import imports, modules

ROOMS = ("edge", "pipeline", "routes", "state")
TOP = frozenset({"gateway", "gateway.app", "gateway.serve", "gateway.settings", "gateway.worker"})


def test_every_gateway_module_is_in_a_room() -> None:
    outside = [
        name
        for name, _ in modules("gateway")
        if name not in TOP and name.split(".")[1] not in ROOMS
    ]
    assert outside == []


def routes_importers(edges: dict[str, set[str]]) -> list[str]:
    """Each import of a route module by a gateway module outside the routes but the
    app's."""
    return [
        f"{module} imports {target}"
        for module, targets in sorted(edges.items())
        for target in sorted(targets)
        if target.startswith("gateway.routes")
        and module != "gateway.app"
        and not module.startswith("gateway.routes")
    ]


def test_only_the_app_imports_the_routes() -> None:
    edges = {name: imports(name, path) for name, path in modules("gateway")}
    assert routes_importers(edges) == []


def test_an_import_of_the_routes_is_seen() -> None:
    """The rule itself: a room's import of the routes package or of a route module
    counts; the app's and the routes' own do not."""
    edges = {
        "gateway.state.sweeper": {"gateway.routes.health", "gateway.state.tenants"},
        "gateway.edge.auth": {"gateway.routes"},
        "gateway.app": {"gateway.routes.proxy"},
        "gateway.routes.openapi": {"gateway.routes.console"},
    }
    assert routes_importers(edges) == [
        "gateway.edge.auth imports gateway.routes",
        "gateway.state.sweeper imports gateway.routes.health",
    ]
