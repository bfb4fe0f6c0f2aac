"""Federation protocol 1.0 packets (FedConnRqst 192 ... FedNotify 195, Ack 65).

They share the client protocol's XDR encoding; ``FEDERATION`` is a packet
registry holding them together with the client packets a federation link
also uses (Nack, Disconn, DropWarn, TestConn, ConfConn), so a client port
never decodes federation packets and vice versa.
"""

from elvin.protocols import packets
from elvin.protocols.packets import (BOOLEAN, CLIENT, ID32, ID64, KEYS, NAME_VALUES, STRING,
                                     STRINGS, UINT32, WireType, define)
from elvin.protocols.xdr import RawSubAST

__all__ = ["FEDERATION", "FedConnRqst", "FedConnRply", "FedSubReplace",
           "FedNotify", "Ack", "FedMeshAdvert", "decode", "PROTOCOL_MAJOR", "PROTOCOL_MINOR",
           "MAX_PACKET_LENGTH", "LINK_PACKET_IDS", "HANDSHAKE_PACKET_IDS",
           "MAX_HANDSHAKE_LENGTH"]

PROTOCOL_MAJOR = 1
PROTOCOL_MINOR = 0

#: Longest federation packet a router sends or accepts (a longer frame
#: resets the link, so a notification that would need one is not forwarded).
MAX_PACKET_LENGTH = 16 * 1024 * 1024
#: Longest packet accepted before the handshake is done: a FedConnRqst
#: carries a domain name, so anyone who can open the port could otherwise
#: make the router decode 16 MiB (a FedSubReplace of 400,000 terms held
#: it 5 s) before it knew who was asking.
MAX_HANDSHAKE_LENGTH = 64 * 1024

FEDERATION = CLIENT.copy()


def _write_filter(writer, tree):
    if isinstance(tree, RawSubAST):
        writer.raw(tree.data)
    else:
        writer.ast(tree)


#: A pull filter: a Node, or a RawSubAST when its typecodes are read
#: differently by the spec and by Avis (elvin.federation.subast decides).
PULL_FILTER = WireType("SubAST", read=lambda r, what: r.peer_ast(what), write=_write_filter)


@define(192, registry=FEDERATION)
class FedConnRqst:
    xid: ID32
    major_version: UINT32
    minor_version: UINT32
    router_domain: STRING


@define(193, registry=FEDERATION)
class FedConnRply:
    xid: ID32
    router_domain: STRING


@define(194, registry=FEDERATION)
class FedSubReplace:
    xid: ID32
    pull_filter: PULL_FILTER


@define(195, registry=FEDERATION)
class FedNotify:
    attributes: NAME_VALUES
    deliver_insecure: BOOLEAN
    keys: KEYS
    routing: STRINGS


@define(65, registry=FEDERATION)
class Ack:
    xid: ID32


@define(200, registry=FEDERATION)
class FedMeshAdvert:
    """Not EFP 1.0: a mesh router's soft-state advert of its links to other
    mesh routers (elvin.federation.mesh), sent only to peers whose pull
    filter says they are mesh routers, never to a plain EFP peer."""
    origin: STRING
    epoch: ID64
    sequence: ID64
    neighbours: STRINGS


#: pkt_ids a peer may send on a link; any other is refused undecoded.
LINK_PACKET_IDS = frozenset(cls.ID for cls in (
    FedConnRqst, FedConnRply, FedSubReplace, FedNotify, Ack, FedMeshAdvert, packets.Nack,
    packets.Disconn, packets.DropWarn, packets.TestConn, packets.ConfConn))
#: What may come before the link is up: anything else ends it undecoded.
HANDSHAKE_PACKET_IDS = frozenset(cls.ID for cls in (
    FedConnRqst, FedConnRply, packets.Nack, packets.Disconn, packets.TestConn,
    packets.ConfConn))


def decode(data, repeats=None):
    """Decode one federation-link packet (``repeats``: see
    ``elvin.protocols.packets.decode``)."""
    return FEDERATION.decode(data, repeats)


