//! Changing a cluster's membership from any member: every group takes the same change, one
//! raft configuration change each, and [`Engine::change_membership`] returns once all did.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use concord_consensus::{
    Consensus, GroupMembers, MemberChange, NodeId, ProposeError, RaftNode, refuse_change,
};
use concord_storage::GroupId;

use crate::{Engine, EngineError};

/// How long [`Engine::change_membership`] waits for every group to take a change: under the
/// HTTP server's default request timeout, so that its caller hears which group is behind.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a group that has not taken a change yet is asked again (a leader refuses one
/// while another is under way, and a proposal is lost with a leader).
const PROPOSE_AGAIN_AFTER: Duration = Duration::from_secs(1);

/// How long [`Engine::change_membership`] waits for its groups' read barriers before it checks
/// a change against its view of the membership.
const VIEW_CATCH_UP: Duration = Duration::from_secs(2);

/// A member's part in the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberRole {
    /// Votes in (some of) the groups.
    Voter,
    /// Receives every group's log, votes in none (added, not yet promoted).
    Learner,
}

/// A member of the cluster, as this node knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    /// Its node id.
    pub node: NodeId,
    /// Voter or learner.
    pub role: MemberRole,
    /// Where its peers reach it (`None` if this node does not know, or is the node alone).
    pub raft_addr: Option<SocketAddr>,
    /// `true` for this node, and for a peer connected to it and heard from within the
    /// liveness timeout (a second by default): the members a leadership may be handed to,
    /// and those the quorum rule of [`Engine::change_membership`] counts.
    pub reachable: bool,
    /// How long ago this node last heard from it (`None`: never, or this node itself).
    pub last_heard_ms: Option<u64>,
    /// The peer protocol version it speaks (this node's own for itself; `None`: it has not
    /// connected to this node since this node started). During a rolling upgrade this build
    /// works with members of the two versions before its own; plugin upgrades wait until
    /// every member speaks one that applies them (3 or newer).
    pub wire_version: Option<u16>,
    /// How long, having heard from a leader, it refuses to vote for another, in milliseconds,
    /// as it said when it connected (this node's own for itself; `None`: it has not
    /// connected since this node started, or its version does not say). Members configured
    /// with different raft ticks differ here; a leader's lease lasts nine tenths of the
    /// shortest.
    pub vote_quiet_ms: Option<u64>,
    /// The groups it leads, as this node knows.
    pub leads: usize,
}

impl Engine {
    /// The members of the cluster: every voter and learner of this node's groups, with
    /// addresses and whether this node hears from them. A node alone lists itself.
    pub fn members(&self) -> Vec<MemberInfo> {
        let statuses = self.status();
        let peers: BTreeMap<NodeId, _> = self.peers().into_iter().map(|p| (p.node, p)).collect();
        let own_addr = self.config().cluster.as_ref().map(|cluster| {
            cluster
                .listen_addr
                .unwrap_or(cluster.members[&cluster.node_id])
        });
        let mut roles: BTreeMap<NodeId, MemberRole> = BTreeMap::new();
        for status in &statuses {
            let members = &status.members;
            for &node in members.voters.iter().chain(&members.outgoing_voters) {
                roles.insert(node, MemberRole::Voter);
            }
            for &node in &members.learners {
                roles.entry(node).or_insert(MemberRole::Learner);
            }
        }
        if roles.is_empty() {
            roles.insert(self.node_id(), MemberRole::Voter); // Solo: no raft configuration.
        }
        roles
            .into_iter()
            .map(|(node, role)| {
                let peer = peers.get(&node);
                let last_heard = peer.and_then(|p| p.last_heard);
                MemberInfo {
                    node,
                    role,
                    raft_addr: if node == self.node_id() {
                        own_addr
                    } else {
                        peer.map(|p| p.address)
                    },
                    reachable: node == self.node_id()
                        || self.raft().is_some_and(|raft| raft.is_up(node)),
                    last_heard_ms: last_heard.map(|d| d.as_millis() as u64),
                    wire_version: if node == self.node_id() {
                        Some(concord_consensus::transport::WIRE_VERSION)
                    } else {
                        peer.and_then(|p| p.wire_version)
                    },
                    vote_quiet_ms: if node == self.node_id() {
                        (self.raft()).map(|raft| raft.vote_quiet().as_millis() as u64)
                    } else {
                        peer.and_then(|p| p.vote_quiet)
                            .map(|q| q.as_millis() as u64)
                    },
                    leads: statuses.iter().filter(|s| s.leader == node).count(),
                }
            })
            .collect()
    }

    /// Makes `change` in every group of the cluster, through joint consensus in each, and
    /// returns once every group on this node has taken it (or after 10 s with
    /// [`EngineError::MembershipUnfinished`]: the groups that took it keep it, and asking again
    /// finishes the rest — a change already made is not made twice). Any member may be asked;
    /// each group's leader appends the change.
    ///
    /// Refused at once ([`EngineError::MembershipRefused`]) if the voters after it would not
    /// have a quorum among the members this node hears from, if it promotes or removes a node
    /// that is no member, adds one that is a voter, or removes this node (ask another member:
    /// a removed node stops hearing how its removal ends). Those checks read this node's view
    /// of the membership; one that refuses is made again once the view is brought up to what
    /// the leaders committed (a read barrier per group: a learner just added through another
    /// member is then seen). Where a barrier fails (no leader now, or none within 2 s) and
    /// the refusal rests on who is a member, that failure is returned instead
    /// ([`EngineError::Propose`]: ask again). A learner is promoted only once it has caught up
    /// with each group's leader (until then the call waits).
    ///
    /// To add a node: start it with `initial_cluster_state existing` (it takes each group's
    /// state from a snapshot), add it as a learner, then promote it.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new()?.block_on(async {
    /// use concord_engine::{Engine, EngineConfig, EngineError, MemberChange};
    /// let dir = tempfile::tempdir()?;
    /// let engine = Engine::open(EngineConfig::new(dir.path()))?;
    /// // A node alone is no cluster: there is nobody to add.
    /// let change = MemberChange::AddLearner { node: 2, address: "127.0.0.1:7171".into() };
    /// assert!(matches!(
    ///     engine.change_membership(change).await,
    ///     Err(EngineError::MembershipRefused { .. })
    /// ));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn change_membership(&self, change: MemberChange) -> Result<(), EngineError> {
        let refused = |reason: String| EngineError::MembershipRefused { reason };
        let raft = match (self.raft(), &self.config().cluster) {
            (Some(raft), Some(_)) => raft.clone(),
            _ => return Err(refused("this node is not a member of a cluster".into())),
        };
        let node = change.node();
        if node == 0 {
            return Err(refused("node ids start at 1".into()));
        }
        if let MemberChange::AddLearner { address, .. } = &change
            && address.parse::<SocketAddr>().is_err()
        {
            return Err(refused(format!(
                "`{address}` is not a peer address (host:port, an IP address)"
            )));
        }
        if matches!(change, MemberChange::Remove { .. }) && node == self.node_id() {
            return Err(refused(format!(
                "node {node} cannot remove itself: ask another member"
            )));
        }
        // This node's view of the membership may lag a change made through another member a
        // moment ago: a refusal is checked again once the view is brought up to date.
        if self.refusal(&change).is_some() {
            let view_caught_up = self.catch_up_membership_view(&raft).await;
            if let Some((reason, about_membership)) = self.refusal(&change) {
                // Where the view could not be brought up to date, a refusal that rests on who
                // is a member may be the lag's: the caller is told to ask again instead.
                if about_membership {
                    view_caught_up?;
                }
                return Err(refused(reason));
            }
        }
        tracing::info!(?change, "changing the membership of every group");
        let started = Instant::now();
        let mut proposed_at: HashMap<GroupId, Instant> = HashMap::new();
        let mut last_word: HashMap<GroupId, String> = HashMap::new();
        loop {
            let mut waiting = Vec::new();
            // Every group's proposal is handed over before any answer is awaited: the raft
            // workers take them all in a round or two, where one at a time would cost a round
            // each.
            let mut proposals = Vec::new();
            for &group in self.group_ids() {
                let status = self.group_status(group)?;
                if status.members.has_taken(&change) {
                    continue;
                }
                waiting.push(group);
                if status.members.is_joint()
                    || proposed_at
                        .get(&group)
                        .is_some_and(|at| at.elapsed() < PROPOSE_AGAIN_AFTER)
                {
                    continue;
                }
                proposed_at.insert(group, Instant::now());
                proposals.push((group, raft.propose_member_change(group, change.clone())));
            }
            for (group, proposal) in proposals {
                match proposal.await {
                    Ok(()) => {}
                    Err(ProposeError::Refused { reason, .. }) => {
                        last_word.insert(group, reason);
                    }
                    Err(other) => {
                        last_word.insert(group, other.to_string());
                    }
                }
            }
            let Some(&first) = waiting.first() else {
                tracing::info!(?change, "every group took the membership change");
                return Ok(());
            };
            if started.elapsed() >= CHANGE_TIMEOUT {
                return Err(EngineError::MembershipUnfinished {
                    waited_ms: started.elapsed().as_millis() as u64,
                    groups_waiting: waiting.len(),
                    group: first,
                    detail: last_word
                        .remove(&first)
                        .unwrap_or_else(|| "the change is not committed yet".into()),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Brings this node's view of every group's membership up to what the groups' leaders had
    /// committed, with a read barrier per group (all asked at once, waited for at most
    /// [`VIEW_CATCH_UP`]). The view lags when a change was made through another member: a
    /// learner just added there would look missing here, and its promotion be refused. A group
    /// that cannot answer a barrier now keeps the view it has, and the first such failure is
    /// returned.
    async fn catch_up_membership_view(&self, raft: &RaftNode) -> Result<(), EngineError> {
        let deadline = tokio::time::Instant::now() + VIEW_CATCH_UP;
        let barriers: Vec<_> = self
            .group_ids()
            .iter()
            .map(|&group| (group, raft.read_barrier(group)))
            .collect();
        let mut outcome = Ok(());
        for (group, barrier) in barriers {
            let failed = match tokio::time::timeout_at(deadline, barrier).await {
                Ok(Ok(_)) => continue,
                Ok(Err(error)) => error,
                Err(_) => ProposeError::Timeout {
                    group,
                    timeout_ms: VIEW_CATCH_UP.as_millis() as u64,
                },
            };
            if outcome.is_ok() {
                outcome = Err(EngineError::Propose(failed));
            }
        }
        outcome
    }

    /// Why this node's view refuses `change`, if it does, and whether the reason is who is a
    /// member (a view behind the leaders' can be wrong about that) rather than who is up.
    fn refusal(&self, change: &MemberChange) -> Option<(String, bool)> {
        let everyone = self.cluster_members();
        let node = change.node();
        if matches!(change, MemberChange::Remove { .. }) && !everyone.contains(node) {
            return Some((format!("node {node} is not a member"), true));
        }
        if everyone.has_taken(change) {
            return None;
        }
        let reachable: BTreeMap<NodeId, bool> = self
            .members()
            .into_iter()
            .map(|m| (m.node, m.reachable))
            .collect();
        let is_up = |n: NodeId| reachable.get(&n).copied().unwrap_or(false);
        let reason = refuse_change(&everyone, change, is_up)?;
        let about_membership = match change {
            MemberChange::Promote { node } => !everyone.contains(*node),
            MemberChange::AddLearner { node, .. } => everyone.voters.contains(node),
            MemberChange::Remove { .. } => false,
        };
        Some((reason, about_membership))
    }

    /// Voters and learners over all groups (a node counts as a voter if it votes anywhere).
    fn cluster_members(&self) -> GroupMembers {
        let mut everyone = GroupMembers::default();
        for member in self.members() {
            match member.role {
                MemberRole::Voter => everyone.voters.push(member.node),
                MemberRole::Learner => everyone.learners.push(member.node),
            }
        }
        everyone
    }
}
