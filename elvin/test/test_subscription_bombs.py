"""Subscription bombs are refused or evaluated in bounded time.

These tests assert results, not timings: with a backtracking engine the
regex cases would not finish, and trial's timeout would fail them.
"""

from twisted.trial import unittest

from elvin import Subscription, SubscriptionError, errors
from elvin.subscription import patterns


class RegexBombTests(unittest.TestCase):
    timeout = 60

    def test_engine_is_linear_time(self):
        self.assertEqual(patterns.ENGINE, "re2")

    def test_catastrophic_backtracking_patterns(self):
        subject = "a" * 50000 + "!"
        for pattern in ["(a+)+$", "(a|aa)+$", "(a*)*b", "^(([a-z])+.)+[A-Z]([a-z])+$"]:
            sub = Subscription(f'regex(s, "{pattern}")')
            self.assertFalse(sub.matches({"s": subject}), pattern)

    def test_wildcard_with_many_stars(self):
        sub = Subscription('wildcard(s, "*a*a*a*a*a*a*a*a*b")')
        self.assertFalse(sub.matches({"s": "a" * 50000}))
        self.assertTrue(sub.matches({"s": "a" * 50000 + "b"}))

    def test_backreferences_are_too_complex(self):
        for pattern in [r"(a)\\1", "(?=a)a", "(?<!x)y"]:
            with self.assertRaises(SubscriptionError) as cm:
                Subscription(f'regex(s, "{pattern}")')
            self.assertEqual(cm.exception.code, errors.REGEXP_TOO_COMPLEX, pattern)
            self.assertEqual(cm.exception.offset, 9)

    def test_huge_program_is_too_complex(self):
        with self.assertRaises(SubscriptionError) as cm:
            Subscription('regex(s, "((((a{100}){100}){100}){100})")')
        self.assertIn(cm.exception.code, (errors.REGEXP_TOO_COMPLEX, errors.INVALID_REGEXP))

    def test_several_regexes_are_one_scan_that_agrees_with_any(self):
        """``regex(x, p1, p2, ...)`` is searched as one alternation (200
        patterns searched one by one were 200 calls a notification): the
        same answer as any one of them matching, flags staying inside
        their own pattern."""
        import random
        rng = random.Random(7)
        atoms = ["a", "b", "^a", "b$", "a+", "(?i)A", "[ab]", "x*", r"\d", "(a|b)c", "c.",
                 "$", "^", "(?i)X"]
        subjects = ["", "a", "b", "ab", "ba", "A", "c", "xc", "1", "\n", "a\nb", "bc", "x"]
        for _ in range(500):
            chosen = [rng.choice(atoms) + rng.choice(["", rng.choice(atoms)])
                      for _ in range(rng.randint(2, 4))]
            together, _ = patterns.weighed_regexes(chosen)
            alone = [patterns.weighed_regexes([p])[0] for p in chosen]
            for subject in subjects:
                self.assertEqual(together(subject) is not None,
                                 any(f(subject) is not None for f in alone), (chosen, subject))
        many = [f"lat{i}x" for i in range(200)]
        search, weight = patterns.weighed_regexes(many)
        self.assertIsNotNone(search("zzlat199xzz"))
        self.assertLess(weight, sum(patterns.weighed_regexes([p])[1] for p in many))

    def test_invalid_is_still_invalid(self):
        with self.assertRaises(SubscriptionError) as cm:
            Subscription('regex(s, "(")')
        self.assertEqual(cm.exception.code, errors.INVALID_REGEXP)

    def test_syntax_outside_re2_is_invalid_not_too_complex(self):
        """What RE2 lacks but could run in linear time (a POSIX class name
        it does not know, Python's \\Z, possessive and atomic groups) is
        INVALID_REGEXP; only what it cannot match in linear time or within
        its limits is REGEXP_TOO_COMPLEX."""
        for pattern in ["[[:foo:]]", r"c\\Z", r"\\u00e9", "a++", "(?>a)", "(?x)a", r"\\h"]:
            with self.assertRaises(SubscriptionError) as cm:
                Subscription(f'regex(s, "{pattern}")')
            self.assertEqual(cm.exception.code, errors.INVALID_REGEXP, pattern)
        with self.assertRaises(SubscriptionError) as cm:
            Subscription('regex(s, "a{1001}")')
        self.assertEqual(cm.exception.code, errors.REGEXP_TOO_COMPLEX)


class StructureBombTests(unittest.TestCase):
    timeout = 60

    def test_deep_nesting_is_refused(self):
        for depth in (129, 1000, 100000):
            with self.assertRaises(SubscriptionError) as cm:
                Subscription("(" * depth + "x == 1" + ")" * depth)
            self.assertEqual(cm.exception.code, errors.NESTING_TOO_DEEP)

    def test_deep_unary_chain_is_refused(self):
        with self.assertRaises(SubscriptionError) as cm:
            Subscription("x == " + "-" * 5000 + "x")
        self.assertEqual(cm.exception.code, errors.NESTING_TOO_DEEP)

    def test_long_arithmetic_chain_is_refused(self):
        with self.assertRaises(SubscriptionError) as cm:
            Subscription("x == " + " + ".join(["1"] * 5000) + " + y")
        self.assertEqual(cm.exception.code, errors.NESTING_TOO_DEEP)

    def test_huge_or_chain_works(self):
        text = " || ".join(f"x == {i}" for i in range(5000))
        sub = Subscription(text)
        self.assertEqual(len(sub.ast.children), 5000)
        self.assertTrue(sub.matches({"x": 4999}))
        self.assertFalse(sub.matches({"x": 5000}))

    def test_many_function_arguments(self):
        args = ", ".join(f'"p{i}"' for i in range(5000))
        sub = Subscription(f"begins-with(s, {args})")
        self.assertTrue(sub.matches({"s": "p4999-tail"}))

    def test_very_long_string_and_name(self):
        sub = Subscription(f'{"n" * 100000} == "{"v" * 100000}"')
        self.assertTrue(sub.matches({"n" * 100000: "v" * 100000}))
