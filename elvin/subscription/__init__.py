"""The Elvin subscription language: parse, check, compile, evaluate.

    >>> sub = Subscription('Group == "chat" && size(Message) < 140')
    >>> sub.matches({"Group": "chat", "Message": "hi"})
    True

The names below are imported on first use, so importing a module of this
package (as the XDR codec does for the tree types) does not import the
parser, the compiler or the codec.
"""

from elvin.errors import SubscriptionError

__all__ = ["Subscription", "SubscriptionError", "Kind", "Node", "parse",
           "to_text"]

from elvin.lazy import lazy_attributes

_LAZY = {
    "Subscription": "elvin.subscription.expression",
    "parse": "elvin.subscription.expression",
    "Kind": "elvin.subscription.kinds",
    "Node": "elvin.subscription.ast",
    "to_text": "elvin.subscription.printer",
}


__getattr__ = lazy_attributes(__name__, _LAZY)
