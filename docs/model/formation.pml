/* formation.pml - a Promela model of the rank group's two-phase formation
 * with leader-agreed epochs (docs/protocol.md, "Formation"; the code:
 * src/group/handshake.c lead/take_hello/take_join and join/await/give_up,
 * kvt_group_reform in src/group/group_api.c, the stale-frame rule of
 * kvt__group_recv in src/group/group.c), checked with spin by
 * tests/model_check.sh (ctest: model_formation_protocol). step.pml models
 * the steps that follow; this model ends with the first step, which is
 * where a split formation would show.
 *
 * Modelled: the sync leader (rank 0) and two members reform after epoch 1
 * (each proposes its last formed epoch + 1 = 2). Per attempt a member sends
 * HELLO (a fresh attempt id and its proposal), waits for WELCOME, answers
 * JOIN and waits for FORMED; on a deadline it sends GIVEUP. The leader reads
 * every HELLO (dropping JOINs and GIVEUPs of attempts that are over), agrees
 * on the largest proposal, WELCOMEs every member, reads every JOIN (a GIVEUP
 * of the welcomed attempt followed by a fresh HELLO is welcomed again to the
 * same epoch) and then sends FORMED to all, or REFUSE to all. Repeats
 * (duplicated frames) are dropped where the code drops them: the leader
 * drops a HELLO of the attempt it last took from that member
 * (g->hello_att), a member a WELCOME of its attempt while it waits for
 * FORMED. (Both rules were added when this model's first counterexamples
 * showed a duplicated frame splitting a formation; test_conc_group's
 * test_duplicated_handshake_frame and test_repeated_hello_across_reforms
 * replay them in C.) A failed
 * reform is retried once by every rank (the engine calls kvt_conn_reform
 * again: the same reform, duplicated). Rank 2 starts in one of three ways,
 * chosen by spin: like the others; after one extra reform attempt of its
 * own that failed (its HELLO and GIVEUP wait in the leader's queue, as in
 * test_conc_protocol's drift case); or as a replacement process that knows
 * no epoch (it proposes 1, as kvt_group_create with params epoch 0 does).
 * After forming, each rank makes one step: a member sends UP and waits for
 * DOWN; the leader gathers the UPs and decides (a HELLO met there ends the
 * epoch, as the stash in kvt__group_recv does; frames of an older epoch are
 * dropped). Faults, each within a budget: message loss, message
 * duplication, a deadline that fires early (a stall: the wait gives up
 * although the frame will still come), and rank 2 dying before any of its
 * sends. Delay is the interleaving itself.
 *
 * Abstracted away: the HELLO's other fields (geometry, config digest, role
 * table: a mismatch is a REFUSE, which the model has), attempt ids (small
 * counters here; a replacement's start elsewhere, as a fresh process's
 * clock-based ids do), the notes' text, sequence numbers (handshake frames
 * all have seq 0), the connector, timing (a deadline is Promela's timeout
 * - nothing else can happen - or an early firing from the budget), the
 * transports and their reconnects (one FIFO channel per direction and
 * member; a TCP link cut in the handshake is the dying-hub test's), the
 * rest of the epoch (step.pml), more than two members, and a leader whose
 * reconnect failed (it answers with REFUSE: a refusal, which is modelled).
 *
 * Checked: (F1) agreement - every rank that forms, forms the same epoch;
 * (F2) no rank proceeds with a split - the leader decides step 1 only if
 * every member formed its epoch, and a member applies it only then; (F3)
 * all or none - a rank is left unformed while the leader formed only
 * through the one window docs/protocol.md states (that member's wait for
 * FORMED ended by a deadline or a lost FORMED) or because it died; (F4)
 * no drift - the agreed epoch is always 2, the largest epoch formed
 * before + 1, whatever failed before (the extra attempt, a retried
 * reform) and though the replacement proposes 1, which it then learns. Bounded liveness: every wait ends (no
 * invalid end state), and a run without faults forms epoch 2 on every rank
 * at the first attempt and every rank applies step 1.
 *
 * Seeded bugs, each of which spin must find (tests/model_check.sh):
 *  -DBUG_ONE_PHASE   the leader counts itself formed when it WELCOMEs, as
 *                    before the two phases (members form on WELCOME): F3;
 *  -DBUG_LOCAL_EPOCH a member forms with its own proposal, not the agreed
 *                    epoch (the replacement stays at 1): F1/F2;
 *  -DBUG_DRIFT       a failed attempt bumps the rank's epoch (as every
 *                    reform call once did): F4;
 *  -DBUG_NO_REHELLO  the leader does not welcome a fresh HELLO after a
 *                    GIVEUP (it refuses): the retried reform after rank 2's
 *                    extra attempt never converges: liveness. */

#define M 2     /* members: ranks 1..M; rank 0 is the sync leader */
#define TRIES 2 /* a failed reform is retried once */
#define CAP 4

mtype = { HELLO, WELCOME, JOIN, FORMED, REFUSE, GIVEUP, UP, DOWN };

/* op, header epoch (the sender's proposal on handshake frames), attempt id,
 * payload epoch (HELLO: proposal; WELCOME/FORMED: the agreed one) */
chan toL[M + 1] = [CAP] of { mtype, byte, byte, byte };
chan toM[M + 1] = [CAP] of { mtype, byte, byte, byte };

byte formed[M + 1];   /* the epoch rank r formed; 0: none */
bool window[M + 1];   /* member r's wait for FORMED ended without it */
bool applied[M + 1];  /* rank r applied step 1 */
byte scenario;        /* rank 2: 0 like the others, 1 after an extra failed attempt, 2 a replacement */
/* Fault budgets. While an early deadline is in the budget, Promela's
 * timeout (nothing else can happen) is never taken - the early firing is
 * always possible instead - so every run that needs a real deadline counts
 * as faulted. -DNO_FAULTS therefore checks the fault-free runs, with real
 * deadlines, on their own (tests/model_check.sh runs both). */
#ifdef NO_FAULTS
byte loss = 0, dups = 0, early = 0, crash = 0;
#else
byte loss = 1, dups = 1, early = 1, crash = 1;
#endif
bool crashed;         /* rank 2 stopped (a process that died) */
bool faulted;
bool started;         /* init has placed rank 2's leftovers */
byte lead_tries;      /* the leader's attempt that formed */

inline send(ch, op, he, a, pe)
{
    if
    :: nfull(ch) -> ch!op, he, a, pe
    :: full(ch) -> skip /* its deadline passed: the frame is not sent */
    :: atomic { loss > 0 -> loss--; faulted = true }
    :: atomic {
           dups > 0 && len(ch) < CAP - 1 -> dups--; faulted = true; ch!op, he, a, pe; ch!op, he, a, pe
       }
    fi
}

/* hs_recv: the next handshake frame (step frames left over are dropped),
 * or a deadline (got false). */
inline hs_recv(ch, op, he, a, pe, got)
{
    got = false;
    do
    :: ch?op, he, a, pe ->
        if
        :: op == UP || op == DOWN -> skip
        :: else -> got = true; break
        fi
    :: timeout -> break
    :: atomic { early > 0 -> early--; faulted = true }; break
    od
}

/* kvt__group_recv in a formed epoch e: frames of older epochs are dropped;
 * anything else comes back (got false: the deadline). */
inline step_recv(ch, e, op, he, a, pe, got)
{
    got = false;
    do
    :: ch?op, he, a, pe ->
        if
        :: he < e && op != HELLO -> skip
        :: else -> got = true; break
        fi
    :: timeout -> break
    :: atomic { early > 0 -> early--; faulted = true }; break
    od
}

/* Rank 2 may die here (once): it stops without a word. */
inline maybe_crash(me)
{
    if
    :: me == M && crash > 0 -> crash--; crashed = true; faulted = true; goto done
    :: true -> skip
    fi
}

/* F1 when rank r forms epoch e. */
inline form(r, e)
{
    d_step {
        assert(formed[0] == 0 || formed[0] == e);
        assert(formed[1] == 0 || formed[1] == e);
        assert(formed[2] == 0 || formed[2] == e);
        formed[r] = e
    }
}

proctype Member(byte me)
{
    byte last = 1, att = 0, tries = 0, op, he, a, pe, agreed, e;
    bool got;
    (started);
    if
    :: me == M && scenario == 1 -> att = 1 /* its extra attempt was attempt 1 */
#ifdef BUG_DRIFT
        ; last = 2
#endif
    :: me == M && scenario == 2 -> last = 0; att = 100 /* a fresh process */
    :: else -> skip
    fi;
attempt:
    tries++;
    att++;
    e = (last > 0 -> last + 1 : 1);
    maybe_crash(me);
    send(toL[me], HELLO, e, att, e);
    /* await WELCOME: answers to other attempts are dropped */
    do
    :: hs_recv(toM[me], op, he, a, pe, got);
        if
        :: !got -> send(toL[me], GIVEUP, e, att, 0); goto failed
        :: got && a != att -> skip
        :: got && a == att && op == WELCOME -> agreed = pe; break
        :: else -> goto failed /* REFUSE, or an unexpected op (EPROTO) */
        fi
    od;
#ifdef BUG_ONE_PHASE
    form(me, agreed);
    goto step;
#endif
    maybe_crash(me);
    send(toL[me], JOIN, e, att, 0);
    do
    :: hs_recv(toM[me], op, he, a, pe, got);
        if
        :: !got -> window[me] = true; send(toL[me], GIVEUP, e, att, 0); goto failed
        :: got && a != att -> skip
        :: got && a == att && op == WELCOME -> skip /* a repeat (a duplicated frame) */
        :: got && a == att && op == FORMED && pe == agreed ->
#ifdef BUG_LOCAL_EPOCH
            form(me, e);
            agreed = e;
#else
            form(me, pe);
#endif
            break
        :: else -> goto failed
        fi
    od;
step:
    maybe_crash(me);
    send(toL[me], UP, agreed, 0, 0);
    step_recv(toM[me], agreed, op, he, a, pe, got);
    if
    :: got && op == DOWN && he == agreed ->
        /* F2, the member's side */
        assert(formed[0] == agreed);
        applied[me] = true
    :: else -> skip /* the epoch ends: no step applied */
    fi;
    goto done;
failed:
#ifdef BUG_DRIFT
    last++;
#endif
    if
    :: tries < TRIES -> goto attempt
    :: else -> skip
    fi;
done:
    skip
}

proctype Leader()
{
    byte tries = 0, r, op, he, a, pe, agreed;
    byte att[M + 1], prop[M + 1];
    byte last[M + 1]; /* g->hello_att: the attempt of the last HELLO taken from r */
    bool got, ok;
    (started);
attempt:
    tries++;
    ok = true;
    /* Phase 1 (take_hello): every member's HELLO. */
    for (r : 1 .. M) {
        att[r] = 0;
        do
        :: hs_recv(toL[r], op, he, a, pe, got);
            if
            :: !got -> ok = false; break
            :: got && (op == JOIN || op == GIVEUP) -> skip /* an attempt that is over */
            :: got && op == HELLO && a == last[r] -> skip /* a repeat of one taken before */
            :: got && op == HELLO && a != last[r] -> att[r] = a; last[r] = a; prop[r] = pe; break
            :: else -> ok = false; break
            fi
        od
    }
    /* The agreed epoch: the largest proposal, the leader's own included. */
    agreed = 2;
    for (r : 1 .. M) {
        if
        :: att[r] != 0 && prop[r] > agreed -> agreed = prop[r]
        :: else -> skip
        fi
    }
    if
    :: ok ->
        for (r : 1 .. M) { send(toM[r], WELCOME, 2, att[r], agreed) }
#ifdef BUG_ONE_PHASE
        goto commit;
#endif
        /* Phase 2 (take_join): every member's JOIN for its attempt. */
        for (r : 1 .. M) {
            do
            :: !ok -> break
            :: ok -> hs_recv(toL[r], op, he, a, pe, got);
                if
                :: !got -> ok = false
                :: got && op == JOIN && a == att[r] -> break
                :: got && op == GIVEUP && a == att[r] -> att[r] = 0
                :: got && op == HELLO && a == last[r] -> skip /* a repeat */
                :: got && op == HELLO && a != last[r] ->
#ifdef BUG_NO_REHELLO
                    ok = false
#else
                    att[r] = a;
                    last[r] = a;
                    if
                    :: pe > agreed -> ok = false /* proposed after agreement: refused */
                    :: else -> send(toM[r], WELCOME, 2, a, agreed)
                    fi
#endif
                :: else -> skip /* a JOIN or GIVEUP of an attempt that is over */
                fi
            od
        }
    :: else -> skip
    fi;
commit:
    for (r : 1 .. M) {
        if
        :: ok -> send(toM[r], FORMED, 2, att[r], agreed)
        :: else -> send(toM[r], REFUSE, 2, att[r], 0)
        fi
    }
    if
    :: ok -> form(0, agreed); lead_tries = tries
    :: !ok && tries < TRIES -> goto attempt
    :: else -> goto done
    fi;
    /* Step 1 (kvt__group_gather): an UP of this epoch from every member. */
    for (r : 1 .. M) {
        step_recv(toL[r], agreed, op, he, a, pe, got);
        if
        :: got && op == UP && he == agreed -> skip
        :: else -> goto done /* a HELLO (stashed), a GIVEUP, a deadline: the epoch ends */
        fi
    }
    /* F2: the leader decides only if every member formed this epoch. */
    assert(formed[1] == agreed && formed[2] == agreed);
    applied[0] = true;
    for (r : 1 .. M) { send(toM[r], DOWN, agreed, 0, 0) }
done:
    skip
}

init {
    byte r;
    atomic {
        if
        :: scenario = 0
        :: scenario = 1;
            /* rank 2's extra attempt 1: HELLO, then GIVEUP at its deadline,
             * both still unread when the leader starts forming */
            toL[M]!HELLO, 2, 1, 2; toL[M]!GIVEUP, 2, 1, 0
        :: scenario = 2
        fi;
        run Leader();
        for (r : 1 .. M) { run Member(r) }
        started = true
    }
    (_nr_pr == 1); /* every rank ended: no wait lasts forever */
    for (r : 1 .. M) {
        /* F3: the leader formed and member r did not only in the window */
        assert(formed[0] == 0 || formed[r] == formed[0] || window[r] || (r == M && crashed))
    }
    for (r : 0 .. M) {
        /* F4: whatever failed before, the agreed epoch is 2 */
        assert(formed[r] == 0 || formed[r] == 2);
        /* a run without faults forms epoch 2 everywhere and applies step 1 */
        assert(faulted || (formed[r] == 2 && applied[r]))
    }
    /* ... at the leader's first attempt: rank 2's extra attempt before
     * (or a duplicated reform) does not cost a round */
    assert(faulted || lead_tries == 1)
}
