"""How much string matching one client's subscriptions may do for one notification.

``regex``, ``wildcard`` and ``contains`` cost time in proportion to the
string they read times the pattern: RE2 is linear in the input, but when
its DFA gives up (``wildcard(x, "*a?*a?...")``, 15,000 instructions) it
runs its NFA at about 1.5 ns per instruction and byte, 20 s for one 1 MiB
string; ``contains`` with many needles scans the string once per needle.
No other predicate reads more than a value's first bytes. So a test's
*work* is its weight (RE2 program instructions, or needles) times the
string's length, and a ``PatternBudget`` caps the work of one client's
subscriptions on one notification: a test that would pass the cap is not
run and is bottom (the subscription does not match), and the owner is told
once for that notification (``on_refused``: the router counts it, logs
it and sends the client a DropWarn).

The budget is found through ``CURRENT``, set by ``PatternBudget.metered``
around one subscription's evaluation, so that compiled tests need no
reference to their owner and an evaluation outside any budget (a client
library testing a notification, federation filters) is not limited.
Evaluation is single-threaded (the reactor's), as is ``CURRENT``.
"""

from elvin.subscription.ast import Kind

__all__ = ["PatternBudget", "CURRENT", "metered_test", "SCANNING_KINDS", "scans_strings"]

#: The predicates whose work grows with the string they read.
SCANNING_KINDS = frozenset({Kind.FUNC_REGEX, Kind.FUNC_WILDCARD, Kind.FUNC_CONTAINS})


def scans_strings(tree):
    """Does evaluating ``tree`` run a test whose work grows with a string?"""
    return any(n.kind in SCANNING_KINDS for n in tree.walk())


class _Current:
    __slots__ = ("budget",)

    def __init__(self):
        self.budget = None


#: The budget of the evaluation in progress, or None.
CURRENT = _Current()


def metered_test(test, weight):
    """``test`` (a str -> bool) charged ``weight`` times the string's length
    to the budget of the evaluation in progress; bottom (None) when that
    budget cannot pay for it."""
    current = CURRENT

    def metered(value):
        budget = current.budget
        if budget is not None and not budget.spend(weight * len(value)):
            return None
        return test(value)
    return metered


class PatternBudget:
    """One client's string-matching work per notification.

    ``limits`` is any object with a ``max_pattern_work`` attribute (the
    router: a reload applies from the next notification); 0 means no
    limit. ``on_refused()`` is called at most once per notification, the
    first time a test is refused.
    """

    __slots__ = ("limits", "on_refused", "notification", "spent", "refused", "denied",
                 "_limit")

    def __init__(self, limits, on_refused):
        self.limits = limits
        self.on_refused = on_refused
        #: The notification being charged (held, so that no other one can
        #: take its identity while it is) and what it has cost so far.
        self.notification = None
        self.spent = 0
        self.refused = False
        #: Tests refused in all (an evaluation compares it before and after).
        self.denied = 0
        self._limit = 0

    def metered(self, evaluate, refused_means_true=False):
        """``evaluate`` charging its string tests to this budget. With
        ``refused_means_true`` an evaluation in which a test was refused is
        true: for a federation filter, where passing on more than asked is
        allowed and passing on less would lose notifications."""
        budget = self
        current = CURRENT

        def evaluate_metered(attributes):
            if budget.notification is not attributes:
                budget.notification = attributes
                budget.spent = 0
                budget.refused = False
                budget._limit = budget.limits.max_pattern_work
            denied = budget.denied
            current.budget = budget
            try:
                result = evaluate(attributes)
            finally:
                current.budget = None
            if refused_means_true and budget.denied != denied:
                return True
            return result
        return evaluate_metered

    def spend(self, work):
        """Charge ``work``; False (and nothing charged) when it does not fit."""
        limit = self._limit
        spent = self.spent + work
        if limit and spent > limit:
            self.denied += 1
            if not self.refused:
                self.refused = True
                self.on_refused()
            return False
        self.spent = spent
        return True
