//! How fresh a read must be.

/// The guarantee a read asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Consistency {
    /// Reflects every write acknowledged before the read began, on any node (a ReadIndex
    /// round with the group's quorum, through the leader on a follower, then a local read
    /// once applied that far).
    #[default]
    Linearizable,
    /// Served by the group's leader from its applied state through its commit index, without
    /// a quorum round, while it holds a lease (a quorum answered a heartbeat it sent within
    /// the last nine tenths of the election timeout less one tick, the quiet a follower keeps
    /// after a heartbeat; safe while clocks run at rates within 10% of each other). Without a
    /// lease — on a follower, a new leader, a leader cut off from its quorum, a leader handing
    /// its leadership over or, once it told a successor to take it, for the rest of that term,
    /// a node whose groups run without check-quorum — served as `Linearizable`.
    Lease,
    /// The local applied state, whatever its age: the cheapest read, on any node.
    Stale,
}

impl Consistency {
    /// `linearizable`, `lease` or `stale`.
    pub fn name(self) -> &'static str {
        match self {
            Consistency::Linearizable => "linearizable",
            Consistency::Lease => "lease",
            Consistency::Stale => "stale",
        }
    }
}

impl std::str::FromStr for Consistency {
    type Err = String;

    fn from_str(word: &str) -> Result<Self, Self::Err> {
        match word {
            "linearizable" => Ok(Consistency::Linearizable),
            "lease" => Ok(Consistency::Lease),
            "stale" => Ok(Consistency::Stale),
            other => Err(format!(
                "consistency is linearizable, lease or stale, not {other:?}"
            )),
        }
    }
}
