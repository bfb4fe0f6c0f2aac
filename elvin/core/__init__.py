"""The no-I/O core: sessions, subscriptions, routing, keys, options, quench
and send queues. Nothing here imports Twisted's reactor or does I/O; the
transports in ``elvin.protocols`` and ``elvin.federation`` drive it."""
