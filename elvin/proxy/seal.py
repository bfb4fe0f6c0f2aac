"""Sealing what the proxy keeps at rest that must not be read from its
database file alone: sessions' and subscriptions' security keys, and
notifications that reached the proxy only through keys (docs/proxy.md,
"What the database file gives away").

AES-256-GCM from the ``cryptography`` package (the pyca project: OpenSSL's
implementation behind a small, well-reviewed API; it is already installed
with ``pyopenssl``, which the TLS transports need). The 32-byte key lives
in its own file, next to the database unless configured elsewhere, created
owner-only; a copy of the database without that file gives the sealed
columns away to nobody.
"""

from __future__ import annotations

import os
from typing import Optional

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["Sealer", "SealError", "MARK", "create_private", "make_private"]

#: What a sealed value starts with (plain JSON keys start with "{").
MARK = b"\x00s1"
_NONCE = 12


class SealError(Exception):
    """A sealed value could not be opened (wrong key file, or tampering)."""


def create_private(path: str) -> bool:
    """Create ``path`` empty and owner-only (0600) whatever the umask;
    False if it was there already."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    os.fchmod(fd, 0o600)
    os.close(fd)
    return True


def make_private(path: str) -> bool:
    """Take group and other permissions off ``path`` if it exists; True if
    they were there."""
    try:
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        return False
    if mode & 0o077:
        os.chmod(path, mode & 0o700)
        return True
    return False


class Sealer:
    """Seals and opens values with one key (``key``: 32 bytes)."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise SealError(f"a key is 32 bytes, not {len(key)}")
        self._aead = AESGCM(key)

    @classmethod
    def ephemeral(cls) -> "Sealer":
        """A key that lives as long as the process (an in-memory store)."""
        return cls(AESGCM.generate_key(bit_length=256))

    @classmethod
    def from_file(cls, path: str, create: bool = True) -> Optional["Sealer"]:
        """The key in ``path``, made (random, 0600) if the file is new; None
        if there is none and not ``create`` (the store first checks that its
        database holds nothing sealed with a key that went missing)."""
        if not create and not os.path.exists(path):
            return None
        if create and create_private(path):
            with open(path, "wb") as f:
                f.write(AESGCM.generate_key(bit_length=256))
        else:
            make_private(path)
        with open(path, "rb") as f:
            key = f.read()
        if len(key) != 32:
            raise SealError(f"{path}: not a proxy key file ({len(key)} bytes, not 32)")
        return cls(key)

    def seal(self, data: bytes, context: bytes = b"") -> bytes:
        nonce = os.urandom(_NONCE)
        return MARK + nonce + self._aead.encrypt(nonce, data, context)

    def open(self, blob: Optional[bytes], context: bytes = b"") -> Optional[bytes]:
        """The value of a sealed ``blob``; a value stored before sealing
        (no mark) is returned as it is."""
        if blob is None or not bytes(blob).startswith(MARK):
            return blob
        blob = bytes(blob)
        nonce = blob[len(MARK):len(MARK) + _NONCE]
        try:
            return self._aead.decrypt(nonce, blob[len(MARK) + _NONCE:], context)
        except Exception as e:
            raise SealError("a sealed value did not open: the key file is not the one "
                            "it was sealed with, or the database was altered") from e

    def open_body(self, blob: bytes) -> bytes:
        """``open`` for a notification body known to be sealed."""
        opened = self.open(blob, b"notification")
        assert opened is not None
        return opened
