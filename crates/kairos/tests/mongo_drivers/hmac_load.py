"""Many quick replies for counting HMAC computations: one causally consistent session doing
OPS operations on the primary (a w:1 insert every tenth, finds otherwise).

Usage: hmac_load.py URI OPS. Prints one JSON line.
"""
import json
import sys

from pymongo import MongoClient
from pymongo.write_concern import WriteConcern

uri, ops = sys.argv[1], int(sys.argv[2])
client = MongoClient(uri, serverSelectionTimeoutMS=20000)
coll = client.get_database("kairos", write_concern=WriteConcern(w=1)).hmac
with client.start_session(causal_consistency=True) as s:
    for i in range(ops):
        if i % 10 == 0:
            coll.insert_one({"_id": i}, session=s)
        else:
            coll.find_one({"_id": i - i % 10}, session=s)
print(json.dumps({"ops": ops}))
