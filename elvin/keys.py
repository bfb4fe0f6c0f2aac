"""Security keys for client programs: key pairs from a secret.

Keys decide who may receive what (client protocol section 7.6). A *private*
key is a byte string; its *public* key is its SHA-1 hash. Each helper turns
a secret (``str``, encoded as UTF-8, or ``bytes``) into the pair a program
needs, ``(notification_keys, subscription_keys)``: a producer sends the
first with its notifications (or sets it on its connection), a consumer
subscribes with the second. Every client flavour takes the result as its
``keys=``, ``nfn_keys=``/``sub_keys=`` and ``set_keys(...)`` arguments::

    from elvin import client, keys

    nfn, sub = keys.producer_keys("launch codes")
    producer.notify({"Alert": "red"}, deliver_insecure=False, keys=nfn)
    yield consumer.subscribe("require(Alert)", on_alert, accept_insecure=False, keys=sub)

The scheme ids are those every Elvin router uses: dual 1, producer 2,
consumer 3. ``Keys`` builds any other combination by hand, e.g.
``Keys({SHA1_PRODUCER: [[secret_a, secret_b]]})``.
"""

from __future__ import annotations

import hashlib
from typing import Tuple, Union

from elvin.protocols.packets import Keys

__all__ = ["Keys", "KeyPair", "Secret", "SHA1_DUAL", "SHA1_PRODUCER", "SHA1_CONSUMER",
           "SCHEMES", "public_key", "producer_keys", "consumer_keys", "dual_keys"]

#: The dual scheme: producer keys and consumer keys, both halves must match.
SHA1_DUAL = 1
#: The producer scheme: only the holder of the secret can produce.
SHA1_PRODUCER = 2
#: The consumer scheme: only the holder of the secret can receive.
SHA1_CONSUMER = 3
#: Scheme id -> the name the specification gives it.
SCHEMES = {SHA1_DUAL: "SHA-1-Dual", SHA1_PRODUCER: "SHA-1-Producer",
           SHA1_CONSUMER: "SHA-1-Consumer"}

#: A secret: text (encoded as UTF-8) or bytes.
Secret = Union[str, bytes, bytearray, memoryview]
#: ``(notification_keys, subscription_keys)``.
KeyPair = Tuple[Keys, Keys]


def public_key(private: Secret) -> bytes:
    """The public (SHA-1) key for a private key."""
    return hashlib.sha1(_bytes(private)).digest()


def producer_keys(secret: Secret) -> KeyPair:
    """Keys for the producer scheme: the producer sends the secret, its
    consumers subscribe with its public key, so only the holder of the
    secret can produce what they receive securely."""
    private = _bytes(secret)
    return (Keys({SHA1_PRODUCER: [[private]]}),
            Keys({SHA1_PRODUCER: [[public_key(private)]]}))


def consumer_keys(secret: Secret) -> KeyPair:
    """Keys for the consumer scheme: producers send the public key, the
    consumer subscribes with the secret, so only its holder can receive."""
    private = _bytes(secret)
    return (Keys({SHA1_CONSUMER: [[public_key(private)]]}),
            Keys({SHA1_CONSUMER: [[private]]}))


def dual_keys(producer_secret: Secret, consumer_secret: Secret) -> KeyPair:
    """Keys for the dual scheme: both sides must hold their secret."""
    producer = _bytes(producer_secret)
    consumer = _bytes(consumer_secret)
    return (Keys({SHA1_DUAL: [[producer], [public_key(consumer)]]}),
            Keys({SHA1_DUAL: [[public_key(producer)], [consumer]]}))


def _bytes(secret: Secret) -> bytes:
    """The secret's bytes. An empty secret is refused: its public key is
    SHA-1 of nothing, a constant anyone can compute, and the Avis router
    ends a session that sends an empty key."""
    if isinstance(secret, str):
        data = secret.encode("utf-8")
    elif isinstance(secret, (bytes, bytearray, memoryview)):
        data = bytes(secret)
    else:
        raise TypeError(f"a key's secret is str or bytes, not {type(secret).__name__}")
    if not data:
        raise ValueError("a key's secret is empty: anyone could compute its public key")
    return data
