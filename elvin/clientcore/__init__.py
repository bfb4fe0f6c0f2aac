"""The client's sans-IO core, shared by every client flavour and free of
Twisted: ``state`` (requests, replies, deliveries, quench events) and
``lifecycle`` (the connection's life as one state machine). docs/client.md."""
