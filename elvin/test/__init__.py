"""The test suite.

Every temporary file or folder a test makes lands in one folder per test
process, removed when the process exits: a test that forgets its own
clean-up (or shares a run between tests, as the Spark tests do), or a
program a test starts and kills (a browser, a watcher and its chart
worker's forkserver), leaves nothing behind in the machine's temporary
folder. Programs a test starts find the folder in ``TMPDIR``.

Hypothesis's settings for the whole suite are here, in one place: no
deadline and no "too slow" health check, since the machine may be loaded
and a property test must not fail on wall-clock speed (a test sets only
how many examples it wants).
"""

import atexit
import os
import shutil
import tempfile

tempfile.tempdir = tempfile.mkdtemp(prefix="elvin-tests-")
os.environ["TMPDIR"] = tempfile.tempdir
atexit.register(shutil.rmtree, tempfile.tempdir, True)

try:
    from hypothesis import HealthCheck, settings
except ImportError:           # the test extras are not installed
    pass
else:
    settings.register_profile("elvin", deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("elvin")
