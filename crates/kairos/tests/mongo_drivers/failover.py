"""A pymongo causal session across a failover, recorded as a list-append history.

Usage: failover.py URI OPS MARKER HISTORY. One causally consistent session does OPS operations on
4 keys: appends ($push of a unique value, w: majority) and reads (readConcern majority, from a
secondary if there is one). After OPS/3 operations it creates the file MARKER (the test then
kills the primary with SIGKILL) and goes on. Every operation is recorded in HISTORY as
Jepsen-style JSON lines (invoke, then ok / fail / info) for `kairos check --model causal`.
At the end it reads every key from the primary and prints one JSON line: the counts, and the
majority-acknowledged appends that are missing.
"""
import json
import random
import sys
import time

from pymongo import MongoClient, ReadPreference
from pymongo.errors import PyMongoError
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

uri, ops, marker, history_path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
client = MongoClient(uri, serverSelectionTimeoutMS=30000, heartbeatFrequencyMS=500)
db = client.get_database("kairos", write_concern=WriteConcern(w="majority"), read_concern=ReadConcern("majority"))
coll = db.failover
reader = coll.with_options(read_preference=ReadPreference.SECONDARY_PREFERRED)
rng = random.Random(7)
history = open(history_path, "w")
index = 0
acked = {}  # key -> values acknowledged by a majority
errors = {"append": 0, "read": 0}


def record(kind, value):
    global index
    history.write(json.dumps({"index": index, "time": time.time_ns(), "type": kind, "process": 0, "f": "txn", "value": value}) + "\n")
    index += 1


with client.start_session(causal_consistency=True) as s:
    for i in range(ops):
        if i == ops // 3:
            open(marker, "w").close()
        k = rng.randrange(4)
        if rng.random() < 0.5:
            v = i + 1
            record("invoke", [["append", k, v]])
            try:
                coll.update_one({"_id": k}, {"$push": {"l": v}}, upsert=True, session=s)
                record("ok", [["append", k, v]])
                acked.setdefault(k, []).append(v)
            except PyMongoError as e:
                errors["append"] += 1
                record("info", [["append", k, v]])
                print(f"append {k} {v}: {e!r}", file=sys.stderr)
        else:
            record("invoke", [["r", k, None]])
            try:
                d = reader.find_one({"_id": k}, session=s)
                record("ok", [["r", k, (d or {}).get("l", [])]])
            except PyMongoError as e:
                errors["read"] += 1
                record("fail", [["r", k, None]])
                print(f"read {k}: {e!r}", file=sys.stderr)
    history.close()
    final = {}
    for k in range(4):
        d = coll.with_options(read_preference=ReadPreference.PRIMARY).find_one({"_id": k}, session=s)
        final[k] = (d or {}).get("l", [])

missing = [[k, v] for k, vs in acked.items() for v in vs if v not in final[k]]
print(json.dumps({
    "ops": ops,
    "acked_appends": sum(len(v) for v in acked.values()),
    "missing": missing,
    "errors": errors,
    "primary": list(client.primary or []),
}))
