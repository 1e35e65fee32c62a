use serde::{Deserialize, Serialize};
use std::fmt;

/// Identifies one process (a protocol role instance) in a deployment. Dense, starting at 0.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// Index of a region in a [`crate::LatencyMatrix`] (its names live in the matrix).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RegionId(pub u8);

impl RegionId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The host's name for one of a node's timers. Setting a timer with an id that is already
/// armed re-arms it (the earlier deadline is forgotten). Roles name their timers with a
/// [`Timer`] type and meet raw ids only in their `on_timer`, through [`Timer::from_id`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TimerId(pub u64);

/// A role's timers as a type: one variant per kind of timer (a timer per transaction carries
/// the transaction's sequence number), encoded into a [`TimerId`] in one place, so that two
/// kinds cannot collide and a handler matches on kinds instead of number ranges.
///
/// A role's `on_timer` still receives the host's [`TimerId`] and decodes it first (an id the
/// role never sets is ignored): the simulator holds a world's roles as one trait object type,
/// `dyn Process<Msg = M>`, and an associated timer type on [`crate::Process`] would have to be
/// named there, although the roles of one world have different timer types.
pub trait Timer: Copy {
    fn id(self) -> TimerId;
    /// The timer `id` names, or `None` for an id this role never sets.
    fn from_id(id: TimerId) -> Option<Self>;
}

/// Raw ids are timers too (tests and roles with a single timer).
impl Timer for TimerId {
    fn id(self) -> TimerId {
        self
    }
    fn from_id(id: TimerId) -> Option<Self> {
        Some(id)
    }
}

/// Declares a role's timers of fixed kinds as an enum with its [`Timer`] encoding, each
/// variant with its id:
///
/// ```
/// kairos_core::timers! {
///     /// A replica's timers.
///     pub enum ReplicaTimer { Heartbeat = 1, Election = 2 }
/// }
/// use kairos_core::Timer;
/// assert_eq!(ReplicaTimer::from_id(ReplicaTimer::Election.id()), Some(ReplicaTimer::Election));
/// assert_eq!(ReplicaTimer::from_id(kairos_core::TimerId(9)), None);
/// ```
#[macro_export]
macro_rules! timers {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $id:expr),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Copy, Clone, Debug, PartialEq, Eq)]
        $vis enum $name {
            $($(#[$vmeta])* $variant),+
        }
        impl $crate::Timer for $name {
            fn id(self) -> $crate::TimerId {
                match self {
                    $($name::$variant => $crate::TimerId($id)),+
                }
            }
            fn from_id(id: $crate::TimerId) -> Option<Self> {
                $(if id.0 == $id {
                    return Some($name::$variant);
                })+
                None
            }
        }
    };
}

/// Checks a [`Timer`] encoding on `samples` (one or more of each kind): every sample decodes
/// back to itself, and no two distinct samples share an id. For the roles' unit tests.
pub fn check_timer_encoding<T: Timer + PartialEq + std::fmt::Debug>(samples: &[T]) -> Result<(), String> {
    for (i, a) in samples.iter().enumerate() {
        if T::from_id(a.id()) != Some(*a) {
            return Err(format!("{a:?} encodes to {:?}, which decodes to {:?}", a.id(), T::from_id(a.id())));
        }
        if let Some(b) = samples[..i].iter().find(|b| *b != a && b.id() == a.id()) {
            return Err(format!("{a:?} and {b:?} share {:?}", a.id()));
        }
    }
    Ok(())
}
