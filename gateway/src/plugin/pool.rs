//! The call pool: hook calls run on a few dedicated threads, never on the async
//! runtime's workers, and each tenant gets its turn.
//!
//! Why threads and not wasmtime's async support: a call is short, synchronous CPU work
//! (10 ms budget), and the sync WASI bindings must not run inside a Tokio worker (they
//! `block_on` for every stdout write or poll, which panics there). On a pool thread the
//! bindings use WASI's own runtime, and a guest burning its budget occupies a pool
//! thread, not a thread that serves the API or drives deliveries.
//!
//! Fairness: every tenant has its own queue; threads serve the queues round-robin, one
//! call per turn; and no tenant may hold every thread at once (at most `threads - 1`
//! with two or more threads). So one tenant whose plugins spin at their budget leaves a
//! thread free for the others, who then wait for at most one call per busy tenant.
//! The threads also run at a lower scheduling priority (nice +10 on Linux), so when
//! the cores are contended the API and the delivery engine win them.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::types::{PluginError, PluginFailure};

type Job = Box<dyn FnOnce() + Send>;

/// A bounded pool of call threads with one FIFO queue per tenant.
pub(crate) struct CallPool {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    ready: Condvar,
    /// Most calls of one tenant running at once.
    per_tenant: usize,
}

#[derive(Default)]
struct State {
    queues: HashMap<Arc<str>, VecDeque<Job>>,
    /// Tenants with queued calls, in turn order.
    turns: VecDeque<Arc<str>>,
    running: HashMap<Arc<str>, usize>,
    closed: bool,
}

impl CallPool {
    /// Starts `threads` call threads (at least one) at a lowered priority.
    pub(crate) fn new(threads: usize) -> Result<CallPool, PluginError> {
        let threads = threads.max(1);
        let shared =
            Arc::new(Shared { state: Mutex::default(), ready: Condvar::new(), per_tenant: (threads - 1).max(1) });
        for i in 0..threads {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("herald-plugin-{i}"))
                .spawn(move || {
                    lower_priority();
                    serve(&shared);
                })
                .map_err(|e| PluginError::Engine(format!("cannot start a plugin call thread: {e}")))?;
        }
        Ok(CallPool { shared })
    }

    /// Runs `call` on a pool thread in `tenant`'s turn and waits for it without
    /// blocking the async runtime. A panic in `call` (a host bug, never a guest's
    /// doing) is contained and reported as a trap; the thread survives.
    pub(crate) async fn run<R: Send + 'static>(
        &self,
        tenant: &Arc<str>,
        call: impl FnOnce() -> Result<R, PluginFailure> + Send + 'static,
    ) -> Result<R, PluginFailure> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            // The caller gave up (its task was dropped): skip the call.
            if tx.is_closed() {
                return;
            }
            let result = std::panic::catch_unwind(AssertUnwindSafe(call))
                .unwrap_or_else(|_| Err(PluginFailure::Trap("host error".to_string())));
            let _ = tx.send(result);
        });
        self.submit(tenant, job);
        rx.await.unwrap_or_else(|_| Err(PluginFailure::Trap("host error".to_string())))
    }

    fn submit(&self, tenant: &Arc<str>, job: Job) {
        let mut state = self.shared.lock();
        let queue = state.queues.entry(Arc::clone(tenant)).or_default();
        queue.push_back(job);
        if queue.len() == 1 {
            state.turns.push_back(Arc::clone(tenant));
        }
        drop(state);
        self.shared.ready.notify_one();
    }
}

impl Drop for CallPool {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.ready.notify_all();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    /// The next call in turn order whose tenant is under its thread share; that
    /// tenant moves to the back of the turns when it has more queued.
    fn next(&mut self, per_tenant: usize) -> Option<(Arc<str>, Job)> {
        let pos = self.turns.iter().position(|t| self.running.get(t).copied().unwrap_or(0) < per_tenant)?;
        let tenant = self.turns.remove(pos)?;
        let queue = self.queues.get_mut(&tenant)?;
        let job = queue.pop_front()?;
        if queue.is_empty() {
            self.queues.remove(&tenant);
        } else {
            self.turns.push_back(Arc::clone(&tenant));
        }
        *self.running.entry(Arc::clone(&tenant)).or_default() += 1;
        Some((tenant, job))
    }

    fn done(&mut self, tenant: &Arc<str>) {
        if let Some(n) = self.running.get_mut(tenant) {
            *n -= 1;
            if *n == 0 {
                self.running.remove(tenant);
            }
        }
    }
}

fn serve(shared: &Shared) {
    let mut state = shared.lock();
    loop {
        if let Some((tenant, job)) = state.next(shared.per_tenant) {
            drop(state);
            job();
            state = shared.lock();
            state.done(&tenant);
            // A tenant at its share may now be eligible again.
            shared.ready.notify_one();
            continue;
        }
        if state.closed && state.queues.is_empty() {
            return;
        }
        state = shared.ready.wait(state).unwrap_or_else(|e| e.into_inner());
    }
}

/// Nice +10 for the calling thread: under contention the scheduler prefers the API and
/// engine threads. Best effort: failing to lower priority changes nothing else.
#[cfg(target_os = "linux")]
fn lower_priority() {
    let tid = rustix::thread::gettid();
    let _ = rustix::process::setpriority_process(Some(tid), 10);
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Box::new(|| {})
    }

    #[test]
    fn tenants_take_turns_and_none_holds_every_thread() {
        let mut state = State::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        for t in [&a, &a, &a, &b, &b] {
            let queue = state.queues.entry(Arc::clone(t)).or_default();
            queue.push_back(job());
            if queue.len() == 1 {
                state.turns.push_back(Arc::clone(t));
            }
        }
        // Share of 2 (a 3-thread pool): a, b, a; then a is at its share, so b.
        let order: Vec<String> = (0..4).map(|_| state.next(2).unwrap().0.to_string()).collect();
        assert_eq!(order, ["a", "b", "a", "b"]);
        assert!(state.next(2).is_none(), "a already holds 2 threads");
        state.done(&a);
        assert_eq!(&*state.next(2).unwrap().0, "a");
        assert!(state.queues.is_empty() && state.turns.is_empty());
    }
}
