/* step.pml - a Promela model of the rank group's step protocol
 * (docs/protocol.md; src/group/group.c, handshake.c; src/connector/step.c),
 * checked with spin by tests/model_check.sh (ctest: model_step_protocol).
 *
 * Modelled: the sync leader (rank 0) and two members; per epoch the
 * handshake (HELLO -> WELCOME/REFUSE), K steps of UP -> decide -> DOWN ->
 * apply -> ACK -> leader applies, the abort (ABORT relayed by the leader,
 * FIFO behind earlier frames on the same link), and one reform (epoch + 1,
 * stale frames dropped by epoch). Faults, each within a budget so the state
 * space stays finite: message loss, message duplication (a duplicated HELLO
 * is a duplicated reform's), a deadline that fires early (a stalled peer:
 * the wait gives up although the message will still come), and rank 2
 * crashing at any point. Delay is the interleaving itself.
 *
 * Abstracted away: the payloads (a step's decision is one bit, chosen by the
 * leader), sequence numbers, checksums and corruption (any frame the
 * receiver did not expect ends the epoch, which is what a bad seq, op,
 * channel or checksum does), the connector's records, timing (a deadline is
 * either "nothing else can happen" - Promela's timeout - or an early firing
 * from the budget), the transports (one FIFO channel per direction and
 * member), more than two members, a step-number skew (the leader
 * compares numbers exactly; here a skipped step is a lost UP), and the
 * formation's second phase and agreed epochs: the handshake here is one
 * phase with the epoch fixed, and docs/model/formation.pml models the real
 * one (HELLO, WELCOME, JOIN, FORMED, GIVEUP, attempt ids, the largest
 * proposal agreed).
 *
 * Checked: safety - (S1) every rank that applied step k of an epoch applied
 * the same decision; (S2) the leader applies a step only after every member
 * applied it; (S3) once a rank ended an epoch at step k without applying it,
 * no rank applies a later step of that epoch, so ranks' applied sequences
 * differ by at most the one step whose abort raced its DOWN, and that step
 * is never applied by the leader. Bounded liveness - every wait ends (no
 * invalid end state: no deadlock), every rank ends each epoch by applying
 * all K steps or by aborting, and a run without faults applies every step
 * of both epochs on every rank.
 *
 * -DSEEDED_BUG gives the leader the old order (apply right after sending
 * DOWN, no ACK): spin must then find a violation of S2. */

#define M 2  /* members: ranks 1..M; rank 0 is the sync leader */
#define K 2  /* steps per epoch */
#define E 2  /* epochs: the first and one reform */
#define CAP 3

mtype = { HELLO, WELCOME, REFUSE, UP, DOWN, ACK, ABORT };

chan toL[M + 1] = [CAP] of { mtype, byte, byte, byte }; /* op, epoch, step, decision */
chan toM[M + 1] = [CAP] of { mtype, byte, byte, byte };

#define IDX(r, e, k) (((r) * (E + 1) + (e)) * (K + 1) + (k))
byte applied[(M + 1) * (E + 1) * (K + 1)]; /* 0: not applied; else decision + 1 */
byte ended[(M + 1) * (E + 1)];              /* step at which rank r ended epoch e unapplied */
byte completed[(M + 1) * (E + 1)];          /* steps applied by rank r in epoch e */
bool crashed;
/* Fault budgets. While an early deadline is in the budget, Promela's
 * timeout is never taken (the early firing is always possible instead), so
 * a run that needs a real deadline counts as faulted: -DNO_FAULTS checks
 * the fault-free runs on their own (tests/model_check.sh runs both). */
#ifdef NO_FAULTS
byte loss = 0, dups = 0, early = 0, crash = 0;
#else
byte loss = 1, dups = 1, early = 1, crash = 1;
#endif
bool faulted;                                  /* any fault happened */

/* A send that may be lost or duplicated. A full queue (a peer that stopped
 * reading) makes it give up at its deadline; what the sender then does is
 * what it does when the frame is lost, as in the code (a failed send of a
 * step frame aborts; of ABORT or a verdict, is best effort). */
inline send(ch, op, e, k, d)
{
    if
    :: nfull(ch) -> ch!op, e, k, d
    :: full(ch) -> skip
    :: atomic { loss > 0 -> loss--; faulted = true }
    :: atomic {
           dups > 0 && len(ch) < CAP - 1 -> dups--; faulted = true; ch!op, e, k, d; ch!op, e, k, d
       }
    fi
}

/* The next frame of epoch >= e (older ones are dropped), or a deadline:
 * got is false when the wait gave up. */
inline recv(ch, e, op, re, rk, rd, got)
{
    got = false;
    do
    :: ch?op, re, rk, rd ->
        if
        :: re < e -> skip
        :: else -> got = true; break
        fi
    :: timeout -> break
    :: atomic { early > 0 -> early--; faulted = true }; break
    od
}

/* S1 and S3 at the moment rank r applies (e, k, d); S2 is the leader's. */
hidden byte q; /* apply's loop index: global, so apply is one d_step */

inline apply(r, e, k, d)
{
    d_step {
        for (q : 0 .. M) {
            assert(applied[IDX(q, e, k)] == 0 || applied[IDX(q, e, k)] == d + 1);
            assert(ended[q * (E + 1) + e] == 0 || ended[q * (E + 1) + e] >= k)
        }
        applied[IDX(r, e, k)] = d + 1;
        completed[r * (E + 1) + e]++;
        q = 0
    }
}

proctype Member(byte me)
{
    byte e = 1, k, op, re, rk, rd;
    bool got;
epoch:
    send(toL[me], HELLO, e, 0, 0);
    recv(toM[me], e, op, re, rk, rd, got);
    if
    :: got && op == WELCOME && re == e -> skip
    :: else -> ended[me * (E + 1) + e] = 1; goto next
    fi;
    k = 1;
    do
    :: k > K -> break
    :: k <= K ->
        if
        :: me == M && crash > 0 -> crash--; crashed = true; faulted = true; goto dead
        :: true -> skip
        fi;
        send(toL[me], UP, e, k, 0);
        recv(toM[me], e, op, re, rk, rd, got);
        if
        :: got && op == DOWN && re == e && rk == k ->
            apply(me, e, k, rd);
            send(toL[me], ACK, e, k, 0);
            k++
        :: else ->
            /* a deadline, the leader's ABORT or an unexpected frame */
            ended[me * (E + 1) + e] = k;
            if
            :: got && op == ABORT -> skip
            :: else -> send(toL[me], ABORT, e, k, 0)
            fi;
            break
        fi
    od;
next:
    if
    :: e < E -> e++; goto epoch
    :: else -> skip
    fi;
dead:
    skip
}

/* One frame from every member; ok stays true only if each is (op, e, k). */
inline gather(want, e, k, ok)
{
    for (m : 1 .. M) {
        recv(toL[m], e, op, re, rk, rd, got);
        ok = ok && got && op == want && re == e && rk == k
    }
}

inline abort_all(e)
{
    for (m : 1 .. M) { send(toM[m], ABORT, e, k, 0) }
}

proctype Leader()
{
    byte e = 1, k, m, op, re, rk, rd, d;
    bool got, ok;
epoch:
    ok = true;
    gather(HELLO, e, 0, ok);
    for (m : 1 .. M) {
        if
        :: ok -> send(toM[m], WELCOME, e, 0, 0)
        :: else -> send(toM[m], REFUSE, e, 0, 0)
        fi
    }
    if
    :: !ok -> ended[e] = 1; goto next
    :: else -> skip
    fi;
    k = 1;
    do
    :: k > K -> break
    :: k <= K ->
        ok = true;
        gather(UP, e, k, ok);
        if
        :: !ok -> ended[e] = k; abort_all(e); break
        :: else -> skip
        fi;
        d = (e + k) % 2; /* the decision: any value; it differs step to step */
        for (m : 1 .. M) { send(toM[m], DOWN, e, k, d) }
#ifdef SEEDED_BUG
        apply(0, e, k, d);
#endif
        gather(ACK, e, k, ok);
        if
        :: !ok -> ended[e] = k; abort_all(e); break
        :: else -> skip
        fi;
#ifndef SEEDED_BUG
        /* S2: every member applied this step before the leader does */
        for (m : 1 .. M) { assert(applied[IDX(m, e, k)] == d + 1) }
        apply(0, e, k, d);
#endif
        k++
    od;
next:
    if
    :: e < E -> e++; goto epoch
    :: else -> skip
    fi
}

init {
    byte r, e;
    atomic {
        run Leader();
        for (r : 1 .. M) { run Member(r) }
    }
    (_nr_pr == 1); /* every rank ended: no wait lasts forever */
#ifdef SEEDED_BUG
    /* the old order lets the leader apply a step no member applied */
    for (e : 1 .. E) {
        for (r : 1 .. K) {
            assert(applied[IDX(0, e, r)] == 0 || applied[IDX(1, e, r)] != 0)
        }
    }
#endif
    for (e : 1 .. E) {
        for (r : 0 .. M) {
            /* each epoch ended on each live rank: all K steps or an abort */
            assert(completed[r * (E + 1) + e] == K || ended[r * (E + 1) + e] != 0 ||
                   (r == M && crashed));
            assert(faulted || completed[r * (E + 1) + e] == K)
        }
    }
}
