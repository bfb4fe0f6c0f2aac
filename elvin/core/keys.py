"""Security keys: the SHA-1 producer, consumer and dual schemes.

A key is a byte string. A *private* key is hashed with SHA-1 to give its
*public* key. Scheme ids are those other Elvin routers use: dual 1,
producer 2, consumer 3.

- Producer scheme (2): the producer holds the private key and sends it
  with its notifications; consumers subscribe with the public key. The
  router hashes notification keys, and delivers securely when one equals a
  subscription key — only the holder of the private key can produce what
  those consumers receive securely.
- Consumer scheme (3): the consumer holds the private key and subscribes
  with it; producers send the public key. The router hashes subscription
  keys — only the holder of the private key can receive.
- Dual scheme (1): two key sets per side, producer keys then consumer
  keys; both halves must match.

The router hashes every private key it receives on arrival (clients send
raw keys), so what it keeps and compares are public keys, and it never
logs a key. ``KeyRing`` is the immutable, prepared form.
"""

from typing import ClassVar

from elvin import errors
from elvin.errors import ElvinError
from elvin.keys import (SCHEMES, SHA1_CONSUMER, SHA1_DUAL, SHA1_PRODUCER, consumer_keys,
                        dual_keys, producer_keys, public_key)
from elvin.protocols.packets import Keys

__all__ = ["SHA1_DUAL", "SHA1_PRODUCER", "SHA1_CONSUMER", "SCHEMES",
           "SUPPORTED_KEY_SCHEMES", "PRODUCER", "CONSUMER", "KeyRing",
           "public_key", "producer_keys", "consumer_keys", "dual_keys"]

#: The Supported-Key-Schemes connection option value (as Avis reports it).
SUPPORTED_KEY_SCHEMES = ("SHA-1",)

PRODUCER = "producer"
CONSUMER = "consumer"


class KeyRing:
    """Prepared (public) keys: scheme -> (producer set, consumer set).

    Single-key schemes keep their keys in the half their role uses:
    producer-scheme keys in the producer half, consumer-scheme keys in the
    consumer half.
    """

    __slots__ = ("_sets",)

    def __init__(self, sets=None):
        self._sets = {s: (frozenset(p), frozenset(c)) for s, (p, c) in (sets or {}).items()
                      if p or c}

    EMPTY: ClassVar["KeyRing"]  # set below

    def __bool__(self):
        return bool(self._sets)

    def __len__(self):
        return sum(len(p) + len(c) for p, c in self._sets.values())

    def __eq__(self, other):
        return isinstance(other, KeyRing) and self._sets == other._sets

    def __hash__(self):
        return hash(frozenset(self._sets.items()))

    def __repr__(self):
        return f"<KeyRing {len(self)} keys in schemes {sorted(self._sets)}>"

    @classmethod
    def from_wire(cls, keys, role):
        """Prepare ``keys`` (a packets.Keys) sent by a client in ``role``.

        Private keys of the role are hashed; raises ElvinError with
        BAD_KEY_SCHEME for an unknown scheme and BAD_KEY_INDEX for a wrong
        number of key sets, whose Nack args are the scheme and the index
        of the first bad key set (``_bad_index``), and BAD_KEY for a key
        of zero bytes (docs/security.md).
        """
        sets = {}
        for scheme, key_sets in keys.entries():
            if scheme not in SCHEMES:
                raise ElvinError(errors.BAD_KEY_SCHEME,
                                 f"unknown key scheme {scheme}", (_id32(scheme),))
            expected = 2 if scheme == SHA1_DUAL else 1
            if len(key_sets) != expected:
                raise ElvinError(errors.BAD_KEY_INDEX,
                                 f"key scheme {scheme} needs {expected} key set(s), "
                                 f"got {len(key_sets)}",
                                 (_id32(scheme), _bad_index(key_sets, expected)))
            for key_set in key_sets:
                if not all(key_set):
                    raise ElvinError(errors.BAD_KEY, "a key of zero bytes: an empty "
                                     "private key's public key is a constant anyone can "
                                     "compute")
            producer, consumer = sets.get(scheme, (set(), set()))
            producer, consumer = set(producer), set(consumer)
            if scheme == SHA1_DUAL:
                p_keys, c_keys = key_sets
            elif scheme == SHA1_PRODUCER:
                p_keys, c_keys = key_sets[0], ()
            else:
                p_keys, c_keys = (), key_sets[0]
            hash_producer = role == PRODUCER
            producer.update(public_key(k) if hash_producer else bytes(k) for k in p_keys)
            consumer.update(public_key(k) if not hash_producer else bytes(k) for k in c_keys)
            sets[scheme] = (producer, consumer)
        return cls(sets)

    def to_wire(self):
        """These prepared (public) keys as packets.Keys, e.g. for FedNotify."""
        entries = {}
        for scheme, (p, c) in sorted(self._sets.items()):
            if scheme == SHA1_DUAL:
                entries[scheme] = [sorted(p), sorted(c)]
            elif scheme == SHA1_PRODUCER:
                entries[scheme] = [sorted(p)]
            else:
                entries[scheme] = [sorted(c)]
        return Keys(entries)

    @classmethod
    def from_prepared_wire(cls, keys):
        """Keys already prepared by another router (FedNotify): no hashing."""
        sets = {}
        for scheme, key_sets in keys.entries():
            if scheme not in SCHEMES:
                raise ElvinError(errors.BAD_KEY_SCHEME, f"unknown key scheme {scheme}",
                                 (_id32(scheme),))
            if scheme == SHA1_DUAL and len(key_sets) == 2:
                sets[scheme] = ({bytes(k) for k in key_sets[0]}, {bytes(k) for k in key_sets[1]})
            elif scheme == SHA1_PRODUCER and len(key_sets) == 1:
                sets[scheme] = ({bytes(k) for k in key_sets[0]}, set())
            elif scheme == SHA1_CONSUMER and len(key_sets) == 1:
                sets[scheme] = (set(), {bytes(k) for k in key_sets[0]})
            else:
                expected = 2 if scheme == SHA1_DUAL else 1
                raise ElvinError(errors.BAD_KEY_INDEX, f"bad key sets for scheme {scheme}",
                                 (scheme, _bad_index(key_sets, expected)))
        return cls(sets)

    def union(self, other):
        merged = {s: (set(p), set(c)) for s, (p, c) in self._sets.items()}
        for s, (p, c) in other._sets.items():
            mp, mc = merged.setdefault(s, (set(), set()))
            mp |= p
            mc |= c
        return KeyRing(merged)

    def difference(self, other):
        result = {}
        for s, (p, c) in self._sets.items():
            op, oc = other._sets.get(s, ((), ()))
            result[s] = (p - set(op), c - set(oc))
        return KeyRing(result)

    def contains_all(self, other):
        """True when every key of ``other`` is in this ring."""
        for s, (p, c) in other._sets.items():
            mine = self._sets.get(s)
            if mine is None or not (p <= mine[0] and c <= mine[1]):
                return False
        return True

    def intersects(self, other):
        """True when any key of ``other`` is already in this ring."""
        for s, (p, c) in other._sets.items():
            mine = self._sets.get(s)
            if mine is not None and (p & mine[0] or c & mine[1]):
                return True
        return False

    def matches(self, consumer):
        """True when this (producer) ring lets ``consumer`` receive securely."""
        if not self._sets or not consumer._sets:
            return False
        for scheme, (p, c) in self._sets.items():
            theirs = consumer._sets.get(scheme)
            if theirs is None:
                continue
            tp, tc = theirs
            if scheme == SHA1_PRODUCER:
                if not p.isdisjoint(tp):
                    return True
            elif scheme == SHA1_CONSUMER:
                if not c.isdisjoint(tc):
                    return True
            elif not p.isdisjoint(tp) and not c.isdisjoint(tc):
                return True
        return False


KeyRing.EMPTY = KeyRing()


def _bad_index(key_sets, expected):
    """The index of the first bad key set of a scheme that has ``expected``
    (7.4.2's BAD_KEY_INDEX argument): the first one past those, or, when
    there are too few, the first missing one."""
    return min(len(key_sets), expected)


def _id32(scheme):
    """A scheme id (an id32, unsigned on the wire) as the int32 Value a
    Nack's arguments carry (7.4.2), two's complement past 2**31."""
    return scheme - (1 << 32) if scheme >= 1 << 31 else scheme
