"""TCP keepalive on accepted client connections: the kernel finds out a
client host that vanished.

A client whose host died, lost power or left the network while nothing
was being sent to it leaves its connection open on the router for ever:
no read ever fails, and its session keeps its subscriptions and one of
the ``max-connections`` slots. Elvin has no router-initiated liveness
check that every client answers (section 7.4.13 lets either side send
TestConn, but the Avis router never does and clients are not held to
answering one), so the check is the kernel's, which needs nothing from
the client: after ``idle`` seconds with nothing sent either way, probes
a quarter of that apart (at least 1 s), three unanswered and the
connection is reset, ending the session as any lost client's.
"""

import socket

from elvin.protocols.output import tcp_transport

__all__ = ["MAX_KEEPALIVE", "PROBES", "keepalive_socket", "set_keepalive"]

#: Unanswered probes before the kernel gives up on the peer.
PROBES = 3
#: The longest idle time Linux takes (TCP_KEEPIDLE); a longer one is
#: refused by the socket, which would keep the system's 2 hours.
MAX_KEEPALIVE = 32767


def keepalive_socket(transport):
    """The TCP socket under ``transport`` (a TLS layer's included), or None."""
    connection = tcp_transport(transport)
    return None if connection is None else connection.getHandle()


def set_keepalive(transport, idle):
    """Turn on keepalive with ``idle`` seconds before the first probe (0:
    leave it off); True if the socket took it."""
    if not idle:
        return False
    sock = keepalive_socket(transport)
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    idle_s = max(1, int(round(idle)))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", idle_s), ("TCP_KEEPINTVL", max(1, idle_s // 4)),
                            ("TCP_KEEPCNT", PROBES)):
            option = getattr(socket, name, None)
            if option is not None:          # Linux; others keep the system's timing
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
    except OSError:
        return False
    return True
