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
//! with two or more threads).
//!
//! Penalty: a tenant one of whose calls was stopped for using its whole CPU budget is
//! *penalised* for [`PENALTY`] after its latest such call: its calls no longer run on the
//! call threads but on one thread of their own (the penalty lane), at idle priority from
//! their first instruction, in turns with the other penalised tenants. So a tenant whose
//! plugins keep spinning at their budget never holds a call thread the others need, and
//! its burning only takes CPU nobody else wants: the other tenants' calls never queue
//! behind its calls (issue 48: beside 28 budget-length calls/s the others' deliveries
//! were 1.7× slower at p99 when the burners shared their threads).
//!
//! Priority: a call is normally short (microseconds) and part of a delivery, so call
//! threads run at normal priority. A call that has spent [`DEMOTE_AFTER`] of CPU
//! is a long one: its thread drops to `SCHED_IDLE` (Linux) for the rest of the call,
//! so any other thread that wakes (the API, the engine, another tenant's short call)
//! takes the core from it at once. A lower nice value is not enough for that: the
//! scheduler lets the running thread finish its slice (about 1.5 ms here) first. After
//! the call the thread returns to normal priority; where that is not permitted (no
//! `CAP_SYS_NICE` and `RLIMIT_NICE` 0, as in most containers) the thread retires and
//! the pool starts a fresh one. A long call still running [`STARVED_AFTER`] times its
//! budget after it started (a busy machine gives idle threads next to nothing, for
//! seconds) returns to normal priority for the rest of the call, given back by the epoch
//! ticker ([`rescue_starved`]) or by the call itself: it has shown to
//! be starved, not burning, and a call within its budget must end within it, not be cut
//! by the wall-time cap (see `sandbox::Deadline`). A penalised tenant's calls stay idle.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::types::{PluginError, PluginFailure};

type Job = Box<dyn FnOnce() + Send>;

/// CPU time after which a call counts as long and its thread yields priority.
pub(super) const DEMOTE_AFTER: Duration = Duration::from_millis(1);

/// How long a tenant stays penalised after its latest call that used its whole budget.
pub(super) const PENALTY: Duration = Duration::from_secs(10);

/// A demoted call that has waited this many times its budget of wall time without
/// having used its budget of CPU gets normal priority back (see the module docs).
pub(super) const STARVED_AFTER: u32 = 2;

/// A bounded pool of call threads with one FIFO queue per tenant.
pub(crate) struct CallPool {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Woken (all of them: the threads of both lanes wait on it) when a call is queued or
    /// a thread is freed.
    ready: Condvar,
    /// Most calls of one tenant running at once on the call threads.
    per_tenant: usize,
}

#[derive(Default)]
struct State {
    queues: HashMap<Arc<str>, VecDeque<Job>>,
    /// Tenants with queued calls, in turn order.
    turns: VecDeque<Arc<str>>,
    running: HashMap<Arc<str>, usize>,
    /// Penalised tenants, until when (see the module docs).
    penalised: HashMap<Arc<str>, Instant>,
    /// Threads that retired (stuck at idle priority) and are not yet replaced.
    retired: usize,
    closed: bool,
}

impl CallPool {
    /// Starts `threads` call threads (at least one) and the penalty lane's thread.
    pub(crate) fn new(threads: usize) -> Result<CallPool, PluginError> {
        let threads = threads.max(1);
        let shared =
            Arc::new(Shared { state: Mutex::default(), ready: Condvar::new(), per_tenant: (threads - 1).max(1) });
        let failed = |e: std::io::Error| PluginError::Engine(format!("cannot start a plugin call thread: {e}"));
        for _ in 0..threads {
            spawn_thread(&shared, Lane::Calls).map_err(failed)?;
        }
        spawn_thread(&shared, Lane::Penalty).map_err(failed)?;
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
        self.shared.ready.notify_all();
    }
}

impl CallPool {
    /// Starts a thread for each one that retired. Done here, on the caller's thread,
    /// because a thread inherits its creator's scheduling policy.
    fn replace_retired(&self) {
        let mut state = self.shared.lock();
        while state.retired > 0 {
            state.retired -= 1;
            if let Err(e) = spawn_thread(&self.shared, Lane::Calls) {
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
    /// The next call for a thread of `lane`, in turn order: on the call threads, of a
    /// tenant that is not penalised and is under its thread share; on the penalty lane, of
    /// a penalised one. That tenant moves to the back of the turns when it has more queued.
    fn next(&mut self, lane: Lane, per_tenant: usize) -> Option<(Arc<str>, Job)> {
        let now = Instant::now();
        self.penalised.retain(|_, until| *until > now);
        let eligible = |t: &Arc<str>| match lane {
            Lane::Calls => !self.penalised.contains_key(t) && self.running.get(t).copied().unwrap_or(0) < per_tenant,
            Lane::Penalty => self.penalised.contains_key(t),
        };
        let pos = self.turns.iter().position(eligible)?;
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

    /// `tenant`'s call used its whole budget: penalised from now for [`PENALTY`].
    fn penalise(&mut self, tenant: &Arc<str>) {
        self.penalised.insert(Arc::clone(tenant), Instant::now() + PENALTY);
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

/// Which calls a pool thread runs.
#[derive(Clone, Copy, PartialEq)]
enum Lane {
    /// The tenants' calls, at normal priority until one runs long.
    Calls,
    /// Penalised tenants' calls, at idle priority throughout.
    Penalty,
}

fn spawn_thread(shared: &Arc<Shared>, lane: Lane) -> std::io::Result<()> {
    let shared = Arc::clone(shared);
    let name = match lane {
        Lane::Calls => "herald-plugin-call",
        Lane::Penalty => "herald-plugin-penalty",
    };
    std::thread::Builder::new().name(name.into()).spawn(move || {
        // The penalty lane runs at idle priority for good (best effort: where that is not
        // permitted it runs at normal priority, still on its own thread).
        let priority = match lane {
            Lane::Penalty if set_idle_policy(true) => Priority::Idle,
            _ => Priority::Normal,
        };
        PRIORITY.set(priority);
        serve(&shared, lane);
    })?;
    Ok(())
}

fn serve(shared: &Shared, lane: Lane) {
    let mut state = shared.lock();
    loop {
        if let Some((tenant, job)) = state.next(lane, shared.per_tenant) {
            drop(state);
            BUDGET_SPENT.set(false);
            job();
            state = shared.lock();
            state.done(&tenant);
            if BUDGET_SPENT.get() {
                state.penalise(&tenant);
            }
            // A tenant at its share may now be eligible again (on either lane).
            shared.ready.notify_all();
            if PRIORITY.get() == Priority::Stuck {
                state.retired += 1;
                return;
            }
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
    /// The penalty lane's thread: idle for good.
    Idle,
}

thread_local! {
    static PRIORITY: Cell<Priority> = const { Cell::new(Priority::Other) };
    /// The current call was stopped for using its whole CPU budget.
    static BUDGET_SPENT: Cell<bool> = const { Cell::new(false) };
}

/// Called when the current call is stopped for having used its whole CPU budget: its
/// tenant is penalised once the call ends.
pub(super) fn budget_spent() {
    BUDGET_SPENT.set(true);
}

/// Called from a running call once it has spent [`DEMOTE_AFTER`] of CPU: a call
/// thread drops to idle priority for the rest of the call, or until `starved_at` (see
/// [`rescue_starved`]). Best effort: where idle priority is not permitted the call goes on
/// at normal priority.
pub(super) fn demote_long_call(starved_at: Instant) {
    if PRIORITY.get() == Priority::Normal && set_idle_policy(true) {
        PRIORITY.set(Priority::Demoted);
        watch(Some(starved_at));
    }
}

/// Called from a demoted call that has been starved (see [`STARVED_AFTER`]): a call
/// thread goes back to normal priority for the rest of the call. The penalty lane stays
/// idle.
pub(super) fn undemote_starved_call() {
    if PRIORITY.get() == Priority::Demoted && set_idle_policy(false) {
        PRIORITY.set(Priority::Normal);
        watch(None);
    }
}

/// Back to normal priority after a call, or `Stuck` when that is not permitted.
fn restore_priority() {
    if PRIORITY.get() == Priority::Demoted {
        PRIORITY.set(if set_idle_policy(false) { Priority::Normal } else { Priority::Stuck });
        watch(None);
    }
}

/// The demoted calls' threads, and when each counts as starved. A thread at idle
/// priority on a machine whose cores are all busy may not run for seconds, so it cannot
/// notice by itself that it is starved: the epoch ticker (which runs at normal priority
/// while calls run) gives it normal priority back through [`rescue_starved`].
static DEMOTED: Mutex<Vec<(Tid, Instant)>> = Mutex::new(Vec::new());

#[cfg(target_os = "linux")]
type Tid = libc::pid_t;
#[cfg(not(target_os = "linux"))]
type Tid = u32;

/// Records (`Some`) or forgets (`None`) this thread's demotion.
fn watch(starved_at: Option<Instant>) {
    let tid = current_tid();
    let mut demoted = DEMOTED.lock().unwrap_or_else(|e| e.into_inner());
    demoted.retain(|(t, _)| *t != tid);
    demoted.extend(starved_at.map(|at| (tid, at)));
}

/// Called by the epoch ticker: every demoted call past the time it counts as starved
/// gets normal priority back (where permitted; else it does so itself once it runs).
pub(super) fn rescue_starved() {
    let Ok(mut demoted) = DEMOTED.try_lock() else { return };
    if demoted.is_empty() {
        return;
    }
    let now = Instant::now();
    demoted.retain(|&(tid, at)| at > now || !set_policy(tid, false));
}

/// `SCHED_IDLE` on, or back to `SCHED_OTHER`, for the calling thread.
fn set_idle_policy(idle: bool) -> bool {
    set_policy(0, idle)
}

/// `SCHED_IDLE` on, or back to `SCHED_OTHER`, for thread `tid` (0: the calling thread).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn set_policy(tid: Tid, idle: bool) -> bool {
    let policy = if idle { libc::SCHED_IDLE } else { libc::SCHED_OTHER };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `tid` is 0 (the calling thread) or a thread of this process, and `param` is
    // a valid sched_param that outlives the call.
    unsafe { libc::sched_setscheduler(tid, policy, &param) == 0 }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn current_tid() -> Tid {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

#[cfg(not(target_os = "linux"))]
fn set_policy(_tid: Tid, _idle: bool) -> bool {
    false
}

#[cfg(not(target_os = "linux"))]
fn current_tid() -> Tid {
    0
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
        let order: Vec<String> = (0..4).map(|_| state.next(Lane::Calls, 2).unwrap().0.to_string()).collect();
        assert_eq!(order, ["a", "b", "a", "b"]);
        assert!(state.next(Lane::Calls, 2).is_none(), "a already holds 2 threads");
        assert!(state.next(Lane::Penalty, 2).is_none(), "nobody is penalised");
        state.done(&a);
        assert_eq!(&*state.next(Lane::Calls, 2).unwrap().0, "a");
        assert!(state.queues.is_empty() && state.turns.is_empty());
    }

    #[test]
    fn a_penalised_tenants_calls_run_on_the_penalty_lane_only() {
        let mut state = State::default();
        let (good, evil): (Arc<str>, Arc<str>) = ("good".into(), "evil".into());
        state.penalise(&evil);
        for t in [&evil, &evil, &good] {
            let queue = state.queues.entry(Arc::clone(t)).or_default();
            queue.push_back(job());
            if queue.len() == 1 {
                state.turns.push_back(Arc::clone(t));
            }
        }
        // evil is first in turn order, but a call thread skips it.
        assert_eq!(&*state.next(Lane::Calls, 2).unwrap().0, "good");
        assert!(state.next(Lane::Calls, 2).is_none(), "a call thread took a penalised tenant's call");
        assert_eq!(&*state.next(Lane::Penalty, 2).unwrap().0, "evil");
        assert_eq!(&*state.next(Lane::Penalty, 2).unwrap().0, "evil");
        // The penalty ends PENALTY after the latest call that spent its budget.
        state.penalised.insert(Arc::clone(&evil), Instant::now());
        state.done(&evil);
        state.done(&evil);
        for _ in 0..2 {
            let queue = state.queues.entry(Arc::clone(&evil)).or_default();
            queue.push_back(job());
        }
        state.turns.push_back(Arc::clone(&evil));
        assert_eq!(&*state.next(Lane::Calls, 2).unwrap().0, "evil", "the penalty did not end");
    }
}
