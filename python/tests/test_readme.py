"""README.md's Python examples run as a reader would paste them: every
```python block, in order, in one namespace (the second uses the first's
imports), from the repository root. A block that stops working fails here
with its first line, not in a user's session."""
import os
import re
import unittest

from _util import skip_if_unloadable

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def setUpModule():
    skip_if_unloadable()


def blocks(path):
    with open(path, encoding="utf-8") as f:
        return re.findall(r"^```python\n(.*?)^```$", f.read(), flags=re.S | re.M)


class Readme(unittest.TestCase):
    def test_every_python_block_runs(self):
        found = blocks(os.path.join(ROOT, "README.md"))
        self.assertGreaterEqual(len(found), 2, "README.md's python blocks are gone")
        ns = {"__name__": "readme"}
        cwd = os.getcwd()
        os.chdir(ROOT)
        try:
            for code in found:
                with self.subTest(block=code.splitlines()[0]):
                    exec(compile(code, "README.md", "exec"), ns)
        finally:
            os.chdir(cwd)


if __name__ == "__main__":
    unittest.main()
