"""docs/engines.md's key tables are the plugins' keys: every key the SGLang
backend's extra_config table or the vLLM connector's
kv_connector_extra_config table lists is one that plugin accepts, and every
key it accepts is listed. (The SGLang table once listed vLLM's lookup_batch,
which the backend refuses as unknown.)"""
import os
import re
import unittest

from _util import skip_if_unloadable

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "engines.md")


def table_keys(heading):
    """The backticked names in the first column of the table under heading."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    at = text.index(heading + "\n")
    keys, in_table = set(), False
    for line in text[at:].splitlines()[1:]:
        if line.startswith("|"):
            in_table = True
            first = line.split("|")[1]
            keys.update(re.findall(r"`([a-z_0-9]+)`", first))
        elif in_table:
            break
    return keys


def setUpModule():
    skip_if_unloadable()
    global sglang_hicache, vllm_connector
    from kvtier import sglang_hicache, vllm_connector


class DocKeys(unittest.TestCase):
    def test_sglang_table_is_the_backends_keys(self):
        doc = table_keys("### extra_config keys")
        accepted = set(sglang_hicache.SGLANG_KEYS) | set(sglang_hicache.KVTIER_KEYS)
        self.assertGreater(len(doc), 5, doc)
        self.assertEqual(doc - accepted, set(), "documented but refused by the backend")
        # tp_lcm_size is SGLang's own, set by SGLang, never by a user
        self.assertEqual(accepted - doc - {"tp_lcm_size"}, set(), "accepted but undocumented")

    def test_vllm_table_is_the_connectors_keys(self):
        doc = table_keys("### kv_connector_extra_config keys")
        accepted = set(vllm_connector.EXTRA_KEYS)
        self.assertGreater(len(doc), 5, doc)
        self.assertEqual(doc - accepted, set(), "documented but refused by the connector")
        self.assertEqual(accepted - doc, set(), "accepted but undocumented")


if __name__ == "__main__":
    unittest.main()
