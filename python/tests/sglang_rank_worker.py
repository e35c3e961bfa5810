"""One SGLang TP rank as a process: its own backend (in-process mode, SSD
directory per rank), built as SGLang's factory builds it; stores and loads
pages and checks every byte. argv: tp_rank tp_size ssd_base out_file
[socket]. With socket, node server mode instead: the rank attaches to that
`kvtier serve` (tiny geometry at tp_size, 4-token pages). Writes "ok", the
namespace and the SSD directory, one per line."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _util  # noqa: E402,F401  (puts python/ on the path)
import numpy as np  # noqa: E402

import _sglang_fakes as fakes  # noqa: E402


def main():
    rank, size, ssd, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    sock = sys.argv[5] if len(sys.argv) > 5 else None
    if sock:
        # The tiny preset's rank share: 4 layers, 2 / tp_size heads of 64 dims.
        pool = fakes.FakeHostPool("page_first", seed=100 + rank, pages=32, layers=4,
                                  heads=2 // size, head_dim=64)
        extra = {"socket": sock, "timeout": 10}
    else:
        pool = fakes.FakeHostPool("page_first", seed=100 + rank, pages=32)
        extra = {"cpu_capacity": "8MiB", "ssd_dir": ssd, "ssd_capacity": "4MiB",
                 "kvtier_options": {"huge_pages": False}}
    cfg = fakes.storage_config(tp_rank=rank, tp_size=size, layout="page_first", extra=extra)
    b = fakes.create_backend(cfg, pool)
    try:
        # The same page hashes on every rank (SGLang hashes tokens alone);
        # each rank holds its own heads, so its own namespace.
        keys = ["page-%d" % i for i in range(8)]
        assert b.batch_set_v1(keys, pool.host_indices(range(8))) == [True] * 8
        assert b.batch_exists(keys) == 8
        dst = list(range(20, 28))
        for p in dst:
            pool.set_page_bytes(p, 0)
        assert b.batch_get_v1(keys, pool.host_indices(dst)) == [True] * 8
        for s, d in zip(range(8), dst):
            a, c = pool.page_bytes(d), pool.page_bytes(s)
            assert all(np.array_equal(a[k], c[k]) for k in a), "rank %d page %d" % (rank, d)
        with open(out, "w") as f:
            f.write("ok\n%s\n%s\n" % (b.namespace, b.ssd_dir))
    finally:
        b.close()


if __name__ == "__main__":
    main()
