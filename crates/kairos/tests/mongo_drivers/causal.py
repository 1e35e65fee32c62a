"""Read-your-writes through an unmodified pymongo against a Kairos replica set.

Usage: causal.py URI TRIALS. Inserts on the primary (w:1) then reads the document back from a
secondary, TRIALS times in a causally consistent session and TRIALS times in a session with
causal consistency off; then a 6 MiB insert_many (more than one oplog entry) read back from a
secondary, and a find_one_and_update / find_one_and_delete. Prints one JSON line with the counts.
"""
import json
import sys
import time

from pymongo import MongoClient, ReadPreference
from pymongo.write_concern import WriteConcern

uri, trials = sys.argv[1], int(sys.argv[2])
client = MongoClient(uri, serverSelectionTimeoutMS=20000)
client.admin.command("ping")
coll = client.get_database("kairos", write_concern=WriteConcern(w=1)).ryw
secondary = coll.with_options(read_preference=ReadPreference.SECONDARY)
out = {
    "set_name": client.topology_description.replica_set_name,
    "primary": list(client.primary or []),
}

def run(causal, base):
    found = 0
    with client.start_session(causal_consistency=causal) as s:
        for i in range(trials):
            coll.insert_one({"_id": base + i, "trial": i}, session=s)
            if secondary.find_one({"_id": base + i}, session=s) is not None:
                found += 1
    return found

out["causal_found"] = run(True, 0)
out["non_causal_found"] = run(False, 1_000_000)
out["trials"] = trials

# A write larger than one oplog entry (the member splits it), read back from a secondary.
big = [{"_id": f"big-{i}", "pad": "x" * (1 << 20)} for i in range(6)]
with client.start_session(causal_consistency=True) as s:
    coll.insert_many(big, session=s)
    out["big_found"] = len(list(secondary.find({"pad": "x" * (1 << 20)}, {"_id": 1}, session=s)))
# findAndModify through the driver: update returning the new version, then delete.
from pymongo import ReturnDocument
coll.insert_one({"_id": "fam", "n": 0})
updated = coll.find_one_and_update({"_id": "fam"}, {"$inc": {"n": 1}}, return_document=ReturnDocument.AFTER)
removed = coll.find_one_and_delete({"_id": "fam"})
out["find_and_modify"] = [updated, removed, coll.find_one({"_id": "fam"})]
# Discovery runs in the background: on a loaded machine the second secondary may be found
# only after the first operations. Count them once discovery settles (at most 20 s).
deadline = time.monotonic() + 20
while len(client.secondaries) < 2 and time.monotonic() < deadline:
    time.sleep(0.1)
out["secondaries"] = len(client.secondaries)
print(json.dumps(out))
