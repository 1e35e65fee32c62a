//! Fixtures of the schedule tests that drive two shards of three real servers message by
//! message: shard 0 on nodes 0–2, shard 1 on nodes 3–5, replica 0 leading both in view 0.

use kairos_core::NodeId;
use kairos_tiga::msg::ShardId;
use kairos_tiga::ops::key_id;
use kairos_tiga::server::Server;
use kairos_tiga::topology::{TigaConfig, Topology};

pub const COORDINATOR: NodeId = NodeId(10);
pub const VM: NodeId = NodeId(20);

pub fn topology() -> Topology {
    Topology {
        shards: vec![vec![NodeId(0), NodeId(1), NodeId(2)], vec![NodeId(3), NodeId(4), NodeId(5)]],
        leader: vec![0, 0],
    }
}

pub fn server(shard: ShardId, replica: u32) -> Server {
    Server::new(topology(), TigaConfig::default(), shard, replica).with_view_managers(vec![VM])
}

/// Test key `k` as bytes: a key on shard `k mod 2`.
pub fn tk(k: u64) -> Vec<u8> {
    (0u32..).map(|j| format!("k{k}-{j}").into_bytes()).find(|b| key_id(b) % 2 == k % 2).expect("some suffix")
}
