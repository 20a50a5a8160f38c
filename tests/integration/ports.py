"""Free TCP ports for the servers a test starts itself (rendezvous stores, Ray nodes).

They come from below the kernel's ephemeral range (32768-60999 here), which is
where every port-0 bind lands: a port the test picked and released cannot then
be handed to another process's port-0 bind (Ray's agents, a trainer's
rendezvous) before the test's server binds it.
"""

from __future__ import annotations

import random
import socket

LOW, HIGH = 20000, 32000


def free_port() -> int:
    for _ in range(200):
        port = random.randrange(LOW, HIGH)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in [{LOW}, {HIGH})")
