"""Transports and the XDR codec: bytes in, immutable packets out, and back."""
