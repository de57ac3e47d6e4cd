//! Which endpoints this node paces when several nodes share a store. Every node writes a
//! heartbeat and reads the live nodes back (`store::Engine::heartbeat`); each endpoint
//! goes to one of them by rendezvous hashing (`lease::preferred_node`), so every node
//! computes the same split without talking to the others. Without it, every node raced
//! for every endpoint with work: the first to scan took them all, and a node that joined
//! under load got nothing until the backlog ended.
//!
//! The split decides who starts a partition, not who may hold one: the partition lease
//! still makes one node at a time pace an endpoint. A node whose endpoint moved to another
//! (a node joined) hands it back at its next step; an endpoint whose preferred node does
//! not take it (no lease held while work is overdue) is taken over by whichever node scans
//! it first (see `worker::dispatch`).
//!
//! On Postgres every node heartbeats into `cluster_nodes` once a second (by the database's
//! clock) on a task of its own. A node starts partitions only for its own endpoints (`wake`);
//! a partition whose endpoint moved (the membership changed, which wakes even an idle one)
//! hands its queue back and releases its lease, as does an idle partition of another node's
//! endpoint when it retires. The scan wakes whatever partition runs here for an endpoint with
//! due work, whoever's it is, and takes over another node's due work once it has seen it
//! with no lease held for `TAKEOVER_AFTER` (5 s), offering it back after `TAKEOVER_HOLD`
//! (10 s). After an outage a node drops other nodes only once it has been back for the
//! member timeout (their rows are as old as the outage). When the LISTEN connection comes
//! back, notices may have been lost (`Notice::Missed`): every partition re-reads its
//! endpoint and the scan runs at once. A draining node leaves first and writes no heartbeat
//! after. SQLite: no membership, the node paces everything.
//!
//! A `listen` endpoint goes to the node that took its listener's connection, not to its
//! hash: that node pins it in the store (`endpoints.listener`), and each node learns the pin
//! when it reads the endpoint ([`Members::pin`]); a pin to a node no longer live counts for
//! nothing. The node holding the connection paces the endpoint whatever its view
//! (`worker::ours`), and the partition elsewhere hands it over as when a node joins.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::time::Instant;

use crate::lease;
use crate::store::MEMBER_TIMEOUT;

/// This node's view of the cluster.
pub(super) struct Members {
    owner: String,
    /// The live nodes, sorted; `None`: this node paces every endpoint (a store it owns,
    /// or no heartbeat answered yet).
    view: RwLock<Option<Arc<[String]>>>,
    /// Bumped on every change of `view`, so partitions re-check only then.
    generation: AtomicU64,
    /// Whether the last heartbeat failed, and when the store answered again after the
    /// last failure.
    outage: Mutex<(bool, Option<Instant>)>,
    /// `listen` endpoints' pins as last read: the node that holds each one's listener.
    pins: RwLock<HashMap<String, String>>,
}

impl Members {
    pub(super) fn new(owner: &str) -> Members {
        Members {
            owner: owner.to_string(),
            view: RwLock::new(None),
            generation: AtomicU64::new(0),
            outage: Mutex::new((false, None)),
            pins: RwLock::default(),
        }
    }

    /// `endpoint` (kind `listen`) was read pinned to `node` (`None`: not pinned, or not a
    /// `listen` endpoint). A moved pin bumps the generation, as a membership change does, so
    /// the partitions look again at what is theirs.
    pub(super) fn pin(&self, endpoint: &str, node: Option<&str>) {
        let mut pins = self.pins.write().expect("pins");
        let moved = match node {
            Some(node) if pins.get(endpoint).is_none_or(|n| n != node) => {
                pins.insert(endpoint.to_string(), node.to_string());
                true
            }
            Some(_) => false,
            None => pins.remove(endpoint).is_some(),
        };
        if moved {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// A heartbeat failed: the store is out of reach.
    pub(super) fn cut_off(&self) {
        self.outage.lock().expect("members").0 = true;
    }

    /// Takes a heartbeat's answer, received at `now`. True when the membership changed.
    ///
    /// After an outage, a node is dropped only once this node has been back in touch with
    /// the store for [`MEMBER_TIMEOUT`]: every other node's row is as old as the outage,
    /// until each has written again, and dropping them would hand this node all their
    /// endpoints for a moment, then take them back. Joins, and this node's own leaving,
    /// apply at once.
    pub(super) fn update(&self, live: Option<Vec<String>>, now: Instant) -> bool {
        let back = {
            let mut outage = self.outage.lock().expect("members");
            if std::mem::take(&mut outage.0) {
                outage.1 = Some(now);
            }
            outage.1
        };
        let mut view = self.view.write().expect("members");
        if view.as_deref() == live.as_deref() {
            return false;
        }
        if let (Some(old), Some(new)) = (view.as_deref(), live.as_deref()) {
            let drops = old.iter().any(|m| !new.contains(m));
            let leaving = !new.contains(&self.owner);
            if drops && !leaving && back.is_some_and(|at| now.duration_since(at) < MEMBER_TIMEOUT) {
                return false;
            }
        }
        *view = live.map(Arc::from);
        self.generation.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// How many nodes share the endpoints (1 while this node paces them all).
    pub(super) fn count(&self) -> usize {
        self.view.read().expect("members").as_ref().map_or(1, |v| v.len())
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether `endpoint` is this node's to pace. An empty view (this node is leaving)
    /// keeps nothing.
    pub(super) fn mine(&self, endpoint: &str) -> bool {
        match self.view.read().expect("members").as_deref() {
            None => true,
            Some(live) => self.preferred(endpoint, live) == Some(self.owner.as_str()),
        }
    }

    /// The node pinned for `endpoint`'s listener, while it is live; otherwise its hash's.
    fn preferred<'a>(&self, endpoint: &str, live: &'a [String]) -> Option<&'a str> {
        let pins = self.pins.read().expect("pins");
        match pins.get(endpoint).and_then(|node| live.iter().find(|m| *m == node)) {
            Some(pinned) => Some(pinned.as_str()),
            None => lease::preferred_node(endpoint, live),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(nodes: &[&str]) -> Option<Vec<String>> {
        Some(nodes.iter().map(|n| n.to_string()).collect())
    }

    #[test]
    fn a_node_alone_paces_everything_and_a_split_moves_some_away() {
        let (m, t0) = (Members::new("a"), Instant::now());
        assert!(m.mine("ep_1") && m.mine("ep_2"), "no view: everything");
        let g = m.generation();
        assert!(m.update(view(&["a", "b"]), t0));
        assert!(!m.update(view(&["a", "b"]), t0), "the same view is no change");
        assert_eq!((m.generation(), m.count()), (g + 1, 2));
        let ours = (0..100).filter(|i| m.mine(&format!("ep_{i}"))).count();
        assert!((30..70).contains(&ours), "{ours} of 100");
        assert!(m.update(view(&["b"]), t0), "this node leaving applies at once");
        assert!(!m.mine("ep_1"), "a leaving node keeps nothing");
        m.update(None, t0);
        assert_eq!((m.count(), m.mine("ep_1")), (1, true));
    }

    #[test]
    fn a_listener_pin_to_a_live_node_wins_over_the_hash() {
        let (a, b, t0) = (Members::new("a"), Members::new("b"), Instant::now());
        for m in [&a, &b] {
            m.update(view(&["a", "b"]), t0);
        }
        let theirs = (0..100).map(|i| format!("ep_{i}")).find(|e| !a.mine(e)).unwrap();
        let g = a.generation();
        for m in [&a, &b] {
            m.pin(&theirs, Some("a"));
        }
        assert!(a.mine(&theirs) && !b.mine(&theirs), "pinned to a");
        assert_eq!(a.generation(), g + 1, "a moved pin is a change");
        a.pin(&theirs, Some("a"));
        assert_eq!(a.generation(), g + 1, "the same pin is none");
        a.pin(&theirs, Some("gone"));
        assert!(!a.mine(&theirs), "a pin to a node not live counts for nothing");
        a.pin(&theirs, None);
        assert!(!a.mine(&theirs));
    }

    #[test]
    fn after_an_outage_a_node_drops_others_only_once_it_has_been_back_a_while() {
        let (m, t0) = (Members::new("a"), Instant::now());
        assert!(m.update(view(&["a", "b"]), t0));
        // No outage: b's row going stale is b gone.
        assert!(m.update(view(&["a"]), t0));
        assert!(m.update(view(&["a", "b"]), t0 + MEMBER_TIMEOUT), "a join applies at once");
        m.cut_off();
        let back = t0 + MEMBER_TIMEOUT * 3;
        assert!(!m.update(view(&["a"]), back), "b has not written since the outage yet");
        assert!(!m.update(view(&["a"]), back + MEMBER_TIMEOUT / 2));
        assert_eq!(m.count(), 2);
        assert!(m.update(view(&["a", "b", "c"]), back + MEMBER_TIMEOUT / 2), "joins apply at once");
        assert!(m.update(view(&["a", "c"]), back + MEMBER_TIMEOUT), "b stayed silent: gone");
    }
}
