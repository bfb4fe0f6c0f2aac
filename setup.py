"""Packaging for elvin, a content-based message router speaking Elvin 4.0."""

from setuptools import Extension, setup

setup(
    # Metadata, dependencies, extras and scripts: pyproject.toml.
    packages=[
        "elvin",
        "elvin.core",
        "elvin.client",
        "elvin.clientcore",
        "elvin.subscription",
        "elvin.protocols",
        "elvin.federation",
        "elvin.discovery",
        "elvin.proxy",
        "elvin.ops",
        "elvin.tools",
        "elvin.data",
        "spark_analysis",
        "twisted.plugins",
    ],
    # A flat layout declared as such: `pip install -e .` then puts the
    # checkout on sys.path (a static .pth) rather than an import finder,
    # so Twisted's plugin scan finds twisted/plugins/elvin_plugin.py and
    # `twistd elvin` works after an editable install as after a normal one.
    package_dir={"": "."},
    # The optional compiled NameValue decoder (docs/performance.md): a
    # top-level module, so a test run from the checkout finds it once
    # `pip install .` has built it. optional=True: without a C compiler the
    # install still succeeds and the pure-Python codec is used.
    ext_modules=[Extension("_elvin_xdr", ["elvin/protocols/_elvin_xdr.c"], optional=True)],
    package_data={"twisted": ["plugins/elvin_plugin.py", "plugins/elvin_proxy_plugin.py"], "elvin.data": ["elvind.conf", "elvin-proxy.conf"],
                  "elvin.federation": ["trace_schema.json"],
                  "spark_analysis": ["log4j2-quiet.properties"],
                  "elvin": ["py.typed"]},
)
