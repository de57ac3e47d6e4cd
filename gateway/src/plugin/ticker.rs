//! The epoch ticker: advances the engine's epoch (the clock of call deadlines) while
//! calls may run, and sleeps while none does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use wasmtime::Engine;

use super::engine::EPOCH_TICK;
use super::types::PluginError;

/// Advances the engine's epoch every [`EPOCH_TICK`] while calls may be running, and
/// sleeps while none has run for [`TICKER_IDLE`] ticks: an idle host does not wake a
/// thousand times a second, and a busy one pays no wake-up per call.
pub(crate) struct Ticker {
    active: AtomicUsize,
    pub(super) parked: AtomicBool,
    thread: std::thread::Thread,
}

/// Ticks without a call before the ticker sleeps.
const TICKER_IDLE: u32 = 100;

impl Ticker {
    /// Starts the ticker thread; it ends once the engine is dropped.
    pub(super) fn start(engine: &Engine) -> Result<Arc<Ticker>, PluginError> {
        let weak = engine.weak();
        let (tx, rx) = std::sync::mpsc::channel::<Arc<Ticker>>();
        let handle = std::thread::Builder::new()
            .name("herald-plugin-epoch".into())
            .spawn(move || {
                let Ok(ticker) = rx.recv() else { return };
                // Parked from the start: a node that has no call to run yet does not tick.
                let mut idle = TICKER_IDLE;
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    // A long call starved at idle priority cannot notice it by itself.
                    super::pool::rescue_starved();
                    idle = if ticker.active.load(Ordering::SeqCst) == 0 { idle + 1 } else { 0 };
                    if idle < TICKER_IDLE {
                        std::thread::sleep(EPOCH_TICK);
                        continue;
                    }
                    ticker.parked.store(true, Ordering::SeqCst);
                    // Re-checked after announcing the sleep: a call that began in
                    // between either is seen here or sees `parked` and wakes us.
                    if ticker.active.load(Ordering::SeqCst) == 0 {
                        // Bounded, so the thread notices a dropped engine.
                        std::thread::park_timeout(Duration::from_secs(10));
                    }
                    ticker.parked.store(false, Ordering::SeqCst);
                    idle = 0;
                }
            })
            .map_err(|e| PluginError::Engine(format!("cannot start the epoch thread: {e}")))?;
        let ticker = Arc::new(Ticker {
            active: AtomicUsize::new(0),
            parked: AtomicBool::new(false),
            thread: handle.thread().clone(),
        });
        tx.send(Arc::clone(&ticker)).map_err(|_| PluginError::Engine("the epoch thread ended at start".into()))?;
        Ok(ticker)
    }

    /// Marks a call running (the epoch must advance) until the guard drops.
    pub(super) fn enter(&self) -> TickerGuard<'_> {
        if self.active.fetch_add(1, Ordering::SeqCst) == 0 && self.parked.load(Ordering::SeqCst) {
            self.thread.unpark();
        }
        TickerGuard(self)
    }
}

pub(super) struct TickerGuard<'a>(&'a Ticker);

impl Drop for TickerGuard<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}
