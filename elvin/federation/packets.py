"""Federation protocol 1.0 packets (FedConnRqst 192 ... FedNotify 195, Ack 65).

They share the client protocol's XDR encoding; ``FEDERATION`` is a packet
registry holding them together with the client packets a federation link
also uses (Nack, Disconn, DropWarn, TestConn, ConfConn), so a client port
never decodes federation packets and vice versa.
"""

from elvin.protocols.packets import (BOOLEAN, CLIENT, ID32, KEYS, NAME_VALUES, STRING,
                                     STRINGS, SUBAST, UINT32, define)

__all__ = ["FEDERATION", "FedConnRqst", "FedConnRply", "FedSubReplace",
           "FedNotify", "Ack", "decode", "PROTOCOL_MAJOR", "PROTOCOL_MINOR"]

PROTOCOL_MAJOR = 1
PROTOCOL_MINOR = 0

FEDERATION = CLIENT.copy()


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
    pull_filter: SUBAST


@define(195, registry=FEDERATION)
class FedNotify:
    attributes: NAME_VALUES
    deliver_insecure: BOOLEAN
    keys: KEYS
    routing: STRINGS


@define(65, registry=FEDERATION)
class Ack:
    xid: ID32


def decode(data):
    """Decode one federation-link packet."""
    return FEDERATION.decode(data)


