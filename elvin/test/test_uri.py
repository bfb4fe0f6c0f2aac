"""Tests for elvin.uri, with expectations taken from the Elvin URI Scheme
Internet-Draft."""

import copy
import pickle

from twisted.trial import unittest

from elvin.errors import echoed
from elvin import uri as urimod
from elvin.uri import (
    DEFAULT_PORT,
    DEFAULT_PROTOCOL,
    SECURE_PROTOCOL,
    ElvinURI,
    EwafURI,
    InvalidURIError,
    default_port,
)

try:
    from hypothesis import given, settings, strategies as st
except ImportError:  # pragma: no cover
    given = None


class DefaultsTests(unittest.TestCase):
    """Values used when the URI leaves a component out."""

    def test_constants(self):
        self.assertEqual(DEFAULT_PORT, 2917)
        self.assertEqual(default_port(), 2917)
        self.assertEqual(DEFAULT_PROTOCOL, ("tcp", "none", "xdr"))
        self.assertEqual(SECURE_PROTOCOL, ("ssl", "none", "xdr"))

    def test_minimal(self):
        u = ElvinURI("elvin://host")
        self.assertEqual(u.version, (4, 0))
        self.assertEqual(u.protocol, ("tcp", "none", "xdr"))
        self.assertEqual(u.host, "host")
        self.assertEqual(u.port, 2917)
        self.assertEqual(u.options, {})

    def test_full(self):
        u = ElvinURI("elvin:4.0/tcp,none,xdr/host:2917;opt=v")
        self.assertEqual(u.version, (4, 0))
        self.assertEqual(u.protocol, ("tcp", "none", "xdr"))
        self.assertEqual(u.host, "host")
        self.assertEqual(u.port, 2917)
        self.assertEqual(u.options, {"opt": "v"})

    def test_types(self):
        u = ElvinURI("elvin:4.1/tcp,none,xdr/host:1234")
        self.assertIsInstance(u.version, tuple)
        self.assertIsInstance(u.protocol, tuple)
        self.assertIsInstance(u.port, int)
        self.assertIsInstance(u.options, dict)


class SpecExampleTests(unittest.TestCase):
    """Every URI written out in the draft."""

    def test_krb5_stack(self):
        # "elvin:/tcp,krb5,xdr/router.example.com"
        u = ElvinURI("elvin:/tcp,krb5,xdr/router.example.com")
        self.assertEqual(u.version, (4, 0))
        self.assertEqual(u.protocol, ("tcp", "krb5", "xdr"))
        self.assertEqual(u.host, "router.example.com")
        self.assertEqual(u.port, 2917)
        self.assertEqual(u.options, {})

    def test_default_protocol_alias(self):
        # "elvin://router.example.com" uses the stack "tcp,none,xdr".
        u = ElvinURI("elvin://router.example.com")
        self.assertEqual(u.protocol, ("tcp", "none", "xdr"))
        self.assertEqual(u.host, "router.example.com")
        self.assertEqual(u.port, 2917)
        self.assertEqual(u, ElvinURI("elvin:4.0/tcp,none,xdr/"
                                     "router.example.com:2917"))

    def test_secure_alias(self):
        # "secure" is an alias for "ssl,none,xdr".
        u = ElvinURI("elvin:/secure/router.example.com")
        self.assertEqual(u.protocol, ("ssl", "none", "xdr"))
        self.assertEqual(u.transport, "ssl")
        self.assertTrue(u.is_secure)
        self.assertEqual(u, ElvinURI("elvin:/ssl,none,xdr/router.example.com"))
        # Routers must not advertise aliases: the canonical form expands it.
        self.assertEqual(str(u), "elvin:4.0/ssl,none,xdr/"
                                 "router.example.com:2917")

    def test_version_4_0(self):
        self.assertEqual(ElvinURI("elvin:4.0//host").version, (4, 0))


class VersionTests(unittest.TestCase):

    def test_omitted(self):
        self.assertEqual(ElvinURI("elvin:/tcp,none,xdr/host").version, (4, 0))

    def test_major_minor(self):
        self.assertEqual(ElvinURI("elvin:4.1//host").version, (4, 1))
        self.assertEqual(ElvinURI("elvin:3.12//host").version, (3, 12))

    def test_major_only(self):
        # version = 1*digit [ "." 1*digit ]
        self.assertEqual(ElvinURI("elvin:4//host").version, (4, 0))
        self.assertEqual(ElvinURI("elvin:5/tcp,none,xdr/host").version,
                         (5, 0))

    def test_leading_zeros(self):
        self.assertEqual(ElvinURI("elvin:04.00//host").version, (4, 0))

    def test_with_default_stack(self):
        u = ElvinURI("elvin:4.0//host:1")
        self.assertEqual(u.protocol, DEFAULT_PROTOCOL)
        self.assertEqual(u.port, 1)


class ProtocolTests(unittest.TestCase):

    def test_explicit_default(self):
        u = ElvinURI("elvin:/tcp,none,xdr/host:2917")
        self.assertEqual(u.protocol, ("tcp", "none", "xdr"))
        self.assertEqual(u.transport, "tcp")
        self.assertEqual(u.security, "none")
        self.assertEqual(u.marshalling, "xdr")
        self.assertFalse(u.is_secure)

    def test_tls_security_layer(self):
        u = ElvinURI("elvin:4.0/tcp,ssl,xdr/host:29170")
        self.assertEqual(u.protocol, ("tcp", "ssl", "xdr"))
        self.assertEqual(u.security, "ssl")
        self.assertEqual(u.port, 29170)
        self.assertTrue(u.is_secure)
        self.assertNotEqual(u, ElvinURI("elvin:4.0/secure/host:29170"))

    def test_tls_names(self):
        self.assertTrue(ElvinURI("elvin:/tcp,tls,xdr/h").is_secure)
        self.assertTrue(ElvinURI("elvin:/tls,none,xdr/h").is_secure)
        self.assertFalse(ElvinURI("elvin:/tcp,krb5,xdr/h").is_secure)

    def test_experimental_names(self):
        u = ElvinURI("elvin:/x-udp,x-sha1,x-json/h")
        self.assertEqual(u.protocol, ("x-udp", "x-sha1", "x-json"))

    def test_alphanumeric_names(self):
        u = ElvinURI("elvin:/tcp6,krb5,xdr2/h")
        self.assertEqual(u.protocol, ("tcp6", "krb5", "xdr2"))

    def test_case_normalised(self):
        u = ElvinURI("elvin:/TCP,None,XDR/h")
        self.assertEqual(u.protocol, ("tcp", "none", "xdr"))
        self.assertEqual(ElvinURI("elvin:/SECURE/h").protocol,
                         SECURE_PROTOCOL)

    def test_aliases_table(self):
        self.assertEqual(dict(urimod.PROTOCOL_ALIASES),
                         {"": ("tcp", "none", "xdr"),
                          "secure": ("ssl", "none", "xdr")})


class EndpointTests(unittest.TestCase):

    def test_port(self):
        self.assertEqual(ElvinURI("elvin://host:1").port, 1)
        self.assertEqual(ElvinURI("elvin://host:65535").port, 65535)
        self.assertEqual(ElvinURI("elvin://host:02917").port, 2917)

    def test_ipv4(self):
        u = ElvinURI("elvin://192.168.0.2:2917;foo=true")
        self.assertEqual(u.host, "192.168.0.2")
        self.assertEqual(u.port, 2917)
        self.assertEqual(u.options, {"foo": "true"})

    def test_hostnames(self):
        for host in ["localhost", "a", "router-1.example.com",
                     "router.example.com.", "3com.com", "A.B.C"]:
            self.assertEqual(ElvinURI(f"elvin://{host}:5").host, host)

    def test_hostnames_with_underscores(self):
        """Container runtimes and internal DNS zones hand out names with
        '_'; resolvers look them up and Avis accepts them."""
        for host in ["elvin_host", "router_1", "_srv.example.org", "a_", "_",
                     "my_app-1.internal_zone.local."]:
            self.assertEqual(ElvinURI(f"elvin://{host}").host, host)
            self.assertEqual(ElvinURI(f"elvin://{host}:2917").port, 2917)
            self.assertEqual(ElvinURI(f"elvin:4.0/tcp,none,xdr/{host}:2917").host, host)
            self.assertEqual(ElvinURI(str(ElvinURI(f"elvin://{host}"))).host, host)

    def test_ipv6_default_port(self):
        u = ElvinURI("elvin://[::1]")
        self.assertEqual(u.host, "::1")
        self.assertEqual(u.port, 2917)

    def test_ipv6_with_port(self):
        u = ElvinURI("elvin:4.0/tcp,none,xdr/[fe80::1:2]:29170;a=b")
        self.assertEqual(u.host, "fe80::1:2")
        self.assertEqual(u.port, 29170)
        self.assertEqual(u.options, {"a": "b"})

    def test_ipv6_rfc2732_examples(self):
        for host in ["FEDC:BA98:7654:3210:FEDC:BA98:7654:3210",
                     "1080:0:0:0:8:800:200C:417A", "3ffe:2a00:100:7031::1",
                     "1080::8:800:200C:417A", "::192.9.5.5",
                     "::FFFF:129.144.52.38", "2010:836B:4179::836B:4179"]:
            u = ElvinURI(f"elvin://[{host}]:80")
            self.assertEqual(u.host, host)
            self.assertEqual(u.port, 80)
            self.assertEqual(ElvinURI(str(u)), u)


class OptionTests(unittest.TestCase):

    def test_order_kept(self):
        u = ElvinURI("elvin://h;z=1;a=2;m=3")
        self.assertEqual(list(u.options.items()),
                         [("z", "1"), ("a", "2"), ("m", "3")])

    def test_value_optional(self):
        # options = *( ";" option_name [ "=" option_value ] ): a bare name
        # is an option without a value (None), not an empty value.
        self.assertEqual(ElvinURI("elvin://h;flag").options, {"flag": None})
        self.assertEqual(ElvinURI("elvin://h;flag=").options, {"flag": ""})
        self.assertNotEqual(ElvinURI("elvin://h;flag"),
                            ElvinURI("elvin://h;flag="))

    def test_bare_option_among_others(self):
        u = ElvinURI("elvin://host;flag;name=value")
        self.assertEqual(list(u.options.items()), [("flag", None), ("name", "value")])

    def test_bare_option_prints_bare_and_round_trips(self):
        u = ElvinURI("elvin://h;flag;empty=;x=1")
        self.assertEqual(str(u), "elvin:4.0/tcp,none,xdr/h:2917;flag;empty=;x=1")
        self.assertEqual(ElvinURI(str(u)).options, {"flag": None, "empty": "", "x": "1"})

    def test_bare_option_name_still_checked(self):
        for text in ["elvin://h;1flag", "elvin://h;fl ag", "elvin://h;flag;flag",
                     "elvin://h;flag;flag=", "elvin://h;;flag"]:
            with self.assertRaises(InvalidURIError, msg=text):
                ElvinURI(text)

    def test_unreserved_characters(self):
        u = ElvinURI("elvin://h;a-b_c.d!e~f*g'h(i)=x-_.!~*'()9")
        self.assertEqual(u.options, {"a-b_c.d!e~f*g'h(i)": "x-_.!~*'()9"})

    def test_percent_decoding(self):
        u = ElvinURI("elvin://h;name%20x=caf%C3%A9%3B%3d")
        self.assertEqual(u.options, {"name x": "café;="})
        self.assertEqual(ElvinURI(str(u)), u)

    def test_options_after_port(self):
        u = ElvinURI("elvin:4.0/tcp,none,xdr/host:2917;a=1;b=2")
        self.assertEqual(u.port, 2917)
        self.assertEqual(u.options, {"a": "1", "b": "2"})

    def test_options_copy(self):
        u = ElvinURI("elvin://h;a=1")
        u.options["a"] = "2"
        self.assertEqual(u.options, {"a": "1"})

    def test_option_order_ignored_in_equality(self):
        self.assertEqual(ElvinURI("elvin://h;a=1;b=2"),
                         ElvinURI("elvin://h;b=2;a=1"))
        self.assertNotEqual(ElvinURI("elvin://h;a=1"),
                            ElvinURI("elvin://h;a=2"))


class SchemeTests(unittest.TestCase):

    def test_case_insensitive(self):
        for scheme in ["ELVIN", "Elvin", "eLvIn"]:
            self.assertEqual(ElvinURI(f"{scheme}://host"),
                             ElvinURI("elvin://host"))


class ObjectTests(unittest.TestCase):

    def test_str_canonical(self):
        self.assertEqual(str(ElvinURI("elvin://host")),
                         "elvin:4.0/tcp,none,xdr/host:2917")
        self.assertEqual(str(ElvinURI("elvin:4//[::1]:7;b=2;a")),
                         "elvin:4.0/tcp,none,xdr/[::1]:7;b=2;a")
        self.assertEqual(str(ElvinURI("Elvin:4.2/secure/h;k=v")),
                         "elvin:4.2/ssl,none,xdr/h:2917;k=v")

    def test_str_escapes(self):
        u = ElvinURI("elvin://h;k=a%20b%25%E2%82%AC")
        self.assertEqual(u.options, {"k": "a b%\u20ac"})
        self.assertEqual(str(u), "elvin:4.0/tcp,none,xdr/h:2917;"
                                 "k=a%20b%25%E2%82%AC")

    def test_canonical_is_fixed_point(self):
        for text in ["elvin://h", "elvin:4.0/tcp,ssl,xdr/[::1]:1;a=b",
                     "elvin:/secure/x.y.;q", "elvin:7//h;a=%2F"]:
            canon = str(ElvinURI(text))
            self.assertEqual(str(ElvinURI(canon)), canon)
            self.assertEqual(ElvinURI(canon), ElvinURI(text))

    def test_repr(self):
        u = ElvinURI("elvin://host;a=b")
        self.assertEqual(repr(u), "ElvinURI('elvin:4.0/tcp,none,xdr/"
                                  "host:2917;a=b')")
        self.assertEqual(eval(repr(u), {"ElvinURI": ElvinURI}), u)

    def test_equality_and_hash(self):
        a = ElvinURI("elvin://host")
        b = ElvinURI("elvin:4.0/tcp,none,xdr/host:2917")
        self.assertEqual(a, b)
        self.assertEqual(hash(a), hash(b))
        self.assertEqual(len({a, b}), 1)
        self.assertFalse(a != b)
        for other in ["elvin://host:2918", "elvin://other", "elvin:4.1//host",
                      "elvin:/secure/host", "elvin://host;a=b"]:
            self.assertNotEqual(a, ElvinURI(other))
        self.assertNotEqual(a, "elvin://host")
        self.assertNotEqual(a, None)

    def test_immutable(self):
        u = ElvinURI("elvin://host")
        for name in ["host", "port", "version", "protocol", "options",
                     "_host", "new"]:
            self.assertRaises(AttributeError, setattr, u, name, 1)
        self.assertRaises(AttributeError, delattr, u, "_host")
        self.assertEqual(u.host, "host")

    def test_pickle_and_copy(self):
        u = ElvinURI("elvin:4.0/tcp,ssl,xdr/[::1]:9;a=%20")
        self.assertEqual(pickle.loads(pickle.dumps(u)), u)
        self.assertEqual(copy.copy(u), u)
        self.assertEqual(copy.deepcopy(u), u)


class RejectionTests(unittest.TestCase):
    """Every bad input raises InvalidURIError naming the URI and the fault."""

    def assertRejected(self, text, *fragments):
        e = self.assertRaises(InvalidURIError, ElvinURI, text)
        self.assertIsInstance(e, ValueError)
        self.assertEqual(e.uri, text)
        self.assertIn(echoed(text), str(e))          # whole, or cut when long
        self.assertLess(len(str(e)), 600)
        for fragment in fragments:
            self.assertIn(fragment, str(e))
        return e

    def test_error_class(self):
        self.assertTrue(issubclass(InvalidURIError, ValueError))

    def test_not_a_string(self):
        for value in [None, 42, b"elvin://host", ["elvin://host"]]:
            self.assertRaises(InvalidURIError, ElvinURI, value)

    def test_scheme(self):
        self.assertRejected("", "scheme")
        self.assertRejected("//host", "scheme")
        self.assertRejected("host:2917", "scheme")
        self.assertRejected("http://host", "wrong scheme", "http")
        self.assertRejected("elvinx://host", "wrong scheme")
        self.assertRejected(":/tcp,none,xdr/host", "wrong scheme")
        self.assertRejected(" elvin://host", "wrong scheme")

    def test_structure(self):
        self.assertRejected("elvin:", "'/'")
        self.assertRejected("elvin:4.0", "'/'")
        self.assertRejected("elvin:host", "'/'")
        self.assertRejected("elvin:/host", "'/'")
        self.assertRejected("elvin:4.0/tcp,none,xdr", "'/'")

    def test_missing_host(self):
        for text in ["elvin://", "elvin:4.0//", "elvin:/tcp,none,xdr/",
                     "elvin://:2917", "elvin://;a=b", "elvin://[]"]:
            self.assertRejected(text, "missing host")

    def test_bad_port(self):
        self.assertRejected("elvin://host:0", "port", "'0'")
        self.assertRejected("elvin://host:00000", "port")
        self.assertRejected("elvin://host:65536", "port", "65536")
        self.assertRejected("elvin://host:99999999", "port")
        self.assertRejected("elvin://host:" + "9" * 5000, "port")
        self.assertRejected("elvin://host:http", "port", "not a number")
        self.assertRejected("elvin://host:-1", "port")
        self.assertRejected("elvin://host:+1", "port")
        self.assertRejected("elvin://host:1.5", "port")
        self.assertRejected("elvin://host:", "port", "empty")
        self.assertRejected("elvin://host:29 17", "port")
        self.assertRejected("elvin://host:\u0661\u0662", "port")
        self.assertRejected("elvin://[::1]:0", "port")
        self.assertRejected("elvin://[::1]:", "port")
        self.assertRejected("elvin://[::1]:x", "port")

    def test_bad_version(self):
        for version in ["4.", ".0", "4.0.1", "x", "4.x", "v4", "-4", "4,0",
                        " 4.0", "\u0664.0", "9" * 5000]:
            self.assertRejected(f"elvin:{version}//host", "version")

    def test_version_parts_must_fit_a_protocol_version(self):
        # Versions travel as XDR int32: a part beyond 2**31 - 1 is refused,
        # saying which part, instead of being parsed into a huge number.
        self.assertRejected("elvin:123456789012345//host", "major", "does not fit")
        self.assertRejected("elvin:4.123456789012345//host", "minor", "does not fit")
        self.assertRejected("elvin:2147483648//host", "major", "0-2147483647")
        self.assertRejected("elvin:4.2147483648//host", "minor", "0-2147483647")
        self.assertEqual(ElvinURI("elvin:2147483647.2147483647//host").version,
                         (2**31 - 1, 2**31 - 1))
        self.assertEqual(ElvinURI("elvin:0000000000000004.0//host").version, (4, 0))
        with self.assertRaisesRegex(InvalidURIError, "major number .* does not fit"):
            EwafURI("ewaf:99999999999999999999//host")

    def test_port_must_fit(self):
        self.assertRejected("elvin://host:123456789012345", "port", "1-65535")
        self.assertRejected("elvin://host:65536", "port", "1-65535")
        self.assertRejected("elvin://host:" + "9" * 5000, "port", "1-65535")
        self.assertEqual(ElvinURI("elvin://host:0000065535").port, 65535)

    def test_bad_stack(self):
        self.assertRejected("elvin:/tcp/host", "alias", "'tcp'")
        self.assertRejected("elvin:/insecure/host", "alias")
        self.assertRejected("elvin:/ /host", "alias")
        self.assertRejected("elvin:/tcp,xdr/host", "exactly 3", "2")
        self.assertRejected("elvin:/tcp,none,xdr,zip/host", "exactly 3", "4")
        self.assertRejected("elvin:/tcp,,xdr/host", "empty module")
        self.assertRejected("elvin:/,none,xdr/host", "empty module")
        self.assertRejected("elvin:/tcp,none,/host", "empty module")
        self.assertRejected("elvin:/,,/host", "empty module")
        self.assertRejected("elvin:/1tcp,none,xdr/host", "module name")
        self.assertRejected("elvin:/tcp,no-ne,xdr/host", "module name")
        self.assertRejected("elvin:/tcp,none,x-/host", "module name")
        self.assertRejected("elvin:/tcp, none,xdr/host", "module name")
        self.assertRejected("elvin:/tcp,none,xdr%20/host", "module name")

    def test_ipv6(self):
        self.assertRejected("elvin://[::1", "unterminated")
        self.assertRejected("elvin://[::1:2917", "unterminated")
        self.assertRejected("elvin://::1", "bracket")
        self.assertRejected("elvin://::1:2917", "bracket")
        self.assertRejected("elvin://fe80::1", "bracket")
        self.assertRejected("elvin://[::1]2917", "after IPv6")
        self.assertRejected("elvin://[::1]x", "after IPv6")
        self.assertRejected("elvin://[::g]", "IPv6")
        self.assertRejected("elvin://[1.2.3.4]", "IPv6")
        self.assertRejected("elvin://[host]", "IPv6")
        self.assertRejected("elvin://[fe80::1%25eth0]", "IPv6")
        self.assertRejected("elvin://[::1]]", "after IPv6")
        self.assertRejected("elvin://host]", "host")
        self.assertRejected("elvin://ho[st", "host")

    def test_bad_host(self):
        for host in ["ho st", "-host", "host-", "a..b", ".host", "h$st",
                     "h%41", "h,st", "h[1]", "h]", "", "h?x", "h#x", "h@x",
                     "ho\u00e9t", "h\x00",
                     "user@host"]:
            self.assertRejected(f"elvin://{host}:2917", "host")

    def test_path(self):
        self.assertRejected("elvin://host/", "'/'")
        self.assertRejected("elvin://host:2917/path", "'/'")
        self.assertRejected("elvin:4.0/tcp,none,xdr/host/x;a=b", "'/'")

    def test_bad_options(self):
        self.assertRejected("elvin://h;", "option", "missing name")
        self.assertRejected("elvin://h;;a=b", "option", "missing name")
        self.assertRejected("elvin://h;a=b;", "option", "missing name")
        self.assertRejected("elvin://h;=v", "option", "missing name")
        self.assertRejected("elvin://h;1a=b", "option", "letter")
        self.assertRejected("elvin://h;_a=b", "option", "letter")
        self.assertRejected("elvin://h;%41=b", "option", "letter")
        self.assertRejected("elvin://h;a=b=c", "option")
        self.assertRejected("elvin://h;a=b c", "option")
        self.assertRejected("elvin://h;a b=c", "option")
        self.assertRejected("elvin://h;a=/", "option")
        self.assertRejected("elvin://h;a=caf\u00e9", "option")
        self.assertRejected("elvin://h;a=%", "option", "escape")
        self.assertRejected("elvin://h;a=%4", "option", "escape")
        self.assertRejected("elvin://h;a=%zz", "option", "escape")
        self.assertRejected("elvin://h;a=%FF", "option", "UTF-8")
        self.assertRejected("elvin://h;a%C3=1", "option", "UTF-8")

    def test_duplicate_option(self):
        self.assertRejected("elvin://h;a=1;a=2", "duplicate", "'a'")
        self.assertRejected("elvin://h;ab=1;a%62=2", "duplicate", "'ab'")


class VersionTests(unittest.TestCase):
    """A URI's version names the protocol the router at its endpoint
    speaks: any version parses, but another major version is refused
    where a URI is used, and a listener's must be the one spoken."""

    def test_the_versions_spoken_are_the_protocols(self):
        from elvin.core.router import PROTOCOL_MAJOR, PROTOCOL_MINOR
        from elvin.federation import packets as fed
        self.assertEqual(ElvinURI.DEFAULT_VERSION, (PROTOCOL_MAJOR, PROTOCOL_MINOR))
        self.assertEqual(EwafURI.DEFAULT_VERSION, (fed.PROTOCOL_MAJOR, fed.PROTOCOL_MINOR))

    def test_another_major_version_is_refused(self):
        for text, spoken in (("elvin:5.0//h:2917", "client protocol 4.0"),
                             ("elvin:3.9//h:2917", "client protocol 4.0"),
                             ("ewaf:2.0//h", "federation protocol 1.0")):
            for listening in (False, True):
                problem = urimod.version_problem(urimod.parse_ewaf(text) if text[0] == "e"
                                                 and text.startswith("ewaf") else
                                                 ElvinURI(text), listening)
                self.assertIn(f"protocol version {text.split(':')[1][:3]} is not "
                              f"supported (this implementation speaks the Elvin {spoken}",
                              problem)
        self.assertTrue(urimod.version_problem(ElvinURI("elvin:5.0//h")).startswith(
            "elvin:5.0/tcp,none,xdr/h:2917: "))      # it names the URI

    def test_a_later_minor_version_is_spoken_to_but_not_listened_on(self):
        for text in ("elvin:4.1//h", "ewaf:1.3//h"):
            uri = urimod.parse_ewaf(text) if text.startswith("ewaf") else ElvinURI(text)
            self.assertIsNone(urimod.version_problem(uri))
            self.assertIn("a listener's URI names the protocol version spoken there",
                          urimod.version_problem(uri, listening=True))
        for text in ("elvin://h", "elvin:4.0//h", "elvin:4//h", "ewaf://h", "ewaf:1.0//h"):
            uri = urimod.parse_ewaf(text) if text.startswith("ewaf") else ElvinURI(text)
            self.assertIsNone(urimod.version_problem(uri, listening=True))

    def test_every_user_of_a_uri_refuses_another_major_version(self):
        from elvin.endpoints import UnsupportedStackError, check_supported
        with self.assertRaisesRegex(UnsupportedStackError, "protocol version 5.0"):
            check_supported("elvin:5.0//h")
        with self.assertRaisesRegex(UnsupportedStackError, "a listener's URI"):
            check_supported("elvin:4.1//h", listening=True)
        self.assertEqual(check_supported("elvin:4.1//h").version, (4, 1))
        from elvin import aio, sync
        from elvin.clientcore.state import ConnectFailed
        with self.assertRaisesRegex(ConnectFailed, "elvin:5.0/tcp,none,xdr/127.0.0.1:9: "
                                                   "protocol version 5.0"):
            sync.notify("elvin:5.0//127.0.0.1:9", {"a": 1})
        with self.assertRaisesRegex(ConnectFailed, "protocol version 5.0"):
            import asyncio
            asyncio.run(aio.unotify("elvin:5.0/udp,none,xdr/127.0.0.1:9", {"a": 1}))


class EchoedTests(unittest.TestCase):
    """A bad value an error message echoes is cut to a readable length,
    with its whole size."""

    def test_short_values_are_echoed_whole(self):
        self.assertEqual(echoed("abc"), "'abc'")
        self.assertEqual(echoed("abc", quote=False), "abc")
        self.assertEqual(echoed("x" * 80), repr("x" * 80))

    def test_long_values_are_cut(self):
        self.assertEqual(echoed("x" * 81), repr("x" * 80) + "... (81 bytes)")
        self.assertEqual(echoed("é" * 100, quote=False), "é" * 80 + "... (200 bytes)")
        self.assertEqual(echoed(b"\0" * 1000), repr(b"\0" * 80) + "... (1000 bytes)")

    def test_a_megabyte_uri_makes_a_short_message(self):
        for text in ("elvin://" + "h" * 2**20 + ":1:2", "elvin:/" + "x" * 2**20 + "/h",
                     "elvin://h;o=" + "%" * 2**20, "elvin://h:" + "9" * 2**20,
                     "x" * 2**20):
            e = self.assertRaises(InvalidURIError, ElvinURI, text)
            self.assertLess(len(str(e)), 400, str(e)[:200])
            self.assertIn(f"... ({len(text)} bytes)", str(e))
        from elvin.uri import options_problem
        problem = options_problem(ElvinURI("elvin://h;frob=" + "v" * 2**20))
        self.assertLess(len(problem), 400)

    def test_a_host_name_past_what_a_resolver_takes(self):
        self.assertEqual(ElvinURI("elvin://" + "a" * 253).host, "a" * 253)
        e = self.assertRaises(InvalidURIError, ElvinURI, "elvin://" + "a" * 254 + ":2917")
        self.assertIn("a host name is at most 253 characters", str(e))
        self.assertEqual(ElvinURI("elvin://[::1]").host, "::1")


if given is not None:

    _label = st.from_regex(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,10}[A-Za-z0-9_])?",
                           fullmatch=True)
    _hostnames = st.lists(_label, min_size=1, max_size=4).map(".".join)
    _ipv6 = st.ip_addresses(v=6).map(str)
    _ipv4 = st.ip_addresses(v=4).map(str)
    _option_names = st.tuples(
        st.sampled_from("abcxyzABCXYZ"), st.text(max_size=8)
    ).map("".join)
    _options = st.dictionaries(_option_names, st.one_of(st.none(), st.text(max_size=12)),
                               max_size=5)
    _module = st.from_regex(r"(?:x-)?[a-z][a-z0-9]{0,5}", fullmatch=True)

    class PropertyTests(unittest.TestCase):
        """Generated round trips: fields -> canonical text -> equal fields."""

        @settings(max_examples=300, deadline=None)
        @given(host=st.one_of(_hostnames, _ipv4, _ipv6),
               port=st.integers(1, 65535),
               version=st.tuples(st.integers(0, 99), st.integers(0, 99)),
               stack=st.tuples(_module, _module, _module),
               options=_options)
        def test_round_trip(self, host, port, version, stack, options):
            shown = f"[{host}]" if ":" in host else host
            text = (f"elvin:{version[0]}.{version[1]}/{','.join(stack)}/"
                    f"{shown}:{port}" + "".join(
                        f";{urimod._quote(k)}" if v is None
                        else f";{urimod._quote(k)}={urimod._quote(v)}"
                        for k, v in options.items()))
            u = ElvinURI(text)
            self.assertEqual(u.host, host)
            self.assertEqual(u.port, port)
            self.assertEqual(u.version, version)
            self.assertEqual(u.protocol, stack)
            self.assertEqual(u.options, options)
            self.assertEqual(list(u.options), list(options))
            again = ElvinURI(str(u))
            self.assertEqual(again, u)
            self.assertEqual(hash(again), hash(u))
            self.assertEqual(str(again), str(u))

        @settings(max_examples=500, deadline=None)
        @given(st.text(alphabet=st.sampled_from(
            "elvinELVIN:/;=,.[]%0129abfxz-_ \u00e9"), max_size=40))
        def test_arbitrary_text(self, text):
            # Either a valid URI whose canonical form is stable, or
            # InvalidURIError -- never any other exception.
            try:
                u = ElvinURI(text)
            except InvalidURIError as e:
                self.assertIn(repr(text), str(e))
            else:
                self.assertEqual(ElvinURI(str(u)), u)

        @settings(max_examples=300, deadline=None)
        @given(st.text(max_size=30))
        def test_arbitrary_suffix(self, tail):
            try:
                u = ElvinURI("elvin:" + tail)
            except InvalidURIError:
                pass
            else:
                self.assertEqual(ElvinURI(str(u)), u)
