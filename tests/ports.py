"""A port for a server a test starts, which no other process takes before the server binds it.

Binding port 0, closing the socket and handing its number to a server leaves a gap of seconds (the
server's imports) in which any process's bind(0) or connect() may take that port: Linux draws both
from the ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by default), and under
pytest-xdist the other worker's servers, process groups and clients draw from it all the time. The
ports here lie below that range, in a block that belongs to this worker alone (gw0: 20000-20999,
gw1: 21000-21999, ...), so only this worker's tests pick from it, one at a time; a probe bind skips
a port something else already holds.

    port = server_port()     # then start the server with --port port
"""

import os
import random
import socket

BASE = 20000  # below the ephemeral range
BLOCK = 1000  # ports a worker: 12 workers below 32768


def server_port():
    """A free port of this worker's block, in random order (a port a killed server of this worker
    left in TIME_WAIT is skipped by the probe)."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    start = BASE + BLOCK * (worker % 12)
    for port in random.sample(range(start, start + BLOCK), BLOCK):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {start}-{start + BLOCK - 1}")
