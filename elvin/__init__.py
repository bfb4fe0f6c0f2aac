"""elvin: an Elvin 4.0 content-based message router, client library and tools."""

from elvin.errors import ElvinError, SubscriptionError
from elvin.subscription import Subscription
from elvin.uri import ElvinURI, EwafURI, InvalidURIError
from elvin.values import Int32, Int64

__all__ = ["Subscription", "SubscriptionError", "ElvinError", "ElvinURI", "EwafURI",
           "InvalidURIError", "Int32", "Int64"]

__version__ = "0.1.0"
