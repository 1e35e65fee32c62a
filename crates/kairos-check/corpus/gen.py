#!/usr/bin/env python3
"""Regenerates the corpus files (each history written by hand below, as events in time order).

Each event is (type, process, value[, f]). index = position, time = 1000 * position."""
import json, os

H = {}

def r(k, v=None): return ["r", k, v]
def w(k, v): return ["w", k, v]
def wu(k): return ["w", k, None]  # a write of unknown value (an increment whose result is unknown)
def a(k, v): return ["append", k, v]
def cas(k, e, n): return ["cas", k, [e, n]]

def inv(p, ops, f="txn"):
    return ("invoke", p, [[m[0], m[1], None] if m[0] == "r" else m for m in ops], f)
def ok(p, ops, f="txn"): return ("ok", p, ops, f)
def fail(p, ops, f="txn"): return ("fail", p, ops, f)
def info(p, ops, f="txn"): return ("info", p, ops, f)
def txn(p, ops, kind=ok, f="txn"): return [inv(p, ops, f), kind(p, ops, f)]

# --- transactional, known bad ---
H["bad/g0.jsonl"] = [inv(0, [a(1, 1), a(2, 1)]), inv(1, [a(1, 2), a(2, 2)]),
                     ok(0, [a(1, 1), a(2, 1)]), ok(1, [a(1, 2), a(2, 2)])] + txn(2, [r(1, [1, 2]), r(2, [2, 1])])
H["bad/g1a.jsonl"] = txn(0, [w(1, 1)], fail) + txn(1, [r(1, 1)])
H["bad/g1b.jsonl"] = [inv(0, [w(1, 1), w(1, 2)]), inv(1, [r(1)]), ok(1, [r(1, 1)]), ok(0, [w(1, 1), w(1, 2)])]
H["bad/g1c.jsonl"] = [inv(0, [w(1, 1), r(2)]), inv(1, [w(2, 2), r(1)]),
                      ok(0, [w(1, 1), r(2, 2)]), ok(1, [w(2, 2), r(1, 1)])]
# Read skew: T1 sees x before T2's write and y after it.
H["bad/g-single.jsonl"] = [inv(0, [r(1), r(2)]), inv(1, [w(1, 1), w(2, 1)]),
                           ok(1, [w(1, 1), w(2, 1)]), ok(0, [r(1, None), r(2, 1)])]
# Write skew.
H["bad/g2-item.jsonl"] = [inv(0, [r(1), r(2), w(1, 1)]), inv(1, [r(1), r(2), w(2, 1)]),
                          ok(0, [r(1, None), r(2, None), w(1, 1)]), ok(1, [r(1, None), r(2, None), w(2, 1)])]
H["bad/lost-update.jsonl"] = [inv(0, [r(1), w(1, 1)]), inv(1, [r(1), w(1, 2)]),
                              ok(0, [r(1, None), w(1, 1)]), ok(1, [r(1, None), w(1, 2)])]
# Serializable (T2 before T1) but not strictly: T1's write completed before T2 began.
H["bad/stale-read.jsonl"] = txn(0, [w(1, 1)]) + txn(1, [r(1, None)])
# Tiga timestamp inversion: T2 completes before T3 starts, yet reads force T3 < T1 < T2.
H["bad/timestamp-inversion.jsonl"] = [inv(1, [r(1), w(2, 1)]),          # T1 invoked
                                      inv(2, [r(2)]), ok(2, [r(2, 1)]),  # T2 reads T1's y
                                      inv(3, [w(1, 3)]), ok(3, [w(1, 3)]),  # T3 writes x after T2 completed
                                      ok(1, [r(1, 3), w(2, 1)])]         # T1 read T3's x
# A given-up increment (unknown write to key 1) and two later reads of two different values: one
# write produces one value, and nobody else writes key 1 (adya 0.1 misses it: no garbage reads).
H["bad/unknown-write-two-values.jsonl"] = ([inv(0, [r(1), wu(1)]), info(0, [r(1), wu(1)])]
                                           + txn(1, [r(1, 5)]) + txn(1, [r(1, 6)]))
# Key 2 = 7 has no possible writer: T1 wrote 1, and the unknown write to key 2 failed; the unknown
# write to key 1 may explain key 1 = 4 but not key 2 (adya 0.1 misses garbage reads).
H["bad/garbage-read-beside-unknown-write.jsonl"] = (
    [inv(0, [r(1), wu(1)]), info(0, [r(1), wu(1)])] + txn(1, [w(2, 1)]) + txn(3, [r(2), wu(2)], fail)
    + txn(2, [r(2, 7), r(1, 4)]))
# --- transactional, known good ---
# A given-up increment of key 1 (unknown write) took effect: its value 2 is read twice, then
# incremented; a given-up increment of key 2 did not (key 2 is read as nil after it).
H["good/unknown-write-read.jsonl"] = (
    txn(0, [r(1, None), w(1, 1)]) + [inv(1, [r(1), wu(1)]), info(1, [r(1), wu(1)])]
    + txn(2, [r(1, 2), r(2, None)]) + txn(0, [r(1, 2), w(1, 3)])
    + [inv(3, [r(2), wu(2)]), info(3, [r(2), wu(2)])] + txn(2, [r(1, 3), r(2, None)]))
H["good/rmw-concurrent.jsonl"] = [
    inv(0, [r(1), w(1, 1)]), inv(1, [r(2), w(2, 1)]), ok(0, [r(1, None), w(1, 1)]),
    inv(0, [r(1), w(1, 2)]), inv(2, [r(1), w(1, 9)]), fail(2, [r(1), w(1, 9)]),
    ok(1, [r(2, None), w(2, 1)]), inv(2, [r(1), r(2)]), ok(0, [r(1, 1), w(1, 2)]),
    inv(3, [r(1), w(1, 3)]), ok(2, [r(1, 1), r(2, 1)]), inv(0, [r(1), r(2)]),
    info(3, [r(1), w(1, 3)]), ok(0, [r(1, 3), r(2, 1)]), inv(4, [r(2), w(2, 2)]), ok(4, [r(2, 1), w(2, 2)])]
H["good/list-concurrent.jsonl"] = [
    inv(0, [a(1, 1)]), inv(1, [a(1, 2), a(2, 1)]), inv(2, [r(1)]), ok(0, [a(1, 1)]),
    ok(2, [r(1, [1])]), inv(3, [a(2, 7)]), fail(3, [a(2, 7)]), info(1, [a(1, 2), a(2, 1)]),
    inv(2, [r(1), r(2)]), ok(2, [r(1, [1, 2]), r(2, [1])]), inv(0, [r(2), a(2, 3)]),
    ok(0, [r(2, [1]), a(2, 3)]), inv(4, [r(2), r(1)]), ok(4, [r(2, [1, 3]), r(1, [1, 2])])]
H["good/single.jsonl"] = txn(0, [w(1, 1), r(1, 1)])
# --- linearizability ---
H["bad/lin-stale-read.jsonl"] = (txn(0, [w(1, 1)], f="write") + txn(1, [w(1, 2)], f="write")
                                 + txn(2, [r(1, 1)], f="read"))
H["bad/lin-lost-cas.jsonl"] = (txn(0, [w(1, 0)], f="write") + txn(1, [cas(1, 0, 1)], f="cas")
                               + txn(2, [cas(1, 0, 2)], f="cas") + txn(0, [r(1, 2)], f="read"))
H["good/lin-concurrent.jsonl"] = [
    inv(0, [w(1, 1)], "write"), inv(1, [w(1, 2)], "write"), inv(2, [w(1, 3)], "write"),
    inv(3, [r(1)], "read"), ok(3, [r(1, 3)], "read"), inv(3, [r(1)], "read"), ok(3, [r(1, 2)], "read"),
    inv(3, [r(1)], "read"), ok(3, [r(1, 1)], "read"),
    ok(0, [w(1, 1)], "write"), ok(1, [w(1, 2)], "write"), ok(2, [w(1, 3)], "write"),
    inv(4, [r(2)], "read"), ok(4, [r(2, None)], "read")]
H["good/lin-cas.jsonl"] = (txn(0, [w(1, 0)], f="write") + txn(1, [cas(1, 0, 1)], f="cas")
                           + txn(2, [cas(1, 0, 2)], fail, f="cas") + txn(3, [w(1, 3)], info, f="write")
                           + txn(0, [r(1, 3)], f="read") + txn(4, [cas(1, 3, 4)], info, f="cas")
                           + txn(0, [r(1, 3)], f="read"))
TOMBSTONE = 1 << 62  # kairos_core::history::TOMBSTONE: a write of it deletes the key for good
H["bad/lin-write-after-delete.jsonl"] = (txn(0, [w(1, 1)], f="write") + txn(1, [w(1, TOMBSTONE)], f="delete")
                                         + txn(2, [w(1, 2)], f="write") + txn(0, [r(1, 2)], f="read"))
H["good/lin-delete.jsonl"] = (txn(0, [w(1, 1)], f="write") + [inv(2, [w(1, 2)], "write")]
                              + txn(1, [w(1, TOMBSTONE)], f="delete") + txn(0, [r(1, TOMBSTONE)], f="read")
                              + [info(2, [w(1, 2)], "write")] + txn(3, [w(1, 3)], fail, f="write")
                              + txn(1, [r(1, TOMBSTONE)], f="read"))
# --- causal sessions ---
H["bad/causal-ryw.jsonl"] = txn(0, [a(1, 1)]) + txn(0, [r(1, [])])
H["bad/causal-mr.jsonl"] = txn(0, [a(1, 1)]) + txn(1, [r(1, [1])]) + txn(1, [r(1, [])])
H["bad/causal-mw.jsonl"] = txn(0, [a(1, 1)]) + txn(0, [a(2, 2)]) + txn(1, [r(2, [2])]) + txn(1, [r(1, [])])
H["bad/causal-wfr.jsonl"] = (txn(0, [a(1, 1)]) + txn(1, [r(1, [1])]) + txn(1, [a(2, 2)])
                             + txn(2, [r(2, [2])]) + txn(2, [r(1, [])]))
H["good/causal.jsonl"] = [
    inv(0, [a(1, 1)]), inv(1, [r(1)]), ok(1, [r(1, [])]), ok(0, [a(1, 1)]),
    inv(0, [a(2, 5)]), info(0, [a(2, 5)]), inv(2, [a(1, 9)]), fail(2, [a(1, 9)]),
    inv(1, [r(1), a(2, 2)]), ok(1, [r(1, [1]), a(2, 2)]), inv(2, [r(2), r(1)]), ok(2, [r(2, [2]), r(1, [1])]),
    inv(0, [r(1), r(2)]), ok(0, [r(1, [1]), r(2, [2])]), inv(1, [r(2)]), ok(1, [r(2, [2, 5])])]

here = os.path.dirname(os.path.abspath(__file__))
for name, evs in H.items():
    with open(os.path.join(here, name), "w") as f:
        for i, (t, p, v, fn) in enumerate(evs):
            f.write(json.dumps({"index": i, "time": 1000 * i, "type": t, "process": p, "f": fn, "value": v},
                               separators=(",", ":")) + "\n")
