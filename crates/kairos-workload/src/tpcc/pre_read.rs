//! The pre-read of a multi-shot TPC-C transaction, a round trip of its own before the
//! transaction runs one-shot (the Tiga paper's form; every protocol here uses it alike).
//!
//! Payment and order-status name their customer by last name 60 % of the time (TPC-C 2.5.1.2,
//! 2.6.1.2). Before such a transaction runs, its coordinator asks the leader of the customer's
//! warehouse's shard which customer the name picks ([`PreReadRequest`], answered from the
//! shard's tables with [`answer`]); the answer names the customer by id ([`PreReadAnswer`]),
//! and the transaction then runs one-shot with that id ([`resolve`]). The invocation is
//! recorded before the pre-read, so the transaction's latency includes the round trip.
//!
//! **Validation.** The paper validates the pre-read in the one-shot part (abort and retry if it
//! changed). TPC-C never adds a customer or changes a name, so the name picks the same customer
//! at every replica at every time: the pre-read cannot go stale and there is nothing to validate
//! (the one-shot part checks the id exists, as for any id). A pre-read may therefore be answered
//! by any replica holding the warehouse; the coordinator asks the shard's leader first and the
//! next replica after a timeout.
//!
//! **Bad input.** An answer is taken only from a replica of the asked warehouse's shard, for a
//! transaction waiting for exactly that pre-read; any other is ignored. A customer id the
//! warehouse does not have makes the one-shot part fail as a bad id does ([`super::PieceError`]).

use serde::{Deserialize, Serialize};

use super::db::WarehouseDb;
use super::input::CustomerRef;
use super::piece::{look_up_customer, Piece, Step};
use crate::micro::Pieces;
use crate::txn::{ShardId, TxnId};

/// What a pre-read looks up: the customer of district `(w, d)` with this last name (index).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PreRead {
    pub w: u32,
    pub d: u32,
    pub last_name: u32,
}

impl PreRead {
    /// The shard holding warehouse `w` (a warehouse's keys all map there: `super::keys`).
    pub fn shard(&self, shard_count: usize) -> ShardId {
        crate::shard_of(u64::from(self.w), shard_count)
    }
}

/// The request, coordinator → replica.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreReadRequest {
    pub txn: TxnId,
    pub read: PreRead,
}

/// The answer, replica → coordinator: the customer's id, or `None` if the district has no
/// customer of that name (a bad name; the transaction then runs by name and fails there).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreReadAnswer {
    pub txn: TxnId,
    pub read: PreRead,
    pub customer: Option<u32>,
}

/// A protocol's message type carries pre-reads: it has the variants `PreRead(PreReadRequest)`
/// and `PreReadAnswer(PreReadAnswer)`, and says so with [`crate::impl_pre_read_msg!`].
pub trait PreReadMsg: Sized {
    fn pre_read_request(request: PreReadRequest) -> Self;
    fn pre_read_answer(answer: PreReadAnswer) -> Self;
}

/// Implements [`PreReadMsg`] for a message enum with the variants `PreRead(PreReadRequest)` and
/// `PreReadAnswer(PreReadAnswer)`.
#[macro_export]
macro_rules! impl_pre_read_msg {
    ($msg:ident) => {
        impl $crate::tpcc::PreReadMsg for $msg {
            fn pre_read_request(request: $crate::tpcc::PreReadRequest) -> Self {
                $msg::PreRead(request)
            }
            fn pre_read_answer(answer: $crate::tpcc::PreReadAnswer) -> Self {
                $msg::PreReadAnswer(answer)
            }
        }
    };
}

/// The pre-read `pieces` need before they can run one-shot: the first step naming a customer
/// by last name (payment names one customer, order-status one).
pub fn pre_read_of(pieces: &[Piece]) -> Option<PreRead> {
    pieces.iter().flat_map(|p| p.steps.iter().map(move |s| (p.w, s))).find_map(|(w, step)| match *step {
        Step::PaymentAt { customer_w, customer_d, customer: CustomerRef::LastName(n), .. } => {
            Some(PreRead { w: customer_w, d: customer_d, last_name: n })
        }
        Step::PaymentBy { d, customer: CustomerRef::LastName(n), .. }
        | Step::OrderStatus { d, customer: CustomerRef::LastName(n) } => Some(PreRead { w, d, last_name: n }),
        _ => None,
    })
}

/// Answers `request` from the warehouse's tables, if this replica holds them among `dbs`.
pub fn answer<'a>(dbs: impl IntoIterator<Item = &'a WarehouseDb>, request: PreReadRequest) -> Option<PreReadAnswer> {
    let db = dbs.into_iter().find(|db| db.w == request.read.w)?;
    let customer = look_up_customer(db, request.read.d, request.read.last_name);
    Some(PreReadAnswer { txn: request.txn, read: request.read, customer })
}

/// `pieces` with the customer `read` names replaced by its id `customer`.
pub fn resolve(pieces: &[Piece], read: PreRead, customer: u32) -> Pieces {
    let by_id = |c: &mut CustomerRef| {
        if *c == CustomerRef::LastName(read.last_name) {
            *c = CustomerRef::Id(customer);
        }
    };
    let mut out = pieces.to_vec();
    for piece in &mut out {
        let w = piece.w;
        for step in &mut piece.steps {
            match step {
                Step::PaymentAt { customer_w, customer_d, customer, .. }
                    if (*customer_w, *customer_d) == (read.w, read.d) =>
                {
                    by_id(customer)
                }
                Step::PaymentBy { d, customer, .. } | Step::OrderStatus { d, customer }
                    if (w, *d) == (read.w, read.d) =>
                {
                    by_id(customer)
                }
                _ => {}
            }
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tpcc::input::TpccTxn;
    use crate::tpcc::piece::split;
    use crate::tpcc::{TpccScale, WarehouseDb};
    use kairos_core::NodeId;

    #[test]
    fn a_by_name_payment_is_pre_read_at_the_customers_warehouse_and_resolved_there_and_at_home() {
        let scale = TpccScale { warehouses: 2, ..TpccScale::default() };
        let db = WarehouseDb::populate(&scale, 3, 1);
        let payment = TpccTxn::Payment {
            w: 0,
            d: 2,
            customer_w: 1,
            customer_d: 4,
            customer: CustomerRef::LastName(7),
            amount_cents: 100,
            date: 5,
        };
        let pieces = split(&payment);
        let read = pre_read_of(&pieces).expect("a by-name payment needs a pre-read");
        assert_eq!(read, PreRead { w: 1, d: 4, last_name: 7 });
        assert_eq!(read.shard(2), 1);
        let txn = TxnId::new(NodeId(9), 1);
        assert_eq!(answer([], PreReadRequest { txn, read }), None);
        let other = WarehouseDb::populate(&scale, 3, 0);
        assert_eq!(answer([&other], PreReadRequest { txn, read }), None, "warehouse 0 cannot answer for 1");
        let a = answer([&other, &db], PreReadRequest { txn, read }).unwrap();
        let id = a.customer.expect("every last name of the scale exists");
        assert_eq!(Some(id), db.districts[4].customer_by_last_name(7));
        let resolved = resolve(&pieces, read, id);
        assert_eq!(&resolved[..], &split(&payment.clone().resolved(id))[..]);
        assert_eq!(pre_read_of(&resolved), None);
        let by_id = split(&payment.resolved(id));
        assert_eq!(pre_read_of(&by_id), None);
        let status = TpccTxn::OrderStatus { w: 1, d: 3, customer: CustomerRef::LastName(2) };
        assert_eq!(pre_read_of(&split(&status)), Some(PreRead { w: 1, d: 3, last_name: 2 }));
    }
}
