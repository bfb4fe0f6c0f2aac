"""The subscription index: which subscriptions could match a notification.

This first version keeps every subscription in one insertion-ordered table
and offers them all as candidates; the router evaluates each compiled
subscription. A selective index replaces it behind the same interface.
"""

__all__ = ["SubscriptionIndex"]


class SubscriptionIndex:
    """Holds subscription entries (objects with ``id`` and ``evaluate``)."""

    def __init__(self):
        self._entries = {}

    def __len__(self):
        return len(self._entries)

    def add(self, entry):
        self._entries[entry.id] = entry

    def remove(self, entry):
        self._entries.pop(entry.id, None)

    def candidates(self, attributes):
        """Entries that may match ``attributes`` (here: all of them)."""
        return self._entries.values()
