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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::lease;

/// This node's view of the cluster.
pub(super) struct Members {
    owner: String,
    /// The live nodes, sorted; `None`: this node paces every endpoint (a store it owns,
    /// or no heartbeat answered yet).
    view: RwLock<Option<Arc<[String]>>>,
    /// Bumped on every change of `view`, so partitions re-check only then.
    generation: AtomicU64,
    /// The last heartbeat failed (the store was out of reach).
    cut_off: AtomicBool,
}

impl Members {
    pub(super) fn new(owner: &str) -> Members {
        Members {
            owner: owner.to_string(),
            view: RwLock::new(None),
            generation: AtomicU64::new(0),
            cut_off: AtomicBool::new(false),
        }
    }

    /// Notes whether this heartbeat failed; returns whether the one before had.
    pub(super) fn cut_off(&self, now: bool) -> bool {
        self.cut_off.swap(now, Ordering::AcqRel)
    }

    /// Takes a heartbeat's answer. True when the membership changed.
    pub(super) fn update(&self, live: Option<Vec<String>>) -> bool {
        let mut view = self.view.write().expect("members");
        if view.as_deref() == live.as_deref() {
            return false;
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
            Some(live) => lease::preferred_node(endpoint, live) == Some(self.owner.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_alone_paces_everything_and_a_split_moves_some_away() {
        let m = Members::new("a");
        assert!(m.mine("ep_1") && m.mine("ep_2"), "no view: everything");
        let g = m.generation();
        assert!(m.update(Some(vec!["a".into(), "b".into()])));
        assert!(!m.update(Some(vec!["a".into(), "b".into()])), "the same view is no change");
        assert_eq!((m.generation(), m.count()), (g + 1, 2));
        let ours = (0..100).filter(|i| m.mine(&format!("ep_{i}"))).count();
        assert!((30..70).contains(&ours), "{ours} of 100");
        m.update(Some(Vec::new()));
        assert!(!m.mine("ep_1"), "a leaving node keeps nothing");
        m.update(None);
        assert_eq!((m.count(), m.mine("ep_1")), (1, true));
    }
}
