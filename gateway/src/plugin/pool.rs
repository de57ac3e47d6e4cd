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
//!
//! Priority: a call is normally short (microseconds) and part of a delivery, so call
//! threads run at normal priority. A call that has spent [`DEMOTE_AFTER`] of CPU
//! is a long one: its thread drops to `SCHED_IDLE` (Linux) for the rest of the call,
//! so any other thread that wakes (the API, the engine, another tenant's short call)
//! takes the core from it at once. A lower nice value is not enough for that: the
//! scheduler lets the running thread finish its slice (about 1.5 ms here) first. After
//! the call the thread returns to normal priority; where that is not permitted (no
//! `CAP_SYS_NICE` and `RLIMIT_NICE` 0, as in most containers) the thread retires and
//! the pool starts a fresh one.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::types::{PluginError, PluginFailure};

type Job = Box<dyn FnOnce() + Send>;

/// CPU time after which a call counts as long and its thread yields priority.
pub(super) const DEMOTE_AFTER: Duration = Duration::from_millis(1);

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
    /// Threads that retired (stuck at idle priority) and are not yet replaced.
    retired: usize,
    closed: bool,
}

impl CallPool {
    /// Starts `threads` call threads (at least one).
    pub(crate) fn new(threads: usize) -> Result<CallPool, PluginError> {
        let threads = threads.max(1);
        let shared =
            Arc::new(Shared { state: Mutex::default(), ready: Condvar::new(), per_tenant: (threads - 1).max(1) });
        for _ in 0..threads {
            spawn_thread(&shared)
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
            // Before answering: the caller's next call finds the thread as it will stay.
            restore_priority();
            let _ = tx.send(result);
        });
        self.submit(tenant, job);
        rx.await.unwrap_or_else(|_| Err(PluginFailure::Trap("host error".to_string())))
    }

    fn submit(&self, tenant: &Arc<str>, job: Job) {
        self.replace_retired();
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

impl CallPool {
    /// Starts a thread for each one that retired. Done here, on the caller's thread,
    /// because a thread inherits its creator's scheduling policy.
    fn replace_retired(&self) {
        let mut state = self.shared.lock();
        while state.retired > 0 {
            state.retired -= 1;
            if let Err(e) = spawn_thread(&self.shared) {
                state.retired += 1;
                tracing::error!(error = %e, "cannot replace a plugin call thread");
                break;
            }
        }
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

fn spawn_thread(shared: &Arc<Shared>) -> std::io::Result<()> {
    let shared = Arc::clone(shared);
    std::thread::Builder::new().name("herald-plugin-call".into()).spawn(move || {
        PRIORITY.set(Priority::Normal);
        serve(&shared);
    })?;
    Ok(())
}

fn serve(shared: &Shared) {
    let mut state = shared.lock();
    loop {
        if let Some((tenant, job)) = state.next(shared.per_tenant) {
            drop(state);
            job();
            state = shared.lock();
            state.done(&tenant);
            if PRIORITY.get() == Priority::Stuck {
                state.retired += 1;
                shared.ready.notify_one();
                return;
            }
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

#[derive(Clone, Copy, PartialEq)]
enum Priority {
    /// Not a call thread (the loader, the CLI): never demoted.
    Other,
    Normal,
    Demoted,
    /// Demoted, and not permitted back: the thread retires after this call.
    Stuck,
}

thread_local! {
    static PRIORITY: Cell<Priority> = const { Cell::new(Priority::Other) };
}

/// Called from a running call once it has spent [`DEMOTE_AFTER`] of CPU: a call
/// thread drops to idle priority for the rest of the call. Best effort: see
/// [`demoted`].
pub(super) fn demote_long_call() {
    if PRIORITY.get() == Priority::Normal && set_idle_policy(true) {
        PRIORITY.set(Priority::Demoted);
    }
}

/// Whether this thread runs at idle priority now.
pub(super) fn demoted() -> bool {
    matches!(PRIORITY.get(), Priority::Demoted | Priority::Stuck)
}

/// Back to normal priority after a call, or `Stuck` when that is not permitted.
fn restore_priority() {
    if PRIORITY.get() == Priority::Demoted {
        PRIORITY.set(if set_idle_policy(false) { Priority::Normal } else { Priority::Stuck });
    }
}

/// `SCHED_IDLE` on, or back to `SCHED_OTHER`, for the calling thread.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn set_idle_policy(idle: bool) -> bool {
    let policy = if idle { libc::SCHED_IDLE } else { libc::SCHED_OTHER };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread and `param` is a valid sched_param that
    // outlives the call.
    unsafe { libc::sched_setscheduler(0, policy, &param) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn set_idle_policy(_idle: bool) -> bool {
    false
}

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
