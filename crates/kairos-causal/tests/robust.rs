//! No handler panics on any message content.

use bson::{doc, Bson, Document};
use kairos_causal::msg::{Entry, MongoRequest, Op, OpPos, PeerBody, PeerMsg};
use kairos_causal::{CausalMsg, ClientOp, Member, MemberConfig, ReadConcern, Request, WriteConcern};
use kairos_clock::{ClusterTime, Signature, SignedClusterTime, TimeProof};
use kairos_core::harness::{sent, RoleHarness};
use kairos_core::{Ctx, LocalTime, NodeId, Process, Rng, TimerId};
use rand::{Rng as _, SeedableRng};
use std::sync::Arc;
use std::time::Duration;

fn ct(rng: &mut Rng) -> ClusterTime {
    match rng.random_range(0..3) {
        0 => ClusterTime::new(rng.random(), rng.random()),
        1 => ClusterTime::new(1_767_225_600 + rng.random_range(0..5), rng.random_range(0..5)),
        _ => ClusterTime::ZERO,
    }
}

fn signed(rng: &mut Rng) -> Option<SignedClusterTime> {
    let time = ct(rng);
    match rng.random_range(0..3) {
        0 => None,
        1 => Some(SignedClusterTime::unsigned(time)),
        _ => Some(SignedClusterTime {
            time,
            signature: Some(Signature { hash: TimeProof([rng.random(); 20]), key_id: rng.random() }),
        }),
    }
}

#[test]
fn random_messages_never_panic_a_member() {
    let members: Vec<NodeId> = (0..3).map(NodeId).collect();
    let cfg = Arc::new(MemberConfig::new(members));
    let mut rng = Rng::seed_from_u64(5);
    for round in 0..20 {
        let mut m = Member::new(cfg.clone(), round % 3);
        let mut effects = Vec::new();
        let mut node_rng = Rng::seed_from_u64(round as u64);
        let mut now = LocalTime::from_secs(1_767_225_600);
        m.on_start(&mut Ctx::new(NodeId(round % 3), now, &mut node_rng, &mut effects));
        for _ in 0..2_000 {
            now = now + std::time::Duration::from_millis(rng.random_range(0..300));
            let entries: Vec<Entry> = (0..rng.random_range(0..4))
                .map(|_| Entry {
                    optime: ct(&mut rng),
                    term: rng.random_range(0..4),
                    op: Op::Append { key: 1, value: rng.random() },
                    origin: None,
                })
                .collect();
            let pos = OpPos { optime: ct(&mut rng), term: rng.random_range(0..4) };
            let body = match rng.random_range(0..7) {
                0 => PeerBody::RequestVote { last: pos, dry_run: rng.random() },
                1 => PeerBody::VoteReply { granted: rng.random(), dry_run: rng.random() },
                2 => PeerBody::Heartbeat { commit_point: ct(&mut rng) },
                3 => PeerBody::Pull { last: pos },
                4 => PeerBody::Batch {
                    after: pos,
                    entries,
                    commit_point: ct(&mut rng),
                    rollback_to: Some(ct(&mut rng)).filter(|_| rng.random()),
                },
                5 => PeerBody::NoopRequest { at_least: ct(&mut rng) },
                _ => PeerBody::HeartbeatAck { applied: pos },
            };
            let msg = if rng.random_bool(0.3) {
                CausalMsg::Request(Request {
                    id: rng.random(),
                    op: if rng.random() {
                        ClientOp::Read { key: rng.random() }
                    } else {
                        ClientOp::Append { key: 1, value: rng.random() }
                    },
                    read_concern: if rng.random() { ReadConcern::Local } else { ReadConcern::Majority },
                    write_concern: if rng.random() { WriteConcern::W1 } else { WriteConcern::Majority },
                    after_cluster_time: Some(ct(&mut rng)).filter(|_| rng.random()),
                    cluster_time: signed(&mut rng),
                    max_time_ms: rng.random(),
                    secondary_ok: rng.random(),
                    term: rng.random_bool(0.5).then(|| rng.random_range(0..5)),
                })
            } else {
                CausalMsg::Peer(PeerMsg {
                    term: rng.random_range(0..5),
                    cluster_time: signed(&mut rng),
                    body,
                    seq: rng.random_range(0..8),
                })
            };
            let from = NodeId(rng.random_range(0..5));
            let mut ctx = Ctx::new(NodeId(round % 3), now, &mut node_rng, &mut effects);
            if rng.random_bool(0.1) {
                m.on_timer(&mut ctx, TimerId(rng.random_range(0..4)));
            } else {
                m.on_message(&mut ctx, from, msg);
            }
            effects.clear();
        }
        // The oplog stays ordered by optime whatever arrived.
        assert!(m.oplog().windows(2).all(|w| w[0].optime < w[1].optime));
    }
}

/// A BSON value of any type, biased to the edges a command parser meets: numbers at their
/// limits, NaN, fractions, field names with `$` and `.`, nested documents and arrays.
fn any_bson(rng: &mut Rng, depth: u32) -> Bson {
    const WORDS: [&str; 14] =
        ["a", "b", "_id", "$set", "$inc", "$unset", "$push", "$eq", "$gt", "$each", "a.b", "", "majority", "local"];
    let word = |rng: &mut Rng| WORDS[rng.random_range(0..WORDS.len())].to_string();
    match rng.random_range(0..if depth == 0 { 9 } else { 11 }) {
        0 => Bson::Int32([0, 1, -1, i32::MAX, i32::MIN, 7][rng.random_range(0..6)]),
        1 => Bson::Int64([0, 1, -1, i64::MAX, i64::MIN, 1 << 53][rng.random_range(0..6)]),
        2 => Bson::Double([0.0, -0.0, 1.5, -3.0, f64::NAN, f64::INFINITY, 1e300, 2.0][rng.random_range(0..8)]),
        3 => Bson::String(word(rng)),
        4 => Bson::Boolean(rng.random()),
        5 => Bson::Null,
        6 => Bson::Timestamp(bson::Timestamp { time: rng.random_range(0..3), increment: rng.random() }),
        7 => Bson::Binary(bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![rng.random(); 3] }),
        8 => Bson::ObjectId(bson::oid::ObjectId::from_bytes([rng.random(); 12])),
        9 => Bson::Document(any_doc(rng, depth - 1)),
        _ => Bson::Array((0..rng.random_range(0..4)).map(|_| any_bson(rng, depth - 1)).collect()),
    }
}

fn any_doc(rng: &mut Rng, depth: u32) -> Document {
    const KEYS: [&str; 12] = ["_id", "a", "b", "$set", "$inc", "$unset", "$push", "$eq", "a.b", "$db", "q", "u"];
    (0..rng.random_range(0..4))
        .map(|_| (KEYS[rng.random_range(0..KEYS.len())].to_string(), any_bson(rng, depth)))
        .collect()
}

/// A MongoDB command as a driver might send it, or mangle it: a known name (or not) with a
/// collection (or anything), and any of the fields the member reads, each well-formed or of
/// any type.
fn any_command(rng: &mut Rng) -> Document {
    const NAMES: [&str; 16] = [
        "insert",
        "update",
        "delete",
        "drop",
        "find",
        "count",
        "getMore",
        "killCursors",
        "hello",
        "isMaster",
        "ping",
        "buildInfo",
        "getParameter",
        "endSessions",
        "explain",
        "",
    ];
    let mut cmd = Document::new();
    let name = NAMES[rng.random_range(0..NAMES.len())];
    let coll = if rng.random_bool(0.8) { Bson::String("c".into()) } else { any_bson(rng, 1) };
    cmd.insert(name, if name == "getMore" && rng.random() { Bson::Int64(rng.random_range(0..4)) } else { coll });
    let field = |cmd: &mut Document, rng: &mut Rng, key: &str, good: Bson| {
        if rng.random_bool(0.5) {
            let v = if rng.random_bool(0.7) { good } else { any_bson(rng, 2) };
            cmd.insert(key, v);
        }
    };
    let docs =
        |rng: &mut Rng| Bson::Array((0..rng.random_range(0..3)).map(|_| Bson::Document(any_doc(rng, 2))).collect());
    let d = docs(rng);
    field(&mut cmd, rng, "documents", d);
    let updates = Bson::Array(
        (0..rng.random_range(0..3))
            .map(|_| {
                let mut u = doc! { "q": any_doc(rng, 1), "u": any_bson(rng, 2) };
                if rng.random() {
                    u.insert("upsert", any_bson(rng, 0));
                }
                if rng.random() {
                    u.insert("multi", any_bson(rng, 0));
                }
                Bson::Document(u)
            })
            .collect(),
    );
    field(&mut cmd, rng, "updates", updates);
    let deletes = Bson::Array(
        (0..rng.random_range(0..3))
            .map(|_| Bson::Document(doc! { "q": any_doc(rng, 1), "limit": any_bson(rng, 0) }))
            .collect(),
    );
    field(&mut cmd, rng, "deletes", deletes);
    let (filter, projection) = (Bson::Document(any_doc(rng, 2)), Bson::Document(any_doc(rng, 1)));
    field(&mut cmd, rng, "filter", filter);
    field(&mut cmd, rng, "projection", projection);
    for key in ["limit", "batchSize", "skip", "maxTimeMS", "txnNumber"] {
        let v = any_bson(rng, 0);
        field(&mut cmd, rng, key, v);
    }
    for key in ["singleBatch", "ordered"] {
        let v = Bson::Boolean(rng.random());
        field(&mut cmd, rng, key, v);
    }
    let cursors = Bson::Array(vec![any_bson(rng, 0)]);
    field(&mut cmd, rng, "cursors", cursors);
    field(&mut cmd, rng, "collection", Bson::String("c".into()));
    field(&mut cmd, rng, "$db", Bson::String("test".into()));
    let lsid = Bson::Document(doc! { "id": any_bson(rng, 0) });
    field(&mut cmd, rng, "lsid", lsid);
    let t = bson::Timestamp { time: 1_767_225_600 + rng.random_range(0..3), increment: rng.random_range(0..3) };
    let read_concern = Bson::Document(doc! { "level": any_bson(rng, 0), "afterClusterTime": t });
    field(&mut cmd, rng, "readConcern", read_concern);
    let write_concern = Bson::Document(doc! { "w": any_bson(rng, 0), "wtimeout": any_bson(rng, 0) });
    field(&mut cmd, rng, "writeConcern", write_concern);
    let cluster_time = Bson::Document(doc! {
        "clusterTime": t,
        "signature": {
            "hash": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![rng.random(); 20] },
            "keyId": any_bson(rng, 0),
        },
    });
    field(&mut cmd, rng, "$clusterTime", cluster_time);
    cmd
}

#[test]
fn random_mongo_commands_never_panic_a_member() {
    let mut rng = Rng::seed_from_u64(11);
    for round in 0..6u64 {
        // A primary of term 1 (it stood and member 1 voted for it), or a secondary.
        let cfg = Arc::new(MemberConfig::new((0..3).map(NodeId).collect()));
        let mut h = RoleHarness::new(NodeId(0), Member::new(cfg.clone(), 0), round);
        h.start();
        if round % 2 == 0 {
            // Its election timeout passes: it asks for a dry run, then stands, member 1 saying
            // yes each time.
            let mut effects = h.advance(cfg.election_timeout * 2 + Duration::from_millis(10));
            for _ in 0..2 {
                let ask = sent(&effects).into_iter().find_map(|(_, m)| match m {
                    CausalMsg::Peer(PeerMsg { term, body: PeerBody::RequestVote { dry_run, .. }, .. }) => {
                        Some((*term, *dry_run))
                    }
                    _ => None,
                });
                let (term, dry_run) = ask.expect("a vote request");
                let body = PeerBody::VoteReply { granted: true, dry_run };
                effects = h.deliver(NodeId(1), CausalMsg::Peer(PeerMsg { term, cluster_time: None, body, seq: 1 }));
            }
        }
        assert_eq!(h.role().is_primary(), round % 2 == 0, "round {round}");
        let (mut replies, mut ok) = (0, 0);
        for id in 0..4_000 {
            let command = if rng.random_bool(0.05) {
                // Not BSON at all, or cut short.
                let mut bytes = bson::to_vec(&any_command(&mut rng)).unwrap();
                bytes.truncate(rng.random_range(0..bytes.len()));
                bytes
            } else {
                bson::to_vec(&any_command(&mut rng)).unwrap()
            };
            let effects = h.deliver(NodeId(9), CausalMsg::MongoRequest(MongoRequest { id, command }));
            for (_, m) in sent(&effects) {
                if let CausalMsg::MongoReply(r) = m {
                    replies += 1;
                    let reply = Document::from_reader(&mut r.reply.as_slice()).expect("a reply is BSON");
                    ok += usize::from(reply.get_f64("ok") == Ok(1.0));
                }
            }
            if rng.random_bool(0.05) {
                h.advance(Duration::from_millis(rng.random_range(0..2_000)));
            }
        }
        // Most commands are answered at once (a write waits for its write concern), and
        // enough of them well-formed to run.
        eprintln!("round {round}: {replies} replies, {ok} ok");
        assert!(replies > 2_000 && ok > 200, "round {round}: {replies} replies, {ok} ok");
    }
}

/// `{"a": {"a": {... {} ...}}}`, `depth` levels of nesting, as BSON bytes.
fn nested(depth: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + 8 * depth);
    for i in (1..=depth).rev() {
        out.extend_from_slice(&((5 + 8 * i) as i32).to_le_bytes());
        out.extend_from_slice(&[0x03, b'a', 0]);
    }
    out.extend_from_slice(&[5, 0, 0, 0, 0]);
    out.extend(std::iter::repeat_n(0u8, depth));
    out
}

/// A review's input: one OP_MSG of 8 MB (under the size limits) nested a million levels deep.
/// Converting it recursed once per level and aborted the process on a 2 MiB stack (a tokio
/// worker's, where `kairos serve --mongo-listen` parses); it is refused, like MongoDB's
/// `maxBSONDepth`, and a member handed such a command by a peer refuses it the same way.
#[test]
fn a_command_nested_past_the_depth_limit_is_refused_not_a_stack_overflow() {
    use kairos_causal::mongo::wire::{
        decode_document, parse_header, parse_message, HEADER_LEN, MAX_BSON_DEPTH, OP_MSG,
    };
    let doc = nested(1_000_000);
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&((HEADER_LEN + 4 + 1 + doc.len()) as i32).to_le_bytes());
    bytes.extend_from_slice(&1i32.to_le_bytes());
    bytes.extend_from_slice(&0i32.to_le_bytes());
    bytes.extend_from_slice(&OP_MSG.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.push(0);
    bytes.extend_from_slice(&doc);
    let refused = std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(move || {
            let h: [u8; HEADER_LEN] = bytes[..HEADER_LEN].try_into().unwrap();
            let header = parse_header(&h).expect("a valid header");
            let wire = parse_message(&header, &bytes[HEADER_LEN..]).map(|_| ()).map_err(|e| e.to_string());
            let member = decode_document(&doc).map(|_| ()).map_err(|e| e.to_string());
            (wire, member)
        })
        .unwrap()
        .join()
        .expect("no stack overflow");
    let limit = format!("nested deeper than {MAX_BSON_DEPTH} levels");
    assert!(refused.0.as_ref().is_err_and(|e| e.contains(&limit)), "{:?}", refused.0);
    assert!(refused.1.as_ref().is_err_and(|e| e.contains(&limit)), "{:?}", refused.1);
    // At the limit it decodes.
    let ok = decode_document(&nested(MAX_BSON_DEPTH - 1)).expect("200 levels decode");
    assert!(ok.contains_key("a"));
}
