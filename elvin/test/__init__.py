"""The test suite.

Every temporary file or folder a test makes lands in one folder per test
process, removed when the process exits: a test that forgets its own
clean-up (or shares a run between tests, as the Spark tests do), or a
program a test starts and kills (a browser, a watcher and its chart
worker's forkserver), leaves nothing behind in the machine's temporary
folder. Programs a test starts find the folder in ``TMPDIR``.
"""

import atexit
import os
import shutil
import tempfile

tempfile.tempdir = tempfile.mkdtemp(prefix="elvin-tests-")
os.environ["TMPDIR"] = tempfile.tempdir
atexit.register(shutil.rmtree, tempfile.tempdir, True)
