"""Packaging for elvin, a content-based message router speaking Elvin 4.0."""

from setuptools import Extension, setup

setup(
    name="elvin",
    version="0.1.0",
    description="Elvin 4.0 content-based message router, client library and tools",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=[
        "elvin",
        "elvin.core",
        "elvin.client",
        "elvin.subscription",
        "elvin.protocols",
        "elvin.federation",
        "elvin.discovery",
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
    package_data={"twisted": ["plugins/elvin_plugin.py"], "elvin.data": ["elvind.conf"]},
    install_requires=[
        "twisted>=23.10",
        "pyopenssl>=23.0",
        "service-identity>=23.1",
        "ply>=3.11",
        "zeroconf>=0.131",
        "google-re2>=1.1",
    ],
    extras_require={
        "test": ["hypothesis>=6.90", "trustme>=1.1",
                 "pyspark>=3.5", "matplotlib>=3.8", "jsonschema>=4.18"],
        "spark": ["pyspark>=3.5", "matplotlib>=3.8"],
    },
    entry_points={
        "console_scripts": [
            "elvin-notify = elvin.tools.notify:main",
            "elvin-subscribe = elvin.tools.subscribe:main",
            "elvin-quench = elvin.tools.quench:main",
            "elvin-discover = elvin.tools.discover:main",
            "elvin-config-example = elvin.tools.config_example:main",
        ],
    },
    classifiers=[
        "Framework :: Twisted",
        "Programming Language :: Python :: 3.11",
        "Topic :: System :: Networking",
    ],
)
