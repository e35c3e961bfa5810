"""Test support: imports kvtier from this checkout, and skips (with the
reason printed) when the library cannot be loaded into this interpreter,
e.g. an ASan build without the sanitizer runtime preloaded."""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # python/

SKIP_REASON = None
if os.environ.get("KVTIER_SANITIZE") and not os.environ.get("LD_PRELOAD"):
    SKIP_REASON = ("sanitizer build (KVT_SANITIZE=%s): an instrumented libkvtier.so cannot be "
                   "loaded into /usr/bin/python3 without preloading the sanitizer runtime; "
                   "the plain build runs these tests" % os.environ["KVTIER_SANITIZE"])
else:
    try:
        import kvtier  # noqa: F401
    except ImportError as e:
        if "sanitizer build" in str(e):
            SKIP_REASON = str(e)
        else:
            raise


def skip_if_unloadable():
    """Call from setUpModule: raises SkipTest with the reason, printed once."""
    if SKIP_REASON:
        if not getattr(skip_if_unloadable, "printed", False):
            sys.stderr.write("kvtier python tests skipped: %s\n" % SKIP_REASON)
            skip_if_unloadable.printed = True
        raise unittest.SkipTest(SKIP_REASON)


def quiet_pd_logs():
    """Sets KVTIER_PD_QUIET=1 (the library then does not log link events,
    refusals and aborts to stderr) and returns a function that restores
    what was there."""
    before = os.environ.get("KVTIER_PD_QUIET")
    os.environ["KVTIER_PD_QUIET"] = "1"

    def restore():
        if before is None:
            os.environ.pop("KVTIER_PD_QUIET", None)
        else:
            os.environ["KVTIER_PD_QUIET"] = before

    return restore
