//! Per-tenant limits (`[plugins.tenant.<tenant>]`) and what stored versions take: each
//! limit holds for the tenant that has it and no other, pinned versions outlive pruning,
//! and kept versions count toward the tenant's bytes.

use super::*;
use crate::plugin::TenantLimitOverrides;

const SPIN: &str = "(loop $l (br $l)) (i32.const 128)";

/// A plugin that grows its memory by `pages` (64 KiB each) in `classify`.
fn grower(pages: u32) -> Vec<u8> {
    let body = format!(
        "(if (i32.eq (memory.grow (i32.const {pages})) (i32.const -1)) (then unreachable)) (i32.store8 (i32.const \
         128) (i32.const 0)) (i32.const 128)"
    );
    Guest::classify(Box::leak(body.into_boxed_str())).wasm()
}

/// A distinct well-behaved plugin for each `n` (its bytes differ, its size does not).
fn numbered(n: u32) -> Vec<u8> {
    let data = format!(r#"(data (i32.const 2000) "{n:08}")"#);
    Guest { data: Box::leak(data.into_boxed_str()), ..Guest::classify(DELIVERED) }.wasm()
}

fn own(tenant: &str, o: TenantLimitOverrides) -> impl FnOnce(&mut PluginConfig) {
    let tenant = tenant.to_string();
    move |c| {
        c.tenant_limits.insert(tenant, o);
    }
}

#[test]
fn a_tenant_with_more_memory_runs_what_the_default_cannot() {
    let big = TenantLimitOverrides { memory_limit: Some(48 << 20), ..Default::default() };
    let t = test_host(own("big", big));
    // 400 pages (25 MiB) more than the first: past the default 16 MiB, within 48.
    let wasm = grower(400);
    for tenant in ["acme", "big"] {
        t.host.install_blocking(tenant, "grow", &wasm).unwrap();
    }
    let memory = |r: Result<Verdict, PluginFailure>| r.map_err(|f| f.reason());
    let over = |limit: &str| Err(format!("plugin:memory: over its memory limit of {limit}"));
    assert_eq!(
        memory(block(t.host.classify("acme", "grow", &ctx(), &outcome(409)))),
        over("16 MiB (plugins.memory_limit_mib)")
    );
    assert_eq!(block(t.host.classify("big", "grow", &ctx(), &outcome(409))), Ok(Verdict::Delivered));
    // The tenant's cap holds too: past 48 MiB it fails like the default.
    t.host.install_blocking("big", "bigger", &grower(800)).unwrap();
    let bigger = block(t.host.classify("big", "bigger", &ctx(), &outcome(409)));
    assert_eq!(memory(bigger), over("48 MiB (plugins.tenant.big.memory_limit_mib)"));
}

/// Runs `call` and returns what it gave and how long it took.
fn timed<R>(call: impl std::future::Future<Output = R>) -> (R, Duration) {
    let started = Instant::now();
    let result = block(call);
    (result, started.elapsed())
}

#[test]
fn each_tenant_spins_for_its_own_budget() {
    // The budget is CPU time, so a spinning call lasts at least its budget of wall time;
    // and a call is stopped after at most 100x its budget of wall time (when starved at
    // idle priority), so `quick`'s 2 ms ends well before `slow`'s 400 ms could.
    let quick = TenantLimitOverrides {
        call_timeout: Some(Duration::from_millis(2)),
        call_timeout_per_mib: Some(Duration::from_millis(300)),
        ..Default::default()
    };
    let slow = TenantLimitOverrides { call_timeout: Some(Duration::from_millis(400)), ..Default::default() };
    let t = test_host(|c| {
        own("quick", quick)(c);
        own("slow", slow)(c);
    });
    // Pages enough for a 1 MiB body to be passed in.
    let spin =
        Guest { hooks: 3, pages: 20, transform: "(loop $l (br $l)) (i32.const 192)", ..Guest::classify(SPIN) }.wasm();
    for tenant in ["quick", "slow"] {
        t.host.install_blocking(tenant, "spin", &spin).unwrap();
    }
    let (quick_result, quick_took) = timed(t.host.classify("quick", "spin", &ctx(), &outcome(409)));
    let (slow_result, slow_took) = timed(t.host.classify("slow", "spin", &ctx(), &outcome(409)));
    super::assert_timeout(&quick_result, "CPU budget of 2ms (plugins.tenant.quick.call_timeout)");
    super::assert_timeout(&slow_result, "CPU budget of 400ms (plugins.tenant.slow.call_timeout)");
    assert!(quick_took < Duration::from_millis(400), "quick ran {quick_took:?}");
    assert!(slow_took >= Duration::from_millis(400), "slow stopped after {slow_took:?}");
    // The input-size part is the tenant's too: 1 MiB of body adds quick's 300 ms.
    let big = Request { headers: vec![], body: vec![b'x'; 1 << 20] };
    let (result, took) = timed(t.host.transform("quick", "spin", &ctx(), &big));
    // The reason names both parts of the budget.
    super::assert_timeout(
        &result,
        "CPU budget of 302ms (plugins.tenant.quick.call_timeout 2ms + plugins.tenant.quick.call_timeout_per_mib 300ms per MiB of input)",
    );
    assert!(took >= Duration::from_millis(302), "a 1 MiB call stopped after {took:?}");
}

#[test]
fn upload_limits_are_per_tenant_and_name_the_key() {
    let wasm = numbered(1);
    let slim = TenantLimitOverrides { max_plugin_bytes: Some(wasm.len() - 1), ..Default::default() };
    let single = TenantLimitOverrides { max_plugins: Some(1), ..Default::default() };
    let t = test_host(|c| {
        own("slim", slim)(c);
        own("single", single)(c);
    });
    let err = t.host.install_blocking("slim", "p", &wasm).unwrap_err();
    assert!(
        matches!(&err, PluginError::TooLarge { key, .. } if key == "plugins.tenant.slim.max_plugin_bytes"),
        "{err}"
    );
    assert!(err.to_string().contains("plugins.tenant.slim.max_plugin_bytes is"), "{err}");
    assert_eq!(t.host.upload_limit("slim"), (wasm.len() - 1, "plugins.tenant.slim.max_plugin_bytes".to_string()));
    t.host.install_blocking("acme", "p", &wasm).unwrap();
    assert_eq!(t.host.upload_limit("acme"), (8 << 20, "plugins.max_plugin_bytes".to_string()));

    t.host.install_blocking("single", "a", &wasm).unwrap();
    let err = t.host.install_blocking("single", "b", &wasm).unwrap_err();
    assert!(
        matches!(&err, PluginError::TenantLimit { key, .. } if key == "plugins.tenant.single.max_plugins"),
        "{err}"
    );
    t.host.install_blocking("acme", "b", &wasm).unwrap();
}

fn version_numbers(t: &TestHost, tenant: &str, name: &str) -> Vec<u32> {
    t.host.versions(tenant, name).iter().map(|v| v.number).collect()
}

#[test]
fn pinned_versions_are_kept_beyond_the_newest_twenty() {
    let t = test_host(|c| c.max_tenant_bytes = usize::MAX);
    let total = MAX_VERSIONS as u32 + 3;
    for n in 1..=total {
        block(t.host.install_keeping("acme", "p", numbered(n), vec![1, 2])).unwrap();
    }
    let mut want = vec![1, 2];
    want.extend(total - MAX_VERSIONS as u32 + 1..=total);
    assert_eq!(version_numbers(&t, "acme", "p"), want);
    // Pinned ones still load and serve.
    assert!(block(t.host.ensure_pinned("acme", "p@1")));
    assert_eq!(block(t.host.classify("acme", "p@1", &ctx(), &outcome(409))), Ok(Verdict::Delivered));
    // Unpinned, the oldest goes at the next upload like any other.
    block(t.host.install_keeping("acme", "p", numbered(total + 1), vec![2])).unwrap();
    assert_eq!(version_numbers(&t, "acme", "p")[..2], [2, total + 2 - MAX_VERSIONS as u32]);
}

#[test]
fn kept_versions_count_toward_the_tenant_bytes() {
    let size = numbered(1).len();
    // Room for three versions of `p` (each with its serving copy counted once).
    let t = test_host(|c| c.max_tenant_bytes = 3 * size + size / 2);
    for n in 1..=3 {
        t.host.install_blocking("acme", "p", &numbered(n)).unwrap();
    }
    assert_eq!(version_numbers(&t, "acme", "p"), [1, 2, 3]);
    // A fourth makes room by letting the oldest unpinned version go.
    block(t.host.install_keeping("acme", "p", numbered(4), vec![])).unwrap();
    assert_eq!(version_numbers(&t, "acme", "p"), [2, 3, 4]);
    block(t.host.install_keeping("acme", "p", numbered(5), vec![2])).unwrap();
    assert_eq!(version_numbers(&t, "acme", "p"), [2, 4, 5]);
    // Everything pinned: nothing can go, so the upload is refused, saying what counts.
    let err = block(t.host.install_keeping("acme", "p", numbered(6), vec![2, 4, 5])).unwrap_err();
    assert!(matches!(&err, PluginError::TenantLimit { key, .. } if key == "plugins.max_tenant_bytes"), "{err}");
    assert!(err.to_string().contains("serving files and kept versions"), "{err}");
    assert_eq!(version_numbers(&t, "acme", "p"), [2, 4, 5]);
    // Another plugin's versions count for the tenant too.
    let err = t.host.install_blocking("acme", "q", &numbered(7)).unwrap_err();
    assert!(matches!(err, PluginError::TenantLimit { .. }), "{err}");
    // A rollback serves what is stored: it fits, and deletes nothing.
    block(t.host.rollback("acme", "p", 2)).unwrap();
    assert_eq!(version_numbers(&t, "acme", "p"), [2, 4, 5]);
}
