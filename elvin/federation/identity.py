"""Router domains as federation peers present them, and peer-supplied text
in logs and metrics labels.

Federation 1.0 (6.2.1) makes a router domain "a unique UTF-8 string",
recommended to be based on the host's DNS name or address; the Avis router
takes any string (its default is ``hash.pid@hostname``). A domain is kept
for the life of a link, logged on each link event, written into traces,
carried in every FedNotify's routing list and used as a metrics label, so
a peer's domain must be at most ``MAX_DOMAIN_BYTES`` bytes of UTF-8 and
printable: no control, format (bidirectional overrides, zero-width),
separator other than the ASCII space, surrogate, private-use or unassigned
characters (``str.isprintable``). Anything a DNS name, an address, an
``elvin://host:port`` string or an Avis default can be passes; so do
non-ASCII letters (docs/federation.md, "Router domains").
"""

__all__ = ["MAX_DOMAIN_BYTES", "SHOWN_CHARACTERS", "domain_problem", "shown"]

#: Longest router domain accepted from a peer (and configured for us), in
#: UTF-8 bytes: a DNS name is at most 253.
MAX_DOMAIN_BYTES = 255

#: Most characters of a peer-supplied string ``shown`` puts in a log line.
SHOWN_CHARACTERS = 80


def domain_problem(domain):
    """Why ``domain`` is not an acceptable router domain, or None. The
    reason never quotes the domain (see ``shown``)."""
    if not isinstance(domain, str) or not domain:
        return "empty router domain"
    size = len(domain.encode("utf-8", "surrogatepass"))
    if size > MAX_DOMAIN_BYTES:
        return f"router domain of {size} bytes (at most {MAX_DOMAIN_BYTES})"
    if not domain.isprintable():
        bad = next(c for c in domain if not c.isprintable())
        return (f"router domain holds a control or invisible character "
                f"(U+{ord(bad):04X} at {domain.index(bad)})")
    return None


def shown(text, limit=SHOWN_CHARACTERS):
    """``text`` (a peer-supplied string) fit for a log line or a label: at
    most ``limit`` characters, each unprintable one escaped (``\\n``,
    ``\\x1b``, ``\\u202e``), and what was cut off counted. A printable
    string that short is returned unchanged; None stays None."""
    if text is None:
        return None
    text = str(text)
    if len(text) <= limit and text.isprintable():
        return text
    out = []
    length = 0
    for i, c in enumerate(text):
        piece = c if c.isprintable() else repr(c)[1:-1]
        if length + len(piece) > limit:
            return "".join(out) + f"…[{len(text) - i} more characters]"
        out.append(piece)
        length += len(piece)
    return "".join(out)
