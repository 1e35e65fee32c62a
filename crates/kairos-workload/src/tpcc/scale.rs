//! How big the transactional TPC-C database is ([`TpccScale`]), which transactions a run
//! draws ([`TpccMix`]) and how much one delivery delivers ([`DeliveryScope`]), and what is
//! wrong with any of them ([`TpccError`]).
//!
//! # What is scaled, and why
//! TPC-C's cardinalities per warehouse are 10 districts, 3,000 customers per district, 3,000
//! initial orders per district (5–15 lines each) and 100,000 items and stock rows. A simulated
//! deployment holds every replica of every shard in one process (the paper's TPC-C runs 6
//! shards × 3 replicas = 18 servers), so the defaults keep TPC-C's structure and shrink the
//! customers and orders tenfold: 300 customers and 300 initial orders per district. The
//! contention that decides TPC-C's throughput is unchanged: it sits on the districts (every
//! new-order and payment writes one, and a district's customers are one conflict key) and on
//! the stock rows, which are not scaled. The items are not scaled because new-order's lines
//! pick them by TPC-C's NURand(8191): over 10,000 items two random lines name the same item
//! 8.7 times as often as over 100,000 (Σp² = 1.57e-3 against 1.80e-4), so stock rows, which
//! new-order locks under 2PL, became a contention point TPC-C does not have (deterministic
//! model: 2PL+Paxos 196 → 267 txn/s when the items went back to 100,000). A stock row and a
//! price take 28 bytes, 2.8 MB per warehouse and replica. Customer last
//! names are scaled with the customers (a third as many names as customers, as TPC-C's 1,000
//! names for 3,000 customers), so a by-name lookup still finds about three customers.

use thiserror::Error;

use super::TxnType;

/// What is wrong with a TPC-C configuration or mix.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TpccError {
    #[error("TPC-C needs at least one warehouse (got 0); the paper runs one per shard")]
    NoWarehouses,
    #[error("TPC-C needs at least one {what} (got 0)")]
    Empty { what: &'static str },
    #[error("{warehouses} warehouses cannot be spread over {shards} shards: give every shard the same number of warehouses (the paper runs one per shard)")]
    UnevenShards { warehouses: u32, shards: u32 },
    #[error("{what} is {got}, above TPC-C's key layout limit of {max}")]
    TooLarge { what: &'static str, got: u64, max: u64 },
    #[error("unknown TPC-C transaction type '{0}' in the mix; the types are new-order, payment, delivery, order-status, stock-level")]
    UnknownType(String),
    #[error("the mix names {0} twice")]
    Repeated(&'static str),
    #[error("'{0}' is not a share: write type=percent, e.g. new-order=44")]
    BadShare(String),
    #[error("the mix's shares sum to {0}, not 100 (TPC-C's is new-order=44,payment=44,delivery=4,order-status=4,stock-level=4)")]
    SharesNot100(u32),
}

/// The size of the database (module docs: what is scaled).
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TpccScale {
    pub warehouses: u32,
    /// TPC-C: 10.
    pub districts_per_warehouse: u32,
    /// TPC-C: 3,000.
    pub customers_per_district: u32,
    /// Orders each district starts with (TPC-C: 3,000, one per customer; the last 30 % of
    /// them undelivered).
    pub initial_orders_per_district: u32,
    /// TPC-C: 100,000 (also the stock rows per warehouse).
    pub items: u32,
}

impl Default for TpccScale {
    fn default() -> Self {
        TpccScale {
            warehouses: 6,
            districts_per_warehouse: 10,
            customers_per_district: 300,
            initial_orders_per_district: 300,
            items: 100_000,
        }
    }
}

impl TpccScale {
    /// A small database with TPC-C's contention (10 districts per warehouse) and little to
    /// populate: 30 customers and 30 initial orders per district, `items` items. For tests and
    /// short campaigns.
    pub fn small(warehouses: u32, items: u32) -> TpccScale {
        TpccScale {
            warehouses,
            customers_per_district: 30,
            initial_orders_per_district: 30,
            items,
            ..TpccScale::default()
        }
    }
}

/// Key-layout limits (see [`super::keys`]): districts fit 8 bits, items 24.
pub const DISTRICTS_MAX: u32 = 255;
pub const ITEMS_MAX: u32 = 1 << 24;

impl TpccScale {
    /// Checks the scale, and that `shards` shards each hold the same number of warehouses
    /// (warehouse `w` lives on shard `w mod shards`).
    pub fn validate(&self, shards: u32) -> Result<(), TpccError> {
        if self.warehouses == 0 {
            return Err(TpccError::NoWarehouses);
        }
        for (what, n) in [
            ("district per warehouse", self.districts_per_warehouse),
            ("customer per district", self.customers_per_district),
            ("item", self.items),
        ] {
            if n == 0 {
                return Err(TpccError::Empty { what });
            }
        }
        if self.districts_per_warehouse > DISTRICTS_MAX {
            return Err(TpccError::TooLarge {
                what: "districts per warehouse",
                got: self.districts_per_warehouse.into(),
                max: DISTRICTS_MAX.into(),
            });
        }
        if self.items > ITEMS_MAX {
            return Err(TpccError::TooLarge { what: "items", got: self.items.into(), max: ITEMS_MAX.into() });
        }
        if shards == 0 || !self.warehouses.is_multiple_of(shards) {
            return Err(TpccError::UnevenShards { warehouses: self.warehouses, shards });
        }
        Ok(())
    }

    /// Distinct customer last names per district: a third of the customers (TPC-C: 1,000 for
    /// 3,000), at least one.
    pub fn last_names(&self) -> u32 {
        (self.customers_per_district / 3).clamp(1, 1000)
    }
}

/// How much one delivery transaction delivers.
///
/// TPC-C's delivery business transaction delivers the oldest undelivered order of each of its
/// warehouse's 10 districts, and the standard lets it commit district by district as separate
/// database transactions (clause 2.7.4). The Tiga paper's code (Janus's TPC-C, which Tiga's
/// peers and Tiga run) draws one district per delivery transaction, so a delivery conflicts
/// with one district's new-orders and payments; delivering every district in one
/// transaction conflicts with all of its warehouse's, for as long as the protocol holds them.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DeliveryScope {
    /// One district, drawn uniformly (the paper's; the default).
    #[default]
    District,
    /// Every district of the warehouse in one transaction.
    Warehouse,
}

impl DeliveryScope {
    pub fn name(self) -> &'static str {
        match self {
            DeliveryScope::District => "district",
            DeliveryScope::Warehouse => "warehouse",
        }
    }
}

/// The shares of the transaction types, in percent (they sum to 100).
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TpccMix {
    /// Indexed like [`TxnType::ALL`].
    pub percent: [u32; 5],
}

impl Default for TpccMix {
    /// TPC-C's: new-order 44, payment 44, delivery 4, order-status 4, stock-level 4.
    fn default() -> Self {
        TpccMix { percent: [44, 44, 4, 4, 4] }
    }
}

impl TpccMix {
    /// Parses `type=percent` pairs separated by commas (types not named get 0), e.g.
    /// `new-order=50,payment=50`.
    pub fn parse(s: &str) -> Result<TpccMix, TpccError> {
        let mut percent = [0u32; 5];
        let mut seen = [false; 5];
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, share) = part.split_once('=').ok_or_else(|| TpccError::BadShare(part.to_string()))?;
            let (name, share) = (name.trim(), share.trim());
            let i = TxnType::ALL
                .iter()
                .position(|t| t.name() == name)
                .ok_or_else(|| TpccError::UnknownType(name.to_string()))?;
            if seen[i] {
                return Err(TpccError::Repeated(TxnType::ALL[i].name()));
            }
            seen[i] = true;
            percent[i] = share.parse().map_err(|_| TpccError::BadShare(part.to_string()))?;
        }
        let mix = TpccMix { percent };
        mix.validate()?;
        Ok(mix)
    }

    pub fn validate(&self) -> Result<(), TpccError> {
        let total = self.percent.iter().try_fold(0u32, |a, &p| a.checked_add(p)).unwrap_or(u32::MAX);
        if total != 100 {
            return Err(TpccError::SharesNot100(total));
        }
        Ok(())
    }

    /// Draws a type with these shares.
    pub fn pick(&self, rng: &mut impl rand::Rng) -> TxnType {
        let mut x = rng.random_range(0..100u32);
        for (t, &p) in TxnType::ALL.iter().zip(&self.percent) {
            if x < p {
                return *t;
            }
            x -= p;
        }
        TxnType::NewOrder
    }
}

impl std::fmt::Display for TpccMix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = TxnType::ALL
            .iter()
            .zip(&self.percent)
            .filter(|(_, p)| **p > 0)
            .map(|(t, p)| format!("{}={p}", t.name()))
            .collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn the_standard_mix_parses_and_prints_back() {
        let m = TpccMix::parse("new-order=44, payment=44,delivery=4,order-status=4,stock-level=4").unwrap();
        assert_eq!(m, TpccMix::default());
        assert_eq!(TpccMix::parse(&m.to_string()).unwrap(), m);
        assert_eq!(TpccMix::parse("payment=100").unwrap().percent, [0, 100, 0, 0, 0]);
    }

    #[test]
    fn bad_mixes_and_scales_are_clear_errors() {
        assert_eq!(TpccMix::parse("new-order=44,refund=56"), Err(TpccError::UnknownType("refund".into())));
        assert_eq!(TpccMix::parse("new-order=44,payment=44"), Err(TpccError::SharesNot100(88)));
        assert_eq!(TpccMix::parse("new-order=44,new-order=56"), Err(TpccError::Repeated("new-order")));
        assert_eq!(TpccMix::parse("new-order"), Err(TpccError::BadShare("new-order".into())));
        assert_eq!(TpccMix::parse("new-order=-1"), Err(TpccError::BadShare("new-order=-1".into())));
        assert_eq!(TpccMix::parse("new-order=4294967295,payment=2"), Err(TpccError::SharesNot100(u32::MAX)));
        let zero = TpccScale { warehouses: 0, ..TpccScale::default() };
        assert_eq!(zero.validate(6), Err(TpccError::NoWarehouses));
        assert!(zero.validate(6).unwrap_err().to_string().contains("at least one warehouse"));
        assert_eq!(TpccScale::default().validate(4), Err(TpccError::UnevenShards { warehouses: 6, shards: 4 }));
        let no_items = TpccScale { items: 0, ..TpccScale::default() };
        assert_eq!(no_items.validate(6), Err(TpccError::Empty { what: "item" }));
        assert!(TpccScale::default().validate(6).is_ok() && TpccScale::default().validate(3).is_ok());
    }

    #[test]
    fn draws_follow_the_shares() {
        let mut rng = kairos_core::Rng::seed_from_u64(3);
        let mix = TpccMix::default();
        let mut counts = [0u32; 5];
        for _ in 0..100_000 {
            let drawn = mix.pick(&mut rng);
            counts[TxnType::ALL.iter().position(|t| *t == drawn).unwrap()] += 1;
        }
        for (c, p) in counts.iter().zip(mix.percent) {
            let share = f64::from(*c) / 1000.0;
            assert!((share - f64::from(p)).abs() < 0.6, "{counts:?}");
        }
    }
}
