// Read-your-writes through the unmodified Node driver against a Kairos replica set.
// Usage: node causal.js URI TRIALS. Prints one JSON line with the counts.
const { MongoClient } = require("mongodb");

async function main() {
  const [uri, trialsArg] = process.argv.slice(2);
  const trials = Number(trialsArg);
  const client = new MongoClient(uri, { serverSelectionTimeoutMS: 20000 });
  await client.connect();
  await client.db("admin").command({ ping: 1 });
  const coll = client.db("kairos").collection("node_ryw", { writeConcern: { w: 1 } });
  const run = async (causal, base) => {
    const session = client.startSession({ causalConsistency: causal });
    let found = 0;
    try {
      for (let i = 0; i < trials; i++) {
        await coll.insertOne({ _id: base + i, trial: i }, { session });
        const d = await coll.findOne({ _id: base + i }, { session, readPreference: "secondary" });
        if (d !== null) found++;
      }
    } finally {
      await session.endSession();
    }
    return found;
  };
  const causal_found = await run(true, 0);
  const non_causal_found = await run(false, 1000000);
  console.log(JSON.stringify({ causal_found, non_causal_found, trials }));
  await client.close();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
