"""elvin-config-example: print the commented example router configuration.

    elvin-config-example > elvind.conf && twistd -n elvin -c elvind.conf

The same text as conf/elvind.conf in the source tree, shipped inside the
package so that ``pip install .`` has it too.
"""

import sys
from importlib import resources


def example_text():
    """The example configuration file, as text."""
    return resources.files("elvin.data").joinpath("elvind.conf").read_text("utf-8")


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if args in (["--help"], ["-h"]):
        print(__doc__.strip())
        return
    if args == ["--version"]:
        from elvin import __version__
        print(f"elvin-config-example (elvin) {__version__}")
        return
    if args:
        sys.stderr.write(f"elvin-config-example: error: takes no arguments but --help or "
                         f"--version, not {args[0]!r}\n")
        sys.exit(2)
    try:
        sys.stdout.write(example_text())
        sys.stdout.flush()
    except BrokenPipeError:
        pass


if __name__ == "__main__":
    main()
