//! The wasmtime engine: what compiled code depends on (shared by the server and the
//! `herald plugin compile` child, so artifacts load where they were made) and the
//! server's instance pool. The bottom of the host: it knows nothing of plugins.

use std::time::Duration;

use wasmtime::{Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::types::PluginConfig;

/// How often the epoch advances; the granularity of call deadlines.
pub(super) const EPOCH_TICK: Duration = Duration::from_millis(1);

/// The engine `herald plugin compile` compiles with: the server's code-generation
/// settings (so its artifacts load there), without the instance pool.
pub(crate) fn compile_engine() -> wasmtime::Result<Engine> {
    let mut config = engine_config();
    // One core: the node's other core keeps serving while a plugin compiles.
    config.parallel_compilation(false);
    Engine::new(&config)
}

pub(super) fn build_engine(cfg: &PluginConfig) -> wasmtime::Result<Engine> {
    let mut pool = PoolingAllocationConfig::default();
    let instances = cfg.max_instances.max(1);
    pool.total_component_instances(instances)
        .total_core_instances(instances.saturating_mul(8))
        .max_core_instances_per_component(16)
        .total_memories(instances.saturating_mul(2))
        .max_memories_per_component(2)
        .total_tables(instances.saturating_mul(8))
        .max_tables_per_component(8)
        .max_memory_size(cfg.max_memory())
        .total_stacks(0);
    let mut config = engine_config();
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&config)
}

/// What compiled code depends on; shared by the server and the compiler child.
fn engine_config() -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config
        .epoch_interruption(true)
        // Fuel counts a call's instructions (about one unit each), so that its budget can
        // tell work from a slow machine (`sandbox::QuietRate`); it never runs out. It
        // costs a counter update per basic block.
        .consume_fuel(true)
        .memory_init_cow(true)
        // A 4 GiB reservation plus a guard region covers every 32-bit address a guest
        // can form, so compiled code needs no bounds check on each load and store
        // (explicit checks made the example plugins' calls 7–11 % slower). It is address
        // space only (PROT_NONE, never committed): 2 memories × 1000 slots ≈ 8 TiB of the
        // 128 TiB a process has. The memory cap is enforced on growth, not by the mapping.
        .memory_reservation(4 << 30)
        .memory_guard_size(32 << 20)
        .memory_reservation_for_growth(0)
        .max_wasm_stack(512 << 10);
    config
}
