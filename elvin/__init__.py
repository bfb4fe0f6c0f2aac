"""elvin: an Elvin 4.0 content-based message router, client library and tools.

The names below are imported on first use, so importing a module of the
package (``import elvin.values``) does not import the subscription parser,
the compiler or the codec.
"""

from typing import TYPE_CHECKING

from elvin.lazy import lazy_attributes

if TYPE_CHECKING:
    from elvin.errors import ElvinError, SubscriptionError
    from elvin.subscription.expression import Subscription
    from elvin.uri import ElvinURI, EwafURI, InvalidURIError
    from elvin.values import Int32, Int64

__all__ = ["Subscription", "SubscriptionError", "ElvinError", "ElvinURI", "EwafURI",
           "InvalidURIError", "Int32", "Int64"]

__version__ = "0.1.0"

_LAZY = {
    "Subscription": "elvin.subscription.expression",
    "SubscriptionError": "elvin.errors",
    "ElvinError": "elvin.errors",
    "ElvinURI": "elvin.uri",
    "EwafURI": "elvin.uri",
    "InvalidURIError": "elvin.uri",
    "Int32": "elvin.values",
    "Int64": "elvin.values",
}

__getattr__ = lazy_attributes(__name__, _LAZY)


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
