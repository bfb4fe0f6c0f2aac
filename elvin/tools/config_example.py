"""elvin-config-example: print the commented example router configuration.

    elvin-config-example > elvind.conf && twistd -n elvin -c elvind.conf

The same text as conf/elvind.conf in the source tree, shipped inside the
package so that ``pip install .`` has it too.
"""

import sys
from importlib import resources

from elvin.tools.output import StdoutClosed, StdoutFailed, print_and_exit, write


def example_text():
    """The example configuration file, as text."""
    return resources.files("elvin.data").joinpath("elvind.conf").read_text("utf-8")


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if args in (["--help"], ["-h"]):
        print_and_exit(__doc__.strip(), "elvin-config-example")
    if args == ["--version"]:
        from elvin import __version__
        print_and_exit(f"elvin-config-example (elvin) {__version__}", "elvin-config-example")
    if args:
        sys.stderr.write(f"elvin-config-example: error: takes no arguments but --help or "
                         f"--version, not {args[0]!r}\n")
        sys.exit(2)
    try:
        write(example_text())
    except StdoutClosed:
        pass
    except StdoutFailed as e:
        sys.stderr.write(f"elvin-config-example: error: {e}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
