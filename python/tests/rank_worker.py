"""One rank as its own process over TCP on 127.0.0.1 (run by
test_connector_tcp). argv: scenario rank ranks port. Rank 0 binds port 0
and prints "PORT <n>"; every rank prints "RESULT <json>" or "ERROR <text>"."""
import json
import sys
import traceback

import _util  # noqa: F401  (sys.path)


def main():
    name, rank, ranks, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    import kvtier
    import scenarios
    try:
        with kvtier.EmulatedRank(rank, pp=2, tp=ranks // 2, transport=("tcp", "127.0.0.1", port),
                                 timeout=1.0) as r:
            if rank == 0:
                print("PORT %d" % r.net.port, flush=True)
            r.join(10.0)
            out = scenarios.run_rank(r, name)
        print("RESULT " + json.dumps(out), flush=True)
    except BaseException:
        print("ERROR " + json.dumps(traceback.format_exc()), flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
