"""Where tests find the checkout, and free loopback ports: one copy each."""

import os
import socket

#: The checkout's root (README.md, conf/, docs/ live there).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port(kind=socket.SOCK_STREAM):
    """A port on 127.0.0.1 that was free a moment ago (TCP by default)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
