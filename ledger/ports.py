"""Free loopback TCP ports, for the embedded Redis's TCP listener and anything else
that must listen on one."""

from __future__ import annotations

import contextlib
import socket


def free_port() -> int:
    """A loopback TCP port nothing listens on now (the kernel's pick). The project's one
    port finder: the shell's harness and the tests use it too."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports: every probe stays bound until all are
    picked, so none is handed out twice."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            probe = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            probe.bind(("127.0.0.1", 0))
            ports.append(int(probe.getsockname()[1]))
        return ports
