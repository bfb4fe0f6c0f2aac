"""elvin-config-example: print the commented example router configuration.

    elvin-config-example > elvind.conf && twistd -n elvin -c elvind.conf

The same text as conf/elvind.conf in the source tree, shipped inside the
package so that ``pip install .`` has it too.
"""

import sys
from importlib import resources

from elvin.tools.output import output_guard, write


def example_text():
    """The example configuration file, as text."""
    return resources.files("elvin.data").joinpath("elvind.conf").read_text("utf-8")


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if args in (["--help"], ["-h"]):
        return _show(__doc__.strip() + "\n")
    if args == ["--version"]:
        from elvin import __version__
        return _show(f"elvin-config-example (elvin) {__version__}\n")
    if args:
        sys.stderr.write(f"elvin-config-example: error: takes no arguments but --help or "
                         f"--version, not {args[0]!r}\n")
        sys.exit(2)
    return _show(example_text())


def _show(text):
    """Print ``text``; a closed stdout is no error, a failing one (a full
    disk) is one line and exit 1."""
    with output_guard("elvin-config-example"):
        write(text)


if __name__ == "__main__":
    main()
