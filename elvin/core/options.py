"""Connection options (client protocol 4.0, section 7.5) and their negotiation.

For each option a client requests, the router either accepts the value,
offers the value it is prepared to provide (clamped into its range), or,
for an option it does not recognise, leaves it out of the reply. Legacy
``router.*`` names (section 7.5.3) are understood and answered under the
name the client used.

A legacy name is another name for its standard option, not a second
option: when a request names both, one value is decided (the standard
name's, unless it is out of range or of the wrong type and the legacy
name's is not: what Avis does), enforced, and reported under each name
the client used (docs/interop.md).
"""

import enum

from elvin.values import INT32_MAX

__all__ = ["OptionSpec", "OPTIONS", "COMPAT_NAMES", "DropPolicy",
           "ConnectionOptions", "canonical_name", "VENDOR_IDENTIFICATION", "CEILING_SUFFIX",
           "HARD_CEILINGS"]

VENDOR_IDENTIFICATION = "elvin-python 0.1 (Twisted)"


class DropPolicy(str, enum.Enum):
    OLDEST = "oldest"
    NEWEST = "newest"
    LARGEST = "largest"
    NONE = "none"


class OptionSpec:
    """One negotiable option: its type, default and acceptable range."""

    __slots__ = ("name", "kind", "default", "low", "high", "choices")

    def __init__(self, name, kind, default, low=None, high=None, choices=None):
        self.name = name
        self.kind = kind
        self.default = default
        self.low = low
        self.high = high
        self.choices = choices

    def offer(self, requested):
        """The value the router provides when ``requested`` is asked for."""
        if self.kind is int:
            if type(requested) is not int and not isinstance(requested, int):
                return self.default
            if isinstance(requested, bool):
                return self.default
            return max(self.low, min(self.high, int(requested)))
        if self.kind is str:
            if isinstance(requested, str) and requested in self.choices:
                return requested
            return self.default
        return self.default

    def within(self, value):
        """True for a value the router takes as it is (no clamping, no default)."""
        if self.kind is int:
            return (isinstance(value, int) and not isinstance(value, bool)
                    and self.low <= value <= self.high)
        if self.kind is str:
            return isinstance(value, str) and value in self.choices
        return False

    def with_ceiling(self, high):
        """This option with clients allowed at most ``high``."""
        return OptionSpec(self.name, self.kind, self.default, self.low, high, self.choices)

    def with_default(self, default, low=None, high=None):
        return OptionSpec(self.name, self.kind, default,
                          self.low if low is None else low,
                          self.high if high is None else high, self.choices)


_POLICIES = tuple(p.value for p in DropPolicy)
KiB = 1024
MiB = 1024 * 1024

OPTIONS = {spec.name: spec for spec in (
    OptionSpec("Attribute.Max-Count", int, 256, 16, 65536),
    OptionSpec("Attribute.Name.Max-Length", int, 2048, 64, 64 * KiB),
    OptionSpec("Attribute.Opaque.Max-Length", int, 1 * MiB, 1024, 64 * MiB),
    OptionSpec("Attribute.String.Max-Length", int, 1 * MiB, 1024, 64 * MiB),
    # The highest values (what a client may negotiate up to) are router-wide
    # ceilings a real deployment would pick; each can be changed with
    # "<option>.Ceiling = N" in the configuration (docs/router.md).
    OptionSpec("Packet.Max-Length", int, 2 * MiB, 1024, 16 * MiB),
    OptionSpec("Receive-Queue.Drop-Policy", str, "oldest", choices=_POLICIES),
    OptionSpec("Receive-Queue.Max-Length", int, 1 * MiB, 1024, 64 * MiB),
    OptionSpec("Send-Queue.Drop-Policy", str, "oldest", choices=_POLICIES),
    OptionSpec("Send-Queue.Max-Length", int, 2 * MiB, 1024, 256 * MiB),
    OptionSpec("Subscription.Max-Count", int, 10000, 16, 100_000),
    OptionSpec("Subscription.Max-Length", int, 4096, 1024, 64 * KiB),
    # 1 disables Nagle's algorithm (8.2.1.1). On by default: Twisted already
    # coalesces what is written in one reactor turn, and Nagle with delayed
    # ACKs adds tens of milliseconds to small deliveries.
    OptionSpec("TCP.Send-Immediately", int, 1, 0, 1),
    # Key limits, named as the Avis router names them.
    OptionSpec("Connection.Max-Keys", int, 1024, 0, 65536),
    OptionSpec("Subscription.Max-Keys", int, 256, 0, 65536),
)}

#: "<option>.Ceiling = N" in a configuration sets the most a client may
#: negotiate for an integer option; N may not exceed ``HARD_CEILINGS``.
CEILING_SUFFIX = ".Ceiling"

#: How far a configuration may raise each ceiling: the values the protocol
#: or the router's data structures can hold.
HARD_CEILINGS = {
    "Attribute.Max-Count": 65536,
    "Attribute.Name.Max-Length": 64 * KiB,
    "Attribute.Opaque.Max-Length": 64 * MiB,
    "Attribute.String.Max-Length": 64 * MiB,
    "Packet.Max-Length": 64 * MiB,
    "Receive-Queue.Max-Length": 64 * MiB,
    "Send-Queue.Max-Length": 256 * MiB,
    "Subscription.Max-Count": INT32_MAX,
    "Subscription.Max-Length": 1 * MiB,
    "TCP.Send-Immediately": 1,
    "Connection.Max-Keys": 65536,
    "Subscription.Max-Keys": 65536,
}

#: Legacy names (section 7.5.3) -> standard names.
COMPAT_NAMES = {
    "router.attribute.max-count": "Attribute.Max-Count",
    "router.coalesce-delay": "TCP.Send-Immediately",  # inverted, see _INVERTED
    "router.attribute.name.max-length": "Attribute.Name.Max-Length",
    "router.attribute.opaque.max-length": "Attribute.Opaque.Max-Length",
    "router.attribute.string.max-length": "Attribute.String.Max-Length",
    "router.packet.max-length": "Packet.Max-Length",
    "router.recv-queue.drop-policy": "Receive-Queue.Drop-Policy",
    "router.recv-queue.max-length": "Receive-Queue.Max-Length",
    "router.send-queue.drop-policy": "Send-Queue.Drop-Policy",
    "router.send-queue.max-length": "Send-Queue.Max-Length",
    "router.subscription.max-count": "Subscription.Max-Count",
    "router.subscription.max-length": "Subscription.Max-Length",
    "router.supported-keyschemes": "Supported-Key-Schemes",
    "router.vendor-identification": "Vendor-Identification",
}

_INFORMATIONAL = ("Vendor-Identification", "Supported-Key-Schemes")

#: Legacy names whose 0/1 value is the inverse of the standard option's.
_INVERTED = frozenset({"router.coalesce-delay"})


def canonical_name(name):
    """The standard name for ``name`` (legacy names mapped), or None."""
    if name in OPTIONS or name in _INFORMATIONAL:
        return name
    return COMPAT_NAMES.get(name)


class ConnectionOptions:
    """The options in force for one connection, and how to negotiate them.

    ``specs`` lets the router's configuration change defaults and ranges.
    ``count_fields``: the arrays a client sends that an option bounds, as
    a mapping of the decoder's name for each (``"NotifyEmit.attributes"``)
    to the option (or to ``(option, floor)``: the option's value, at least
    ``floor``); ``count_limits`` is then that mapping with the options'
    values in force, for ``packets.decode`` to leave an array over its
    limit unread (None without ``count_fields``).
    """

    #: A QosRqst may name every option (17, and their old names) whatever
    #: Attribute.Max-Count is (its least is 16): its options are held to
    #: Attribute.Max-Count or this, whichever is more.
    QOS_OPTIONS_FLOOR = 64

    def __init__(self, specs=None, key_schemes=(), count_fields=None):
        self.specs = dict(OPTIONS if specs is None else specs)
        self.key_schemes = tuple(key_schemes)
        self.count_fields = count_fields
        self.values = {name: spec.default for name, spec in self.specs.items()}
        self._limits_changed()

    def __getitem__(self, name):
        return self.values[name]

    def negotiate(self, requested):
        """Apply a ConnRqst/QosRqst options table; return the reply table.

        The reply has an entry for every recognised requested option (under
        the name the client used), plus the informational options.
        """
        asked = {}
        for name, value in requested.items():
            standard = canonical_name(name)
            if standard is None or standard in _INFORMATIONAL:
                continue
            if name in _INVERTED and type(value) is int:
                value = 0 if value else 1
            # The standard name's value first, then the legacy name's.
            if name == standard:
                asked.setdefault(standard, []).insert(0, value)
            else:
                asked.setdefault(standard, []).append(value)
        proposed = dict(self.values)
        for standard, values in asked.items():
            spec = self.specs[standard]
            value = next((v for v in values if spec.within(v)), values[0])
            proposed[standard] = spec.offer(value)
        reply = {}
        for name in requested:
            standard = canonical_name(name)
            if standard is None:
                continue
            if standard in _INFORMATIONAL:
                reply[name] = self._informational(standard)
                continue
            offered = proposed[standard]
            reply[name] = (0 if offered else 1) if name in _INVERTED else offered
        self.values = proposed
        self._limits_changed()
        for standard in _INFORMATIONAL:
            if standard not in reply and not any(
                    canonical_name(n) == standard for n in reply):
                reply[standard] = self._informational(standard)
        return reply

    def _limits_changed(self):
        #: ``(Attribute.Max-Count, the smallest length limit)``: a packet no
        #: longer than the smallest limit holds no name, string or opaque
        #: over any of them, so only its count needs checking (the router's
        #: per-notification fast path, ``notification_problem``).
        values = self.values
        self.attribute_limits = (values["Attribute.Max-Count"],
                                 min(values["Attribute.Name.Max-Length"],
                                     values["Attribute.String.Max-Length"],
                                     values["Attribute.Opaque.Max-Length"]))
        fields = self.count_fields
        self.count_limits = None if fields is None else {
            what: (values[option] if type(option) is str else max(values[option[0]], option[1]))
            for what, option in fields.items()}

    def _informational(self, standard):
        if standard == "Vendor-Identification":
            return VENDOR_IDENTIFICATION
        return " ".join(self.key_schemes)

    def as_dict(self):
        """Every option in force, by standard name."""
        result = dict(self.values)
        for standard in _INFORMATIONAL:
            result[standard] = self._informational(standard)
        return result
