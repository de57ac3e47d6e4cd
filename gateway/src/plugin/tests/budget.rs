//! The time budget under load (issue 48.16, 48.17): a call within its CPU budget never
//! times out however busy the machine is, and a tenant whose calls burn their budget does
//! not make another tenant's calls wait.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::*;
use crate::plugin::runtime::Runtime;
use crate::plugin::sandbox::thread_cpu_time;

const SPIN: &str = "(loop $l (br $l)) (i32.const 128)";

/// A classifier that counts to `turns` (legal work), then answers `delivered`.
fn counter(turns: u64) -> Vec<u8> {
    let body = format!(
        "(local $n i64)
         (loop $l
           (local.set $n (i64.add (local.get $n) (i64.const 1)))
           (br_if $l (i64.lt_u (local.get $n) (i64.const {turns}))))
         {DELIVERED}"
    );
    Guest::classify(Box::leak(body.into_boxed_str())).wasm()
}

/// `turns` of [`counter`] whose instructions take `cpu` of CPU time on a quiet machine, as
/// the budget charges them: at this machine's reference speed (`sandbox::reference_rate`,
/// which times the same loop), 8 units of fuel a turn (two `local.get`s, two constants, an
/// add, a `local.set`, a compare and a `br_if`; `loop` costs none). So a plugin of 0.9x its
/// budget is 0.9x whatever else the machine runs, not a measure of the moment.
fn calibrate(cpu: Duration) -> u64 {
    let rate = crate::plugin::sandbox::reference_rate().expect("a thread CPU clock");
    (cpu.as_nanos() as f64 * rate / 8.0) as u64
}

/// Threads that spin at normal priority until dropped (at most 60 s): a busy machine.
struct Hogs {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Hogs {
    fn start(count: usize) -> Hogs {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..count)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let until = Instant::now() + Duration::from_secs(60);
                    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Hogs { stop, threads }
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(target_os = "linux")]
#[test]
fn a_call_within_its_budget_never_times_out_on_a_busy_machine() {
    // The shape: a plugin of ~9 ms within the default 10 ms budget whose calls run
    // long, so at idle priority, which a machine whose cores are all busy starves: each call
    // waits for a core for several times its own CPU time (tens of ms of wall time), which a
    // budget of wall time would count. Beside busy cores the same turns also cost more CPU
    // time (a busy sibling hyperthread, a cold cache: a ~8.5 ms call once measured 12.5 ms of
    // its own CPU in a full suite run, past the 1.25x tolerance); its instructions are what
    // its budget charges (`sandbox::QuietRate`).
    let turns = calibrate(Duration::from_millis(9));
    let t = test_host(|c| c.call_threads = 2);
    t.host.install_blocking("slow", "count", &counter(turns)).unwrap();
    t.host.install_blocking("evil", "spin", &Guest::classify(SPIN).wasm()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // Its first call, before the machine is busy, measures its speed and work: its calls
    // fit its budget, so from then on CPU time stops one only at 2x.
    assert_eq!(rt.block_on(t.host.classify("slow", "count", &ctx(), &outcome(409))), Ok(Verdict::Delivered));
    let hogs = Hogs::start(4);
    let mut took = Vec::new();
    for i in 0..20 {
        let started = Instant::now();
        let verdict = rt.block_on(t.host.classify("slow", "count", &ctx(), &outcome(409)));
        took.push(started.elapsed());
        assert_eq!(verdict, Ok(Verdict::Delivered), "call {i} of a plugin within its budget, after {took:?}");
    }
    // A spinner is still stopped at its budget, busy machine or not.
    let started = Instant::now();
    let spun = rt.block_on(t.host.classify("evil", "spin", &ctx(), &outcome(409)));
    assert!(matches!(spun, Err(PluginFailure::Timeout(_))), "{spun:?}");
    drop(hogs);
    eprintln!("calls took {took:?}; the spinner {:?}", started.elapsed());
}

#[test]
fn a_tenant_burning_its_budget_never_holds_a_call_thread_another_tenant_needs() {
    // Two call threads, long budgets, so that "before any long call ends" is unambiguous
    // (slow's legal call is 400 ms of instructions at the machine's quiet speed, evil's
    // spins at least 1.25x 800 ms; with evil spinning on the sibling core the same turns can
    // cost 1.7x the CPU time, which the budget does not charge).
    let t = test_host(|c| {
        c.call_threads = 2;
        c.call_timeout = Duration::from_millis(800);
    });
    t.host.install_blocking("slow", "count", &counter(calibrate(Duration::from_millis(400)))).unwrap();
    t.host.install_blocking("evil", "spin", &Guest::classify(SPIN).wasm()).unwrap();
    t.host.install_blocking("good", "p", &Guest::classify(DELIVERED).wasm()).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    runtime.block_on(async {
        // evil's first call spends its budget.
        let spun = t.host.classify("evil", "spin", &ctx(), &outcome(409)).await;
        assert!(matches!(spun, Err(PluginFailure::Timeout(_))), "{spun:?}");
        // Now slow (legal, long) and evil (spinning again) are both running or queued:
        // slow holds one call thread, as a tenant may.
        let done = Arc::new(AtomicUsize::new(0));
        let long: Vec<_> = [("slow", "count"), ("evil", "spin"), ("evil", "spin")]
            .into_iter()
            .map(|(tenant, name)| {
                let (host, done) = (t.host.clone(), Arc::clone(&done));
                tokio::spawn(async move {
                    let result = host.classify(tenant, name, &ctx(), &outcome(409)).await;
                    done.fetch_add(1, Ordering::SeqCst);
                    result
                })
            })
            .collect();
        let submitted = Instant::now();
        let calls = |tenant: &str| t.host.metrics().iter().find(|m| m.tenant == tenant).map_or(0, |m| m.calls);
        while calls("slow") < 1 || calls("evil") < 3 {
            assert!(submitted.elapsed() < Duration::from_secs(10), "calls not submitted");
            tokio::task::yield_now().await;
        }
        // good's call runs at once on the other call thread: it does not wait for evil's
        // spins to use up their budgets (nor for slow's call). Each of those takes at least
        // 400 ms; good's takes microseconds plus the wait for a core on a busy machine.
        let started = Instant::now();
        assert_eq!(t.host.classify("good", "p", &ctx(), &outcome(409)).await, Ok(Verdict::Delivered));
        let waited = started.elapsed();
        assert!(waited < Duration::from_millis(300), "good waited {waited:?} for a long call");
        assert_eq!(done.load(Ordering::SeqCst), 0, "good waited {waited:?} for a long call");
        let results: Vec<_> = futures::future::join_all(long).await.into_iter().map(Result::unwrap).collect();
        assert!(
            matches!(
                results.as_slice(),
                [Ok(Verdict::Delivered), Err(PluginFailure::Timeout(_)), Err(PluginFailure::Timeout(_))]
            ),
            "{results:?}"
        );
    });
}

#[test]
fn a_call_within_the_budget_tolerance_succeeds_and_one_past_it_times_out() {
    // The CPU time of the same work varies with the machine's load, so a call is stopped at
    // 1.25x its budget, not at 1x, and only if its instructions at the plugin's quiet speed
    // would also have taken that long (issue 48.17). The calls run on this thread, so that
    // each one's CPU time is measured exactly.
    let budget = PluginConfig::new("").call_timeout;
    let dir = tempfile::tempdir().unwrap();
    let mut config = PluginConfig::new(dir.path());
    config.watch = false;
    let runtime = Runtime::new(&config).unwrap();
    let load = |cpu: Duration| runtime.load("acme", "count", &counter(calibrate(cpu)), HashMap::new()).unwrap();
    let timed = |plugin: &crate::plugin::runtime::LoadedPlugin| {
        let start = thread_cpu_time().unwrap();
        let verdict = plugin.classify(&ctx(), &outcome(409), None);
        (verdict, thread_cpu_time().unwrap() - start)
    };
    // About 1.1x its budget: over it, within the tolerance, so delivered.
    let within = load(budget.mul_f64(1.1));
    let mut used = Vec::new();
    for i in 0..10 {
        let (verdict, cpu) = timed(&within);
        used.push(cpu);
        // Its calls do not fit its budget, so they are held to 1.25x of CPU time.
        if cpu < budget.mul_f64(1.2) {
            assert_eq!(verdict, Ok(Verdict::Delivered), "call {i} used {cpu:?} of CPU, budget {budget:?}");
        }
    }
    // About 1.8x (far enough past 1.25x that the noise cannot bring it under): stopped once
    // it has used 1.25x, a timeout naming the budget.
    let past = load(budget.mul_f64(1.8));
    let (verdict, stopped) = timed(&past);
    assert!(matches!(verdict, Err(PluginFailure::Timeout(_))), "{verdict:?} after {stopped:?} of CPU");
    super::assert_timeout(&verdict, "used its CPU budget of 10ms (plugins.call_timeout)");
    assert!(stopped >= budget.mul_f64(1.25), "stopped after {stopped:?} of CPU, before 1.25x its budget");
    eprintln!("the 1.1x calls used {used:?} of CPU; the 1.8x call stopped after {stopped:?}");
}
