"""The Elvin proxy for sometimes-disconnected clients, after the
mobile-proxy paper (docs/proxy.md): ``core`` (sessions, subscriptions and
delivery, without I/O), ``store`` (the durable store), ``seal`` (what it
keeps at rest, sealed), ``guard`` (password checks), ``ack`` (clients'
acknowledgements), ``upstream`` (the one connection to the router),
``protocol``, ``config`` and ``tap`` (``twistd elvin-proxy``)."""
