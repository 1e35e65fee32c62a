//! Hand-driven schedules: `engine::Client`s run verb by verb against three node images, with
//! one chain stalled between its verbs for as long as a schedule needs (what a descheduled
//! thread or a slow NIC does). Each schedule is a regression test of a bug the randomized
//! simulator missed because it never stalled a chain for more than ~100 ns.

use kairos_core::LocalTime;
use kairos_swarm::client::{ChainTag, Completion, KvClient, KvError, KvOp, OpId, Outbox};
use kairos_swarm::engine::{Client, ClientConfig, Protocol};
use kairos_swarm::index;
use kairos_swarm::layout::{Layout, LayoutConfig};
use kairos_swarm::meta;
use kairos_swarm::verbs::{MemNodeId, MemoryImage, Verb, VerbError, VerbOutcome};
use std::collections::{BTreeMap, VecDeque};

const KEY: &[u8] = b"the-key";

struct Pending {
    tag: ChainTag,
    verbs: Vec<Verb>,
    next: usize,
    outs: Vec<VerbOutcome>,
}

/// Three memory nodes holding one key, and `n` clients whose chains wait in per-(client, node)
/// FIFO queues until the schedule applies them.
struct Lab {
    images: Vec<MemoryImage>,
    clients: Vec<Client>,
    now: Vec<LocalTime>,
    conns: BTreeMap<(usize, MemNodeId), VecDeque<Pending>>,
    done: BTreeMap<(usize, OpId), Completion>,
    /// The key's replicas in preference order: P (primary, keeps the in-place copy), B, C.
    nodes: Vec<MemNodeId>,
}

impl Lab {
    /// `clock_us[i]`: client `i`'s clock reading (µs after the timestamp epoch); SWARM-KV.
    fn new(clock_us: &[u64]) -> Lab {
        Lab::with(Protocol::SwarmKv, clock_us)
    }

    fn with(protocol: Protocol, clock_us: &[u64]) -> Lab {
        Lab::shaped(protocol, clock_us, 3, None)
    }

    /// Over `nodes` memory nodes, every key on all of them; each writer owns
    /// `buffers_per_writer` out-of-place buffers (`None`: the layout's default).
    fn shaped(protocol: Protocol, clock_us: &[u64], nodes: u32, buffers_per_writer: Option<u32>) -> Lab {
        let n = clock_us.len() as u32;
        let config = LayoutConfig {
            keys: 4,
            key_size: 24,
            value_size: 64,
            replicas: nodes,
            memory_nodes: nodes,
            writers: n,
            buffers_per_writer: buffers_per_writer.unwrap_or(0),
        };
        let layout =
            Layout::new(if buffers_per_writer.is_some() { config } else { config.with_default_buffers() }).unwrap();
        let mut images: Vec<MemoryImage> = (0..nodes).map(|_| MemoryImage::new(layout.node_bytes())).collect();
        let load = index::bulk_load(&layout, protocol, &mut images, [(KEY.to_vec(), b"initial".to_vec())], 1).unwrap();
        let slot = load.tuples.iter().flatten().next().unwrap().0;
        let clients = (0..n)
            .map(|w| {
                let mut c = Client::new(ClientConfig::new(protocol, w, layout.clone(), LocalTime(0)));
                c.absorb_load(&load);
                c
            })
            .collect();
        Lab {
            images,
            clients,
            now: clock_us.iter().map(|us| LocalTime(us * 1000)).collect(),
            conns: BTreeMap::new(),
            done: BTreeMap::new(),
            nodes: layout.replicas_of(slot),
        }
    }

    fn absorb(&mut self, c: usize, out: Outbox) {
        for i in out.issues {
            self.conns.entry((c, i.chain.node)).or_default().push_back(Pending {
                tag: i.tag,
                verbs: i.chain.verbs,
                next: 0,
                outs: Vec::new(),
            });
        }
        for d in out.completions {
            self.done.insert((c, d.op_id), d);
        }
    }

    fn tick(&mut self, c: usize) {
        self.now[c] = LocalTime(self.now[c].as_nanos() + 100);
    }

    fn invoke(&mut self, c: usize, id: OpId, op: KvOp) {
        self.tick(c);
        let mut out = Outbox::new();
        self.clients[c].invoke(id, op, self.now[c], &mut out);
        self.absorb(c, out);
    }

    /// Applies up to `k` more verbs of client `c`'s oldest chain on `node`; returns its reply
    /// (not yet delivered) if the chain is now complete.
    fn apply(
        &mut self,
        c: usize,
        node: MemNodeId,
        k: usize,
    ) -> Option<(ChainTag, Result<Vec<VerbOutcome>, VerbError>)> {
        let q = self.conns.get_mut(&(c, node))?;
        let p = q.front_mut()?;
        for _ in 0..k {
            if p.next >= p.verbs.len() {
                break;
            }
            let o = self.images[node as usize].apply(&p.verbs[p.next]).expect("verbs of the protocol are valid");
            p.outs.push(o);
            p.next += 1;
        }
        if p.next < p.verbs.len() {
            return None;
        }
        let p = q.pop_front()?;
        Some((p.tag, Ok(p.outs)))
    }

    fn deliver(&mut self, c: usize, reply: Option<(ChainTag, Result<Vec<VerbOutcome>, VerbError>)>) {
        let Some((tag, r)) = reply else { return };
        self.tick(c);
        let mut out = Outbox::new();
        self.clients[c].on_reply(tag, r, self.now[c], &mut out);
        self.absorb(c, out);
    }

    /// Runs client `c`'s oldest chain on `node` whole and delivers its reply.
    fn step(&mut self, c: usize, node: MemNodeId) {
        let r = self.apply(c, node, usize::MAX);
        self.deliver(c, r);
    }

    /// Lets client `c`'s clock run (ticks, no replies) for `ms` milliseconds.
    fn idle(&mut self, c: usize, ms: u64) {
        let end = self.now[c] + std::time::Duration::from_millis(ms);
        while self.now[c] < end {
            let dt = self.clients[c].tick_interval();
            self.now[c] = self.now[c] + dt;
            let mut out = Outbox::new();
            self.clients[c].on_tick(self.now[c], &mut out);
            self.absorb(c, out);
        }
    }

    /// Like `run`, but each pass (a chain per node at most) also lets 10 µs pass on the
    /// client's clock, so that an operation that keeps re-reading reaches its timers.
    fn run_timed(&mut self, c: usize, id: OpId, nodes: &[MemNodeId], passes: usize) -> Option<Completion> {
        for _ in 0..passes {
            if let Some(d) = self.done.get(&(c, id)) {
                return Some(d.clone());
            }
            for &n in nodes {
                if self.queued(c, n) > 0 {
                    self.step(c, n);
                }
            }
            self.now[c] = self.now[c] + std::time::Duration::from_micros(10);
            let mut out = Outbox::new();
            self.clients[c].on_tick(self.now[c], &mut out);
            self.absorb(c, out);
        }
        self.done.get(&(c, id)).cloned()
    }

    /// The nodes client `c` has chains queued for.
    fn queued_on(&self, c: usize) -> Vec<MemNodeId> {
        self.nodes.iter().copied().filter(|n| self.queued(c, *n) > 0).collect()
    }

    fn queued(&self, c: usize, node: MemNodeId) -> usize {
        self.conns.get(&(c, node)).map_or(0, |q| q.len())
    }

    /// Runs client `c` (every chain on `nodes`, whole, replies delivered at once) until
    /// operation `id` completes or `rounds_max` rounds have passed.
    fn run(&mut self, c: usize, id: OpId, nodes: &[MemNodeId], rounds_max: usize) -> Option<Completion> {
        for _ in 0..rounds_max {
            if let Some(d) = self.done.get(&(c, id)) {
                return Some(d.clone());
            }
            let mut progressed = false;
            for &n in nodes {
                while self.queued(c, n) > 0 {
                    self.step(c, n);
                    progressed = true;
                }
            }
            if !progressed {
                // Nothing to deliver: time passes until the client's timeouts fire.
                let dt = self.clients[c].tick_interval();
                self.now[c] = self.now[c] + dt;
                let mut out = Outbox::new();
                self.clients[c].on_tick(self.now[c], &mut out);
                self.absorb(c, out);
            }
        }
        self.done.get(&(c, id)).cloned()
    }

    /// Lets client `c`'s clock run until its majority-first round widens to every replica (a
    /// write's first try, like a read's, goes to a majority first: see `kairos_swarm::hedge`):
    /// the schedule treats the chain to the majority's other node as stalled before its first
    /// verb. Fails if the round does not widen, so a schedule cannot silently lose a chain.
    fn widen(&mut self, c: usize) {
        let before = self.counter(c, "rounds_widened");
        for _ in 0..1_000 {
            if self.counter(c, "rounds_widened") > before {
                return;
            }
            let dt = self.clients[c].tick_interval();
            self.now[c] = self.now[c] + dt;
            let mut out = Outbox::new();
            self.clients[c].on_tick(self.now[c], &mut out);
            self.absorb(c, out);
        }
        panic!("client {c}'s round never widened");
    }

    fn counter(&self, c: usize, name: &str) -> u64 {
        self.clients[c].counters().into_iter().find(|(k, _)| *k == name).map_or(0, |(_, v)| v)
    }
}

fn update(value: &[u8]) -> KvOp {
    KvOp::Update { key: KEY.to_vec(), value: value.to_vec() }
}
fn get() -> KvOp {
    KvOp::Get { key: KEY.to_vec() }
}
fn delete() -> KvOp {
    KvOp::Delete { key: KEY.to_vec() }
}

/// Issue bug 1. W's guessed timestamp T is behind V's clock. W's update chain lands whole on
/// C; on P only its buffer fill lands. R1 reads P and C twice, locks T and returns W's value.
/// Then V updates above T and completes in one round trip. W's chain resumes on P and runs on
/// B: both show V's newer tuple, so T is the maximum on no node that replied — which is no
/// proof that no reader chose T. A reader R2 starting after all this must return V's value
/// (R1 ended before V began, so W is ordered before V).
#[test]
fn a_stale_guess_a_reader_returned_is_never_rewritten_above_a_later_write() {
    let (w, v, r1, r2) = (0, 1, 2, 3);
    // W's clock lags V's by 4 ms; readers never guess.
    let mut lab = Lab::new(&[1_000, 5_000, 3_000, 3_000]);
    let [p, b, c] = [lab.nodes[0], lab.nodes[1], lab.nodes[2]];
    lab.invoke(w, 1, update(b"from W"));
    lab.widen(w); // W's chain to its majority's other replica is slow to start
    let w_on_c = lab.apply(w, c, usize::MAX); // whole chain on C; its reply is slow
    assert!(w_on_c.is_some());
    assert!(lab.apply(w, p, 1).is_none(), "only W's buffer fill lands on P");

    lab.invoke(r1, 1, get());
    let got = lab.run(r1, 1, &[p, c], 20).expect("R1 completes with P and C");
    assert_eq!(got.result, Ok(Some(b"from W".to_vec())), "R1 returns W's value (T locked on P and C)");

    lab.invoke(v, 1, update(b"from V"));
    let done = lab.run(v, 1, &[p, b, c], 20).expect("V completes");
    assert_eq!(done.result, Ok(None));
    assert_eq!(done.round_trips, 1, "V's guess is fresh: one round trip");

    // W's chain resumes on P and runs on B; W then runs to completion on P and B (C's reply to
    // its first chain is still in flight).
    lab.step(w, p);
    lab.step(w, b);
    let wd = lab.run(w, 1, &[p, b], 50).expect("W completes");
    assert_eq!(wd.result, Ok(None), "{wd:?}");
    drop(w_on_c);

    lab.invoke(r2, 1, get());
    let got = lab.run(r2, 1, &[p, b, c], 50).expect("R2 completes");
    assert_eq!(
        got.result,
        Ok(Some(b"from V".to_vec())),
        "R1 returned W's value before V began, so a read after V completed must return V's"
    );
}

/// Issue bug 2. A writer's update reaches only the primary (every read waits for it) and then
/// stalls — or crashed. A reader sees T as the maximum twice and races for T's lock; the lock
/// must be winnable without the writer's help (write T's value and metadata where they are
/// missing), so the read ends within `2 × writers + 1` iterations; the winning reader marks T
/// VERIFIED, so the next read takes one round trip.
#[test]
fn a_read_does_not_wait_for_a_writer_stalled_after_the_primary() {
    let (w, r1, r2) = (0, 1, 2);
    let mut lab = Lab::new(&[1_000, 1_000, 1_000]);
    let nodes = lab.nodes.clone();
    let p = nodes[0];
    lab.invoke(w, 1, update(b"from W"));
    let _stalled = lab.apply(w, p, usize::MAX); // whole chain on P, nothing elsewhere, no reply

    let writers = 3u64;
    lab.invoke(r1, 1, get());
    let got = lab.run(r1, 1, &nodes, 200);
    let iterations = lab.counter(r1, "read_iterations_max");
    let got = got.unwrap_or_else(|| panic!("the read is stuck after {iterations} iterations"));
    assert!(iterations <= 2 * writers + 1, "{iterations} iterations > 2 × writers + 1");
    // T was seen twice and locked: W's pending update is linearized by this read.
    assert_eq!(got.result, Ok(Some(b"from W".to_vec())));

    // T's value now sits wherever its metadata does: a primary crash loses nothing.
    let later: Vec<MemNodeId> = nodes[1..].to_vec();
    lab.invoke(r2, 1, get());
    // (It waits for the primary's chain to time out: 2 ms in ticks of a few µs.)
    let got = lab.run(r2, 1, &later, 5_000).expect("a read without the primary completes");
    assert_eq!(got.result, Ok(Some(b"from W".to_vec())));

    // With every node up, a later read of the key takes one round trip (T is VERIFIED).
    lab.invoke(r2, 2, get());
    let got = lab.run(r2, 2, &nodes, 50).expect("completes");
    assert_eq!(got.result, Ok(Some(b"from W".to_vec())));
    assert_eq!(got.round_trips, 1, "the winning reader marked T VERIFIED");
}

/// A writer that wins its timestamp lock and crashes before rewriting must not leave readers
/// spinning on its tuple. V's update is stalled after landing on P only; W's guess T is below
/// V's, so W's replies from P and B make T stale; W races for T, wins it on every node, and
/// crashes before its rewrite. A reader that cannot reach P (slow) reads B and C. Before the
/// fix T stayed the maximum there, locked by W for good: every lock round failed, forever. Now
/// W's lock round first puts V (value, then metadata) where no tuple above T was, so the reader
/// sees V and completes within `2 × writers + 1` iterations.
#[test]
fn a_writer_crashing_after_winning_its_lock_does_not_stall_readers() {
    let (w, v, r) = (0, 1, 2);
    let mut lab = Lab::new(&[1_000, 5_000, 3_000]);
    let nodes = lab.nodes.clone();
    let [p, b, c] = [nodes[0], nodes[1], nodes[2]];
    lab.invoke(v, 1, update(b"from V"));
    let _v_stalled = lab.apply(v, p, usize::MAX); // V lands on P only, then stalls

    lab.invoke(w, 1, update(b"from W"));
    lab.widen(w); // W's chain to its majority's other replica is slow to start
    let _w_on_c = lab.apply(w, c, usize::MAX); // whole on C, reply slow
                                               // W runs on P and B until it issues its lock round (a CAS to a WRITER lock word).
    let is_lock_round = |lab: &Lab| {
        lab.conns.get(&(w, p)).and_then(|q| q.front()).is_some_and(|ch| {
            ch.verbs.iter().any(|x| matches!(x, Verb::Cas { expected, new, .. } if new & 3 == 3 && new != expected))
        })
    };
    for _ in 0..10 {
        if is_lock_round(&lab) {
            break;
        }
        lab.step(w, p);
        lab.step(w, b);
    }
    assert!(is_lock_round(&lab), "W's guess is stale and W races for T's lock");
    // The lock round lands everywhere (W wins T on every node); W crashes before any reply.
    for n in [p, b, c] {
        while lab.queued(w, n) > 0 {
            let _ = lab.apply(w, n, usize::MAX);
        }
    }

    lab.invoke(r, 1, get());
    let got = lab.run(r, 1, &[b, c], 5_000);
    let iterations = lab.counter(r, "read_iterations_max");
    let got = got.unwrap_or_else(|| panic!("the read is stuck after {iterations} iterations"));
    assert!(iterations <= 2 * 3 + 1, "{iterations} iterations > 2 × writers + 1");
    assert_eq!(got.result, Ok(Some(b"from V".to_vec())), "W's T is never returned: W won its lock");
}

/// Campaign seed 8350 (swarm-kv). A reader's maximum must not go down between its iterations.
/// W's update T_prev lands on B and C (its chain to P is slow) and completes; its VERIFIED
/// flips are still queued. W's next update T lands on B only. Reader R1 reads P and B (maximum
/// T), then P and C (maximum T_prev, an *older* tuple of W). The reader took "two different
/// tuples of one writer" as proof that the first one's operation had completed and returned T
/// without locking it — but T's operation had barely begun. V then updates above T and
/// completes; W's update resumes, finds T stale, wins its lock (no reader holds it) and
/// rewrites T's value above V's; and R2, which starts after V completed, returns W's value
/// although R1 returned it before V began. The reader now keeps the highest tuple it has seen
/// (the reference implementation's maximum only grows too): T stays the candidate, R1 locks it
/// on a majority, W finds the reader's lock and completes at T, below V.
#[test]
fn a_reader_does_not_take_an_older_tuple_of_a_writer_as_that_writers_next_operation() {
    let (r1, w, v, r2) = (0, 1, 2, 3);
    // V's clock is far ahead; W's guesses are fresh until V writes.
    let mut lab = Lab::new(&[3_000, 1_000, 5_000, 3_000]);
    let [p, b, c] = [lab.nodes[0], lab.nodes[1], lab.nodes[2]];
    lab.invoke(w, 1, update(b"W first"));
    lab.widen(w); // its chain to P, and to the majority's other replica, are slow
    lab.step(w, b);
    lab.step(w, c);
    let first = lab.done.get(&(w, 1)).cloned().expect("W's first update completes on B and C");
    assert_eq!(first.result, Ok(None));
    // W's second update T: its chain runs on B only (after the VERIFIED flip queued there); on C
    // it waits behind the flip, on P behind the first update's chain.
    lab.invoke(w, 2, update(b"W second"));
    lab.widen(w); // T's first try too, so that its chain to B exists whichever majority it picked
    assert!(lab.apply(w, b, usize::MAX).is_some(), "the VERIFIED flip of W's first update on B");
    let t_on_b = lab.apply(w, b, usize::MAX);
    assert!(t_on_b.is_some(), "T lands whole on B; its reply is slow");

    lab.invoke(r1, 1, get());
    // Iteration 1 from P and B: the maximum is T.
    lab.step(r1, p);
    lab.step(r1, b);
    // Iteration 2 from P and C (C first runs iteration 1's chain, whose reply is stale): the
    // maximum there is T_prev, GUESSED.
    lab.step(r1, p);
    lab.step(r1, c);
    lab.step(r1, c);
    let got = lab.run(r1, 1, &[p, b, c], 40).expect("R1 completes");
    assert_eq!(got.result, Ok(Some(b"W second".to_vec())), "R1 may return T: W's update is pending");

    lab.invoke(v, 1, update(b"from V"));
    let done = lab.run(v, 1, &[p, b, c], 20).expect("V completes");
    assert_eq!(done.result, Ok(None));

    lab.deliver(w, t_on_b);
    let wd = lab.run(w, 2, &[p, b, c], 60).expect("W's second update completes");
    assert_eq!(wd.result, Ok(None), "{wd:?}");

    lab.invoke(r2, 1, get());
    let got = lab.run(r2, 1, &[p, b, c], 50).expect("R2 completes");
    assert_eq!(
        got.result,
        Ok(Some(b"from V".to_vec())),
        "R1 returned W's value before V began, so a read after V completed must return V's"
    );
}

/// Directory entries are shared and claimed with CAS. Two clients insert new keys at once and
/// claim the same free entry: A's claim lands first on P, B's on B and C. B holds a majority
/// and is done; A lost the entry on B, retries there with another free entry, and completes
/// one round trip later. A third client, which knows neither key, then finds both.
#[test]
fn inserts_racing_for_one_directory_entry_both_end_up_findable() {
    let (a, b, reader) = (0, 1, 2);
    let mut lab = Lab::new(&[1_000, 1_000, 1_000]);
    let [p, q, r] = [lab.nodes[0], lab.nodes[1], lab.nodes[2]];
    let insert = |key: &[u8], value: &[u8]| KvOp::Insert { key: key.to_vec(), value: value.to_vec() };
    lab.invoke(a, 1, insert(b"key-a", b"value a"));
    lab.invoke(b, 1, insert(b"key-b", b"value b"));
    for c in [a, b] {
        for n in [p, q, r] {
            lab.step(c, n); // the lookups: neither key exists
        }
    }
    // Both creates now claim the same entry (the first free one of a shared window).
    lab.step(a, p);
    lab.step(b, q);
    lab.step(b, r);
    assert!(lab.done.contains_key(&(b, 1)), "B's claim holds on a majority: its insert is done");
    lab.step(a, q); // A's claim on Q is lost to B's
    assert_eq!(lab.counter(a, "directory_claims_lost"), 1);
    let got = lab.run(a, 1, &[q, p, r], 20).expect("A completes after retrying its claim");
    assert_eq!(got.result, Ok(None));
    assert_eq!(lab.done[&(b, 1)].result, Ok(None));
    for (id, key, value) in [(1, b"key-a", b"value a"), (2, b"key-b", b"value b")] {
        lab.invoke(reader, id, KvOp::Get { key: key.to_vec() });
        // Its lookup hears Q and R first: P alone holding A's entry would not be enough.
        let got = lab.run(reader, id, &[q, r, p], 20).expect("the reader completes");
        assert_eq!(got.result, Ok(Some(value.to_vec())), "{}", String::from_utf8_lossy(key));
    }
}

/// A review's bug A (found outside the suite, 2026-12-07). D's delete lands whole on C and
/// stalls there (or D crashes). R1 reads P and C and meets the deletion on C alone; it reported
/// `Deleted` at once, and R2, which began after R1 ended, read P and B and returned the old
/// value: the key came back. A deletion is now reported only once it is on a majority (R1
/// writes it back first, `kairos_swarm::deletion`), so every later read meets it.
#[test]
fn a_read_that_reports_a_deletion_is_never_followed_by_a_read_of_the_old_value() {
    let (d, r1, r2) = (0, 1, 2);
    let mut lab = Lab::new(&[1_000, 1_000, 1_000]);
    let [p, b, c] = [lab.nodes[0], lab.nodes[1], lab.nodes[2]];
    lab.invoke(d, 1, delete());
    lab.widen(d); // D has a chain to C whichever majority it asked first
    assert!(lab.apply(d, c, usize::MAX).is_some(), "the delete lands on C; D stalls there for good");

    lab.invoke(r1, 1, get());
    let got1 = lab.run(r1, 1, &[p, c], 50).expect("R1 completes with P and C");
    assert_eq!(got1.result, Err(KvError::Deleted), "R1 meets the deletion on C");
    lab.invoke(r2, 1, get());
    let got2 = lab.run(r2, 1, &[p, b], 50).expect("R2 completes with P and B");
    assert_eq!(got2.result, Err(KvError::Deleted), "R1 reported the deletion before R2 began: R2 must too");
}

/// A review's bug B. W's update lands whole on C, and on P up to (not including) its read of
/// the words. R locks W's tuple on P and C and returns W's value. Only then does D delete the
/// key. W's chain on P finishes: its read shows the deletion, and W reported `Deleted` — "did
/// not take effect" — although a read that ended before the delete began returned its value.
/// A deletion W meets is now raced for like any tuple above its own: R's lock on W's tuple
/// shows that W took effect (before the delete), so W completes.
#[test]
fn an_update_a_reader_returned_before_a_delete_completes_despite_the_delete() {
    let (w, d, r) = (0, 1, 2);
    let mut lab = Lab::new(&[1_000, 1_000, 1_000]);
    let [p, b, c] = [lab.nodes[0], lab.nodes[1], lab.nodes[2]];
    lab.invoke(w, 1, update(b"from W"));
    lab.widen(w);
    let w_on_c = lab.apply(w, c, usize::MAX);
    assert!(w_on_c.is_some());
    assert!(lab.apply(w, p, 3).is_none(), "fill, lock read and CAS land on P; the words read stalls");

    lab.invoke(r, 1, get());
    let got = lab.run(r, 1, &[p, c], 50).expect("R completes with P and C");
    assert_eq!(got.result, Ok(Some(b"from W".to_vec())), "R locks W's tuple and returns its value");

    lab.invoke(d, 1, delete());
    let deleted = lab.run(d, 1, &[p, b, c], 50).expect("D completes");
    assert_eq!(deleted.result, Ok(None));

    let w_on_p = lab.apply(w, p, usize::MAX);
    lab.deliver(w, w_on_p);
    lab.deliver(w, w_on_c);
    let done = lab.run(w, 1, &[p, b, c], 50).expect("W completes");
    assert_eq!(done.result, Ok(None), "a reader returned W's value before the delete began: W took effect");
}

/// The key's metadata words on `node` (every writer's word), for the review's schedules.
fn meta_words_on(lab: &mut Lab, node: MemNodeId) -> Vec<u64> {
    let layout = lab.clients[0].config().layout.clone();
    for slot in 0..4u64 {
        let v = Verb::Read { addr: layout.meta_words(slot), len: layout.meta_words_bytes() };
        let Ok(VerbOutcome::Read(bytes)) = lab.images[node as usize].apply(&v) else { continue };
        let ws: Vec<u64> = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        if ws.iter().any(|w| *w != 0) {
            return ws;
        }
    }
    Vec::new()
}

/// A second review's schedule (see the tests below); `flip_between`: D's VERIFIED flip lands
/// on P between W's write chain and W's lock chain there; `deletes`: M is D's deletion, else
/// D's second update, far ahead. Returns the reader's completion, if any, and what it saw.
fn stale_writer_racing(flip_between: bool, deletes: bool) -> (Option<Completion>, String) {
    let (d, w, r) = (0, 1, 2);
    let mut lab = Lab::new(&[1_000, 2_000, 1_000]);
    let [p, b, c] = [lab.nodes[0], lab.nodes[1], lab.nodes[2]];

    // D's update X everywhere; it completes, its VERIFIED flips get queued.
    lab.invoke(d, 1, update(b"from D"));
    lab.widen(d);
    lab.step(d, c);
    lab.step(d, b);
    let x = lab.done.get(&(d, 1)).cloned().expect("D's update completes on C and B");
    assert_eq!(x.result, Ok(None));
    lab.step(d, p); // X lands on P too (late reply)
    assert_eq!(lab.queued(d, p), 1, "X's VERIFIED flip waits on P");
    lab.step(d, c); // the flip lands on C

    // D deletes: the delete lands on C only; D crashes.
    if deletes {
        lab.invoke(d, 2, delete());
    } else {
        lab.now[d] = LocalTime(9_000_000); // D's clock jumps ahead of W's: M above T
        lab.invoke(d, 2, update(b"D again"));
    }
    lab.widen(d);
    assert!(lab.apply(d, c, usize::MAX).is_some(), "the deletion (or M) lands on C");

    // W's update T: on C and P; its replies show the deletion on C.
    lab.invoke(w, 1, update(b"from W"));
    lab.widen(w);
    let on_c = lab.apply(w, c, usize::MAX);
    let on_p = lab.apply(w, p, usize::MAX);
    assert!(on_c.is_some() && on_p.is_some());
    lab.deliver(w, on_c);
    lab.deliver(w, on_p);
    assert_eq!(lab.counter(w, "stale_guesses"), 1, "T is stale: W races with the deletion as M");
    if !deletes {
        // A live M's value is fetched first (on C, which holds it, and P).
        assert_eq!(lab.counter(w, "writer_prepares"), 1);
        lab.step(w, c);
        lab.step(w, p);
    }
    assert!(lab.counter(w, "writer_lock_rounds") >= 1, "W sent its lock round");
    if flip_between {
        // D's flip lands on P now (X -> X|VERIFIED), before W's lock chain.
        let _ = lab.apply(d, p, usize::MAX);
    }
    // W's lock chain on P and C lands (on P: the CAS of D's word from X to the deletion fails
    // if the flip landed; the lock holds either way); W's write lands on B; W crashes before
    // any reply.
    let _ = lab.apply(w, p, usize::MAX);
    let _ = lab.apply(w, c, usize::MAX);
    let _ = lab.apply(w, b, usize::MAX);
    let state = format!(
        "words on P {:x?}, B {:x?}, C {:x?}",
        meta_words_on(&mut lab, p),
        meta_words_on(&mut lab, b),
        meta_words_on(&mut lab, c)
    );
    // C crashes. P and B are up.
    lab.invoke(r, 1, get());
    let got = lab.run(r, 1, &[p, b], 3_000);
    let iterations = lab.counter(r, "read_iterations_max");
    let lost = lab.counter(r, "reader_lock_lost");
    (got, format!("{state}; reader: {iterations} iterations, {lost} lock rounds lost"))
}

/// A second review's schedule (2026-12-07). D updates (X lands on P, B, C; X's VERIFIED flip reaches C but stays
/// queued on P), then deletes: the delete lands on C only and D crashes. W's guess T (its clock
/// is ahead of D's) lands on C and P; its replies show the deletion on C, so T is stale and W
/// races for T with the deletion as M (rule 6): its lock round CASes D's word on P from X to
/// the deletion and locks T. D's flip lands on P between W's write and W's lock chains, so the
/// CAS fails (D's word is X|VERIFIED now) but the lock still lands: P holds T|WRITER and no
/// tuple above T. W crashes, then C. P and B (a majority) are up; a reader sees T as their
/// maximum, can never lock it on a majority (W holds P), and never finished. A stale writer
/// now locks a node only once a tuple above T is known to be there.
#[test]
fn a_stale_writer_never_locks_a_node_its_covering_write_missed() {
    let (control, why) = stale_writer_racing(false, true);
    eprintln!("control (no flip in between): {:?}; {why}", control.as_ref().map(|c| &c.result));
    assert_eq!(control.map(|c| c.result), Some(Err(KvError::Deleted)), "control: {why}");
    let (got, why) = stale_writer_racing(true, true);
    eprintln!("with the flip in between: {:?}; {why}", got.as_ref().map(|c| &c.result));
    let got = got.unwrap_or_else(|| panic!("the read is stuck with P and B up: {why}"));
    assert!(matches!(got.result, Ok(_) | Err(KvError::Deleted)), "the read fails with P and B up: {got:?}; {why}");
}

/// The same schedule with a live tuple M (D's second update, far ahead) in place of the
/// deletion: the lock round's write of M on P (value, then CAS of D's word from X) failed the
/// same way, and the lock landed all the same (this branch predates deletions' race).
#[test]
fn a_stale_writer_never_locks_a_node_its_covering_write_of_a_live_tuple_missed() {
    let (got, why) = stale_writer_racing(true, false);
    eprintln!("live M, flip in between: {:?}; {why}", got.as_ref().map(|c| &c.result));
    let got = got.unwrap_or_else(|| panic!("the read is stuck with P and B up: {why}"));
    assert!(got.result.is_ok(), "{got:?}; {why}");
}

/// DM-ABD (a review's schedule): a read's write-back counted a replica its first round had not
/// heard from, to which it sent an empty chain, towards its majority; it returned a value that
/// was on one node only, and after that node's crash a later read returned an older value.
#[test]
fn a_dm_abd_read_returns_a_value_only_once_a_majority_holds_it() {
    let (w, r1, r2) = (0, 1, 2);
    let mut lab = Lab::with(Protocol::DmAbd, &[1_000, 1_000, 1_000]);
    let p = lab.nodes[0];
    lab.invoke(w, 1, update(b"from W"));
    let first = lab.queued_on(w);
    assert_eq!(first.len(), 2, "a majority first: {first:?}");
    let x = *first.iter().find(|n| **n != p).unwrap();
    let y = *lab.nodes.iter().find(|n| **n != p && **n != x).unwrap();
    lab.step(w, p);
    lab.step(w, x); // W's read round; its write round goes to P and X
    assert!(lab.queued(w, p) == 1 && lab.queued(w, x) == 1, "W's write round goes to P and X first");
    lab.apply(w, p, usize::MAX); // W's tuple lands on P; W stalls (or crashes) before X

    // R1 asks P and X; X is slow, so its round widens to Y and completes with P and Y.
    lab.invoke(r1, 1, get());
    assert!(lab.queued(r1, p) == 1 && lab.queued(r1, x) == 1, "R1 asks P and X first");
    lab.step(r1, p);
    lab.widen(r1);
    lab.step(r1, y);
    // Its write-back, majority-first, goes to P and X again; X answers from now on.
    let got = lab.run(r1, 1, &[p, x], 50).expect("R1 completes with P and X");
    assert_eq!(got.result, Ok(Some(b"from W".to_vec())), "R1 returns W's value");

    // P crashes. R2 reads X and Y: R1 returned W's value before R2 began.
    lab.invoke(r2, 1, get());
    let got = lab.run(r2, 1, &[x, y], 5_000).expect("R2 completes with X and Y");
    assert_eq!(got.result, Ok(Some(b"from W".to_vec())), "R2 returns W's value too, never older");
}

/// FUSEE (a review's schedule): a delete that lost its SNAPSHOT race reported success as a
/// loser "linearized just before the winner", but a deletion is final: a get after both
/// returned the winning update's value. D's backup CASes stall while U's update runs whole;
/// D's fail, and it starts over from U's value instead.
#[test]
fn a_fusee_delete_that_loses_to_a_concurrent_update_deletes_after_it() {
    let (u, d, g) = (0, 1, 2);
    let mut lab = Lab::with(Protocol::Fusee, &[1_000, 1_000, 1_000]);
    let [p, b, c] = [lab.nodes[0], lab.nodes[1], lab.nodes[2]];
    lab.invoke(d, 1, delete());
    lab.step(d, p); // D reads the primary slot; its backup CASes wait on B and C
    assert_eq!(lab.queued(d, b) + lab.queued(d, c), 2, "D's backup CASes wait on B and C");
    lab.invoke(u, 1, update(b"from U"));
    assert_eq!(lab.run(u, 1, &[p, b, c], 50).expect("U completes").result, Ok(None));
    assert_eq!(lab.run(d, 1, &[p, b, c], 50).expect("D completes").result, Ok(None));
    assert!(lab.counter(d, "fusee_delete_retries") >= 1, "D lost its first race");
    lab.invoke(g, 1, get());
    let got = lab.run(g, 1, &[p, b, c], 50).expect("G completes");
    assert_eq!(got.result, Err(KvError::Deleted), "the delete completed before the get began");
}

/// FUSEE, the racing variant: D wins backup B, U wins C; rule 3 (the lowest value) picks U, as
/// a deletion carries the highest timestamp. D must not report success before deleting.
#[test]
fn a_fusee_delete_that_loses_the_snapshot_race_deletes_after_the_winner() {
    let (u, d, g) = (0, 1, 2);
    let mut lab = Lab::with(Protocol::Fusee, &[1_000, 1_000, 1_000]);
    let [p, b, c] = [lab.nodes[0], lab.nodes[1], lab.nodes[2]];
    lab.invoke(d, 1, delete());
    lab.invoke(u, 1, update(b"from U"));
    lab.step(d, p); // D reads v0
    for n in [p, b, c] {
        lab.step(u, n); // U's blocks everywhere, and U reads v0 on P
    }
    lab.step(d, b); // D's CAS wins B
    lab.step(u, c); // U's CAS wins C
    lab.step(d, c); // D's CAS on C fails (it sees U's)
    lab.step(u, b); // U's CAS on B fails (it sees D's): both recheck
    assert_eq!(lab.run(u, 1, &[p, b, c], 50).expect("U completes").result, Ok(None));
    assert_eq!(lab.run(d, 1, &[p, b, c], 50).expect("D completes").result, Ok(None));
    lab.invoke(g, 1, get());
    let got = lab.run(g, 1, &[p, b, c], 50).expect("G completes");
    assert_eq!(got.result, Err(KvError::Deleted), "a completed delete is never undone");
}

/// FUSEE (a review's schedule): a writer whose CAS reply on one backup came back after its
/// deadline gave up before its primary CAS, leaving its value on every backup and the old one
/// on the primary. Every later update, by anyone, lost to it (rule 2) and waited for a primary
/// change nobody would make: the key was unwritable for good, with nothing crashed. A loser now
/// finishes the winner's write after a chain timeout.
#[test]
fn a_fusee_writer_stalled_past_its_deadline_does_not_block_the_key() {
    let (w, x, g) = (0, 1, 2);
    let mut lab = Lab::with(Protocol::Fusee, &[1_000, 1_000, 1_000]);
    let [p, b, c] = [lab.nodes[0], lab.nodes[1], lab.nodes[2]];
    lab.invoke(w, 1, update(b"from W"));
    for n in [p, b, c] {
        lab.step(w, n); // W's blocks everywhere, and W reads the primary
    }
    lab.step(w, b); // W's CAS on B lands
    let slow = lab.apply(w, c, usize::MAX); // so does the one on C, but its reply is slow
    assert!(slow.is_some());
    lab.idle(w, 60); // W's deadline passes first
    assert_eq!(lab.done.get(&(w, 1)).map(|d| d.result.clone()), Some(Err(KvError::Timeout)));
    lab.deliver(w, slow); // late, ignored

    for id in 1..=3 {
        lab.invoke(x, id, update(format!("from X {id}").as_bytes()));
        let done = lab.run_timed(x, id, &[p, b, c], 20_000).expect("X's update finishes");
        assert_eq!(done.result, Ok(None), "update {id}");
    }
    assert!(lab.counter(x, "fusee_helped") >= 1, "X finished W's write first");
    lab.invoke(w, 2, update(b"W again"));
    assert_eq!(lab.run_timed(w, 2, &[p, b, c], 20_000).expect("W's next update finishes").result, Ok(None));
    lab.invoke(g, 1, get());
    let got = lab.run(g, 1, &[p, b, c], 50).expect("G completes");
    assert_eq!(got.result, Ok(Some(b"W again".to_vec())));
}

// ------------------------------------------------------------------------------------------
// Adversarial review (third round): helpers' copies land in a buffer its writer already
// rewrote (when rewrites kept their buffer).
// ------------------------------------------------------------------------------------------

/// Client `w`'s update to `value` lands whole on `node` (its reply held back) and its chains
/// to the other replicas stall; returns the held reply.
fn update_lands_only_on(
    lab: &mut Lab,
    w: usize,
    value: &[u8],
    node: MemNodeId,
) -> Option<(ChainTag, Result<Vec<VerbOutcome>, VerbError>)> {
    lab.invoke(w, 1, update(value));
    lab.widen(w);
    let reply = lab.apply(w, node, usize::MAX);
    assert!(reply.is_some(), "the update's chain on {node:?} is whole");
    reply
}

/// Client `v` updates the key to `value` on every replica and completes; its background
/// chains land everywhere.
fn update_everywhere(lab: &mut Lab, v: usize, value: &[u8]) {
    lab.invoke(v, 1, update(value));
    lab.widen(v); // chains to every replica
    let nodes = lab.nodes.clone();
    let done = lab.run(v, 1, &nodes, 20).expect("the update completes");
    assert_eq!(done.result, Ok(None), "the update");
    for n in nodes {
        land_all(lab, v, n);
    }
}

/// Applies every chain client `c` has queued on `node`, without delivering the replies (the
/// client stalls or has crashed; the verbs land).
fn land_all(lab: &mut Lab, c: usize, node: MemNodeId) {
    while lab.queued(c, node) > 0 {
        let _ = lab.apply(c, node, usize::MAX);
    }
}

/// A reader's lock round writes a GUESSED tuple's copy into its writer's buffer wherever the
/// writer's word was older — unconditionally, before its CASes. A stale writer that *won* its
/// lock used to rewrite in the **same buffer** at once (a review's schedule, 2026-12-07), so a
/// reader's lock chain that was merely slow (no recycling involved) could land after the
/// rewrite and overwrite the rewritten tuple T''s copy with T's. Its CAS of the word then fails
/// (the word is T' already), so the node kept T' as the word with T's bytes in the buffer: T'
/// had lost its value there, and once that node was T''s only holder in a live majority (T'
/// reached P and C; P crashes), every read of the key went round for good. A rewrite now takes
/// a fresh buffer.
///
/// W (clock behind V's) writes T on P only and stalls. R sees T twice and sends its lock round;
/// its chain to C is slow. V writes above T everywhere. W resumes on P and C, finds T stale,
/// wins its lock on P and C (no reader holds it anywhere), rewrites T' on P and C, and
/// completes. R's slow chain lands on C. P crashes: a read on B and C must return W's value —
/// B and C are a majority and nothing else went wrong.
#[test]
fn a_readers_slow_lock_chain_does_not_clobber_a_rewrite_in_the_same_buffer() {
    let (control, why) = rewrite_then_slow_reader_chain(false);
    assert_eq!(control.map(|d| d.result), Some(Ok(Some(b"from W".to_vec()))), "control (R's chain never lands): {why}");
    let (got, why) = rewrite_then_slow_reader_chain(true);
    let got = got.unwrap_or_else(|| panic!("the read never completes with B and C up: {why}"));
    assert_eq!(got.result, Ok(Some(b"from W".to_vec())), "R's slow chain landed on C: {why}");
}

/// The schedule above; `land_reader_chain`: R's slow lock chain lands on C after W's rewrite.
/// Returns the final read's completion (P crashed) and what it saw.
fn rewrite_then_slow_reader_chain(land_reader_chain: bool) -> (Option<Completion>, String) {
    let (g, w, v, r) = (0, 1, 2, 3);
    let mut lab = Lab::new(&[3_000, 1_000, 5_000, 3_000]);
    let [p, b, c] = [lab.nodes[0], lab.nodes[1], lab.nodes[2]];

    // W's update T lands whole on P; its chains elsewhere stall (B's for good).
    let w_on_p = update_lands_only_on(&mut lab, w, b"from W", p);

    // R: two iterations that read P and C see T as the maximum; R sends its lock round.
    lab.invoke(r, 1, get());
    let first = lab.queued_on(r);
    for n in first {
        lab.step(r, n);
    }
    // Iteration 2 asks every replica; P and C answer (C after R's iteration-1 chain, if any).
    lab.step(r, p);
    while lab.counter(r, "read_iterations_max") < 2 && lab.queued(r, c) > 0 {
        lab.step(r, c);
    }
    assert_eq!(lab.counter(r, "read_iterations_max"), 2, "R's second iteration is in");
    // R's lock round is the last chain queued on C: there it writes T's copy first.
    let lock_chain_on_c = lab.conns.get(&(r, c)).and_then(|q| q.back()).map(|p| p.verbs.clone()).unwrap();
    assert!(
        matches!(lock_chain_on_c[0], Verb::Write { .. }),
        "R's lock chain on C writes T's copy: {lock_chain_on_c:?}"
    );

    // V updates above T everywhere and completes (fresh guess).
    update_everywhere(&mut lab, v, b"from V");

    // W resumes on P and C only; it finds T stale, wins T's lock (no reader holds it) and
    // rewrites T' on P and C.
    lab.deliver(w, w_on_p);
    let wd = lab.run(w, 1, &[p, c], 60).expect("W completes on P and C");
    assert_eq!(wd.result, Ok(None));
    assert_eq!(
        lab.counter(w, "rewrites"),
        1,
        "W won its lock and rewrote in its buffer: {:?}",
        lab.clients[w].counters()
    );
    land_all(&mut lab, w, p);
    land_all(&mut lab, w, c); // W's VERIFIED flips

    // R's slow lock chain lands on C now (R's reply never matters).
    if land_reader_chain {
        land_all(&mut lab, r, c);
    }

    // P crashes. B and C are a majority of live replicas.
    lab.invoke(g, 1, get());
    // (P's chain times out after 2 ms; 10 µs pass per pass, so the read's 50 ms deadline is
    // reached well within the passes.)
    let got = lab.run_timed(g, 1, &[b, c], 10_000);
    let why = format!(
        "words on B {:x?}, C {:x?}; reader: {} iterations, {} fetch misses, {} restarts",
        meta_words_on(&mut lab, b),
        meta_words_on(&mut lab, c),
        lab.counter(g, "read_iterations_max"),
        lab.counter(g, "fetch_misses"),
        lab.counter(g, "read_restarts")
    );
    (got, why)
}

// ------------------------------------------------------------------------------------------
// Adversarial review (fourth round): rewrites in a fresh buffer, flagged REWRITE.
// ------------------------------------------------------------------------------------------

/// A stale writer that won its lock and finds its pool empty at the rewrite reports
/// `OutOfBuffers` — "certainly did not take effect" — but its tuple T stays on the nodes it
/// reached, and read rule c returns T's value to a reader that saw T as its maximum and then
/// the writer's *next* operation's first tuple. W (one buffer, taken by T) writes T on P only;
/// R's first iteration reads T as the maximum; V writes above T and completes; W resumes, wins
/// T's lock, and its rewrite fails with OutOfBuffers. After the grace period W updates again
/// (V2, in T's recycled buffer) and that write lands on C. R's second iteration (P and C) sees
/// V2 above T, takes T for an earlier *completed* operation of W and returns "from W": a value
/// no successful write ever wrote.
#[test]
fn a_rewrite_that_runs_out_of_buffers_is_never_returned_by_rule_c() {
    // Writer 0 owns the loaded key's buffer and does nothing; every writer has one buffer.
    let (v, w, r) = (1, 2, 3);
    let mut lab = Lab::shaped(Protocol::SwarmKv, &[3_000, 5_000, 1_000, 3_000], 3, Some(1));
    let (p, c) = (lab.nodes[0], lab.nodes[2]);

    // W's update T lands whole on P; its chains elsewhere stall.
    let w_on_p = update_lands_only_on(&mut lab, w, b"from W", p);

    // R's first iteration (majority-first, P among them) sees T as its maximum.
    lab.invoke(r, 1, get());
    let first = lab.queued_on(r);
    assert!(first.contains(&p), "R's first majority includes the primary: {first:?}");
    for n in first {
        lab.step(r, n);
    }
    assert_eq!(lab.counter(r, "read_iterations_max"), 1);

    // V updates above T everywhere and completes.
    update_everywhere(&mut lab, v, b"from V");

    // W resumes on P and C: T is stale, W wins T's lock, and the rewrite finds no buffer.
    lab.deliver(w, w_on_p);
    let wd = lab.run(w, 1, &[p, c], 60).expect("W completes on P and C");
    assert_eq!(lab.counter(w, "writer_lock_won"), 1, "{:?}", lab.clients[w].counters());
    // (It was OutOfBuffers, which `KvError` documents as "certainly did not take effect".)
    let w_failed_for_sure = wd.result.as_ref().is_err_and(|e| !e.is_unknown_outcome());

    // After the grace period W updates again; V2's chain lands whole on C (reply slow).
    lab.idle(w, 2);
    lab.invoke(w, 2, update(b"W again"));
    if !lab.done.contains_key(&(w, 2)) {
        if lab.queued(w, c) == 0 {
            lab.widen(w);
        }
        assert!(lab.apply(w, c, usize::MAX).is_some(), "V2 lands on C");
    }

    // R's second iteration, from P (T's only holder) and C.
    let got = lab.run(r, 1, &[p, c], 50).expect("R completes");
    assert!(
        !(w_failed_for_sure && got.result == Ok(Some(b"from W".to_vec()))),
        "R returned the value of W's update, which reported {:?} (certainly no effect); R: {:?}",
        wd.result,
        lab.clients[r].counters()
    );
}

/// A reader that wins the lock of a rewritten tuple T' (flagged REWRITE) marks it VERIFIED with
/// `CAS(id(T') -> id(T')|VERIFIED)`: the expected word lacks the flag, so the CAS fails on
/// every node the writer's own rewrite reached (their word is `T'|REWRITE`). If the writer
/// crashed before its own VERIFIED flip, T' stays GUESSED there for good and every later read
/// of the key takes a lock round (3 round trips) instead of one. Before the flag, the same
/// schedule left T' VERIFIED after the first read.
#[test]
fn a_reader_that_locks_a_rewritten_tuple_marks_it_verified() {
    let (w, v, r1, r2) = (0, 1, 2, 3);
    let mut lab = Lab::new(&[1_000, 5_000, 3_000, 3_000]);
    let [p, b, c] = [lab.nodes[0], lab.nodes[1], lab.nodes[2]];

    // W's update T lands whole on P; its chains elsewhere stall.
    let w_on_p = update_lands_only_on(&mut lab, w, b"from W", p);

    // V updates above T everywhere and completes.
    update_everywhere(&mut lab, v, b"from V");

    // W resumes on P and C, finds T stale, wins T's lock and sends its rewrite T'.
    lab.deliver(w, w_on_p);
    for _ in 0..20 {
        if lab.counter(w, "rewrites") > 0 {
            break;
        }
        lab.step(w, p);
        lab.step(w, c);
    }
    assert_eq!(lab.counter(w, "rewrites"), 1, "{:?}", lab.clients[w].counters());
    // T' lands on P and C (a majority); W crashes before any reply (no VERIFIED flip of its own).
    land_all(&mut lab, w, p);
    land_all(&mut lab, w, c);

    // R1 sees T' twice, locks it (installing it on B) and returns W's value.
    lab.invoke(r1, 1, get());
    let got = lab.run(r1, 1, &[p, b, c], 50).expect("R1 completes");
    assert_eq!(got.result, Ok(Some(b"from W".to_vec())));
    assert_eq!(lab.counter(r1, "reader_lock_won"), 1);
    for n in [p, b, c] {
        land_all(&mut lab, r1, n); // R1's VERIFIED flips
    }

    // Every later read should take one round trip, as after any reader's lock.
    for id in 1..=3 {
        lab.invoke(r2, id, get());
        let got = lab.run(r2, id, &[p, b, c], 50).expect("R2 completes");
        assert_eq!(got.result, Ok(Some(b"from W".to_vec())));
        assert_eq!(
            got.round_trips,
            1,
            "read {id} after R1's lock: words on P {:x?}, B {:x?}, C {:x?}",
            meta_words_on(&mut lab, p),
            meta_words_on(&mut lab, b),
            meta_words_on(&mut lab, c)
        );
    }
}

/// A reader's lock round installs the tuple it locks with `CAS(o -> id(X))`, which drops
/// `meta::REWRITE`: a rewritten tuple T' reaches the nodes the reader fills *unflagged*, and
/// read rule c, which now tells T' from W's next operation by the flag only, takes T (W's
/// first tuple of the same operation) for an earlier completed operation and returns it
/// without T' being on a majority.
///
/// Five replicas (majority 3). W's T lands on N1. R1's first iteration sees T as its maximum
/// (N1 is its only holder). V writes above T and completes. W resumes, finds T stale, wins its
/// lock and rewrites T' (flagged) — which lands on N0 only; W crashes. R2 sees T' twice and
/// locks it: its lock chain lands on N1 (T' installed there *without the flag*), then R2
/// stalls. R1's second iteration reads N1, N2, N3: its maximum is unflagged T' above T, so rule
/// c returns T's value. T' is on two nodes only: R3 (after R1) reads N2, N3, N4 and returns V's
/// value; R4 (after R3) reads N0, N1, N2, locks T' and returns W's again — W, V, W with each
/// value written once: not linearizable.
#[test]
fn a_reader_installed_rewrite_keeps_its_flag_for_rule_c() {
    let (w, v, r1, r2, r3, r4) = (0, 1, 2, 3, 4, 5);
    let mut lab = Lab::shaped(Protocol::SwarmKv, &[1_000, 5_000, 3_000, 3_000, 3_000, 3_000], 5, None);
    let n: Vec<MemNodeId> = lab.nodes.clone();
    assert_eq!(n.len(), 5);

    // W's update T lands whole on N1 only; its other chains stall.
    lab.invoke(w, 1, update(b"from W"));
    if lab.queued(w, n[1]) == 0 {
        lab.widen(w);
    }
    let w_on_n1 = lab.apply(w, n[1], usize::MAX);
    assert!(w_on_n1.is_some());

    // R1's first iteration sees T as its maximum (its majority includes N1).
    lab.invoke(r1, 1, get());
    if lab.queued(r1, n[1]) == 0 {
        lab.widen(r1);
    }
    let mut answered = 0;
    for &x in &[n[1], n[0], n[2], n[3], n[4]] {
        if lab.counter(r1, "read_iterations_max") == 0 && lab.queued(r1, x) > 0 {
            lab.step(r1, x);
            answered += 1;
        }
    }
    assert_eq!(lab.counter(r1, "read_iterations_max"), 1, "R1's first iteration ({answered} replies)");

    // V updates above T everywhere and completes.
    update_everywhere(&mut lab, v, b"from V");

    // W resumes, finds T stale, wins T's lock and sends its rewrite T'.
    lab.deliver(w, w_on_n1);
    for _ in 0..20 {
        if lab.counter(w, "rewrites") > 0 {
            break;
        }
        for &x in &n {
            if lab.counter(w, "rewrites") == 0 {
                lab.step(w, x);
            }
        }
    }
    assert_eq!(lab.counter(w, "rewrites"), 1, "{:?}", lab.clients[w].counters());
    // T' lands on N0 only; W crashes.
    land_all(&mut lab, w, n[0]);

    // R2 sees T' twice (N0, N1, N2) and sends its lock round; only its chain to N1 lands.
    lab.invoke(r2, 1, get());
    for _ in 0..10 {
        if lab.counter(r2, "read_iterations_max") >= 2 {
            break;
        }
        if lab.queued_on(r2).iter().all(|x| ![n[0], n[1], n[2]].contains(x)) {
            lab.widen(r2);
        }
        for &x in &[n[0], n[1], n[2]] {
            if lab.counter(r2, "read_iterations_max") < 2 && lab.queued(r2, x) > 0 {
                lab.step(r2, x);
            }
        }
    }
    assert_eq!(lab.counter(r2, "read_iterations_max"), 2);
    let lock_chain = lab.conns.get(&(r2, n[1])).and_then(|q| q.back()).map(|p| p.verbs.clone()).unwrap();
    assert!(matches!(lock_chain[0], Verb::Write { .. }), "R2's lock chain on N1 installs T': {lock_chain:?}");
    land_all(&mut lab, r2, n[1]);
    let words = format!(
        "words on N0 {:x?}, N1 {:x?}, N2 {:x?}",
        meta_words_on(&mut lab, n[0]),
        meta_words_on(&mut lab, n[1]),
        meta_words_on(&mut lab, n[2])
    );

    // R1's second iteration: N1, N2, N3.
    // (N0, the primary, is slow: R1 waits for its chain to time out.)
    let got1 = lab.run_timed(r1, 1, &[n[1], n[2], n[3]], 10_000);
    let got1 = got1.unwrap_or_else(|| {
        panic!(
            "R1 stuck: {:?}; queued {:?}; {words}",
            lab.clients[r1].counters(),
            n.iter().map(|x| lab.queued(r1, *x)).collect::<Vec<_>>()
        )
    });
    // R3 after R1: N2, N3, N4.
    lab.invoke(r3, 1, get());
    let got3 = lab.run_timed(r3, 1, &[n[2], n[3], n[4]], 10_000).expect("R3 completes");
    // R4 after R3: N0, N1, N2.
    lab.invoke(r4, 1, get());
    let got4 = lab.run_timed(r4, 1, &[n[0], n[1], n[2]], 10_000).expect("R4 completes");
    let results: Vec<_> = [&got1, &got3, &got4]
        .iter()
        .map(|g| g.result.clone().map(|v| String::from_utf8_lossy(&v.unwrap_or_default()).into_owned()))
        .collect();
    let fetches = lab.counter(r1, "fetches");
    assert!(
        !(results[0] == Ok("from W".into()) && results[1] == Ok("from V".into()) && results[2] == Ok("from W".into())),
        "sequential reads returned {results:?} (R1 fetches: {fetches}); {words}"
    );
}

/// The node of the key's first majority besides the primary (client `c`'s just-invoked
/// operation sent its majority-first round to P and this node).
fn majority_other(lab: &Lab, c: usize) -> MemNodeId {
    let others: Vec<MemNodeId> = lab.nodes[1..].iter().copied().filter(|n| lab.queued(c, *n) > 0).collect();
    assert_eq!(others.len(), 1, "a majority-first round: P and one other replica");
    others[0]
}

/// Steps 1 to 4 of the schedule below, with W = client 0, D = 1, R = 2: returns the lab, P and
/// M (R's chain to M is stalled, W's chain to M is queued).
fn an_update_reports_deleted_while_a_read_waits() -> (Lab, MemNodeId, MemNodeId) {
    let (w, d, r) = (0, 1, 2);
    let mut lab = Lab::new(&[1_000, 1_000, 1_000]);
    let p = lab.nodes[0];
    lab.invoke(d, 1, delete());
    let m = majority_other(&lab, d);
    let o = *lab.nodes.iter().find(|n| **n != p && **n != m).unwrap();
    lab.widen(d);
    assert!(lab.apply(d, o, usize::MAX).is_some(), "D's chain runs whole on O (its reply is lost)");

    lab.invoke(w, 1, update(b"x0 from W"));
    assert_eq!(majority_other(&lab, w), m);
    lab.step(w, p);
    lab.widen(w);
    lab.step(w, o);
    assert_eq!(lab.counter(w, "stale_guesses"), 1, "W saw D's deletion on O");

    lab.invoke(r, 1, get());
    assert_eq!(majority_other(&lab, r), m);
    lab.step(r, p);
    lab.step(r, m);
    assert!(!lab.done.contains_key(&(r, 1)));
    lab.step(r, p);
    assert!(lab.queued(r, m) > 0, "R's second iteration waits for M");

    let first = lab.run(w, 1, &[p, o], 20).expect("W's first update completes on P and O");
    assert_eq!(first.result, Err(KvError::Deleted), "{first:?}");
    (lab, p, m)
}

/// A review's schedule (2026-12-08): read rule c returned the value of an update that
/// reported `Deleted` (rule 6: it did not take effect). P primary, M the key's first
/// majority's other node, O the third.
/// 1. D deletes; its chain lands on O only (its chains to P and M stall for good).
/// 2. W updates (tuple x0): lands on P; its chain to M stalls; the round widens to O, which
///    shows the deletion: x0 is stale.
/// 3. R reads P and M: x0 is the maximum. Its second iteration's chain to P runs at once
///    (x0, no deletion yet); its chain to M stalls.
/// 4. W races for x0 with the deletion as M: writes the deletion on P, wins on P and O, and
///    reports `Deleted`.
/// 5. W's stalled chains land on M (x0 there, no deletion), and W invokes its next update X.
///    Before the fix X landed on M; now W writes nothing on the key again and X reports
///    `Deleted` at once.
/// 6. R's chain to M runs: before the fix, {P: x0, M: X} made rule c return x0.
#[test]
fn a_read_never_returns_an_update_that_reported_deleted() {
    let (w, r) = (0, 2);
    let (mut lab, p, m) = an_update_reports_deleted_while_a_read_waits();

    while lab.queued(w, m) > 0 {
        lab.step(w, m);
    }
    lab.invoke(w, 2, update(b"X from W"));
    let wrote_more: usize = lab.nodes.iter().map(|n| lab.queued(w, *n)).sum();
    while lab.queued(w, m) > 0 {
        lab.step(w, m);
    }

    lab.step(r, m);
    let got = lab.run(r, 1, &[p, m], 20).expect("R completes on P and M");
    assert_ne!(got.result, Ok(Some(b"x0 from W".to_vec())), "R returned the value of an update that reported Deleted");
    assert_eq!(wrote_more, 0, "W wrote on the key after its update reported Deleted");
    let second = lab.done.get(&(w, 2)).cloned().expect("W's next update reports at once");
    assert_eq!(second.result, Err(KvError::Deleted), "{second:?}");
}

/// From the review of that fix (2026-12-08): W's "writes nothing more after `Deleted`" lived
/// in its memory only. The schedule above up to W's update reporting `Deleted` and its stalled
/// chains landing on M; then W's process restarts with the same writer id (no memory of the
/// outcome) and updates again: its tuple X lands on M before the deletion does, and R's chain
/// to M then saw {P: x0, M: X}: rule c returned x0. Now a client's tuples on a key carry
/// REWRITE until one of its own operations there has a definite outcome, and rule c skips them.
#[test]
fn a_restarted_writer_does_not_make_a_read_return_an_update_that_reported_deleted() {
    let (w, r) = (0, 2);
    let (mut lab, p, m) = an_update_reports_deleted_while_a_read_waits();
    // W's stalled chains land on M; their replies are lost with W's process.
    while lab.queued(w, m) > 0 {
        let _ = lab.apply(w, m, usize::MAX);
    }
    let x0_on_m = meta_words_on(&mut lab, m)[w];
    assert_ne!(x0_on_m, 0, "x0 is on M");
    let deletion_on_m = |lab: &mut Lab| meta_words_on(lab, m).iter().any(|x| meta::is_deleted(*x));
    assert!(!deletion_on_m(&mut lab), "the deletion is not on M");

    // W restarts (same writer id, nothing loaded) and updates the key again, its chains on M
    // and P only, until its tuple X is on M.
    let layout = lab.clients[w].config().layout.clone();
    lab.clients[w] = Client::new(ClientConfig::new(Protocol::SwarmKv, w as u32, layout, LocalTime(0)));
    lab.conns.retain(|(c, _), _| *c != w);
    lab.idle(w, 1);
    lab.invoke(w, 2, update(b"X from W"));
    let mut landed = false;
    for _ in 0..100 {
        let Some(&n) = [m, p].iter().find(|n| lab.queued(w, **n) > 0) else {
            lab.idle(w, 1);
            continue;
        };
        lab.step(w, n);
        if meta::id(meta_words_on(&mut lab, m)[w]) > meta::id(x0_on_m) {
            landed = true;
            break;
        }
    }
    assert!(landed, "the restarted W's tuple X never landed on M");
    assert!(!deletion_on_m(&mut lab), "the deletion is still not on M");

    lab.step(r, m);
    let got = lab.run(r, 1, &[p, m], 20).expect("R completes on P and M");
    assert_ne!(got.result, Ok(Some(b"x0 from W".to_vec())), "R returned the value of an update that reported Deleted");
}

/// A stale writer that won its lock and finds the timestamp space exhausted at the rewrite
/// reported `TimestampExhausted`, a definite failure, although its tuple T was on P (a reader
/// may have returned it). V's clock is a few units below the 35-bit limit; W's update T lands
/// on P only, V updates above T everywhere, W resumes, finds T stale, wins T's lock, and the
/// rewrite needs a timestamp above V's. The outcome is unknown (`Timeout`), as when the
/// rewrite runs out of buffers.
#[test]
fn a_rewrite_out_of_timestamps_reports_an_unknown_outcome() {
    let (v, w) = (0, 1);
    let mut lab = Lab::new(&[3_000, 1_000]);
    let (p, c) = (lab.nodes[0], lab.nodes[2]);
    let w_on_p = update_lands_only_on(&mut lab, w, b"from W", p);
    // V's next guess is 20 units (each 16 ns) below the deletion timestamp, the limit.
    lab.now[v] = LocalTime((kairos_swarm::meta::DELETED_TS - 20) * kairos_swarm::meta::TS_UNIT_NS);
    update_everywhere(&mut lab, v, b"from V");
    lab.deliver(w, w_on_p);
    let wd = lab.run(w, 1, &[p, c], 60).expect("W completes on P and C");
    assert_eq!(lab.counter(w, "rewrites"), 1, "{:?}", lab.clients[w].counters());
    assert_eq!(wd.result, Err(KvError::Timeout), "T is on P: the outcome is unknown");
}
