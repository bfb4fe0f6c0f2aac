"""The Elvin proxy for sometimes-disconnected clients (issue 17; the
mobile-proxy paper). So far: its durable store (``elvin.proxy.store``)."""
