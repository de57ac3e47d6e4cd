//! Host tests with plugins written inline as WAT components: a well-behaved one, and
//! hostile ones (infinite loop, memory bomb, trap, malformed and oversized output,
//! wrong world), each of which must be contained with a clear reason.

mod budget;
mod limits;

use std::time::{Duration, Instant};

use super::*;

/// The hook bodies and data of a WAT test plugin. Bodies return a pointer to the
/// result area: 128 for `classify`, 160 for `sign`, 192 for `transform`.
struct Guest {
    hooks: u8,
    pages: u32,
    data: &'static str,
    /// More component items, e.g. core modules nobody instantiates.
    extra: &'static str,
    describe: &'static str,
    transform: &'static str,
    classify: &'static str,
    sign: &'static str,
}

const DELIVERED: &str = "(i32.store8 (i32.const 128) (i32.const 0)) (i32.const 128)";

impl Default for Guest {
    fn default() -> Self {
        Guest {
            hooks: 7,
            pages: 1,
            data: "",
            extra: "",
            describe: "(i32.const 0)",
            transform: "unreachable",
            classify: DELIVERED,
            sign: "unreachable",
        }
    }
}

/// The component text `Guest::wasm` fills in (shared with the bench's probes).
const WAT_PLUGIN: &str = include_str!("../../../tests/guests/wat-plugin.wat");

impl Guest {
    fn classify(body: &'static str) -> Self {
        Guest { hooks: 2, classify: body, ..Guest::default() }
    }

    fn wasm(&self) -> Vec<u8> {
        let Guest { hooks, pages, data, extra, describe, transform, classify, sign } = self;
        let text = [
            ("{hooks}", format!("{hooks:02x}")),
            ("{pages}", pages.to_string()),
            ("{data}", data.to_string()),
            ("{extra}", extra.to_string()),
            ("{describe}", describe.to_string()),
            ("{transform}", transform.to_string()),
            ("{classify}", classify.to_string()),
            ("{sign}", sign.to_string()),
        ]
        .iter()
        .fold(WAT_PLUGIN.to_string(), |text, (hole, value)| text.replace(hole, value));
        wat::parse_str(&text).unwrap_or_else(|e| panic!("bad test WAT: {e}"))
    }
}

struct TestHost {
    host: PluginHost,
    _dir: tempfile::TempDir,
}

fn test_host(configure: impl FnOnce(&mut PluginConfig)) -> TestHost {
    let dir = tempfile::tempdir().unwrap();
    let mut config = PluginConfig::new(dir.path());
    config.max_instances = 16;
    config.max_output_bytes = 64 << 10;
    config.watch = false;
    configure(&mut config);
    TestHost { host: PluginHost::start(config).unwrap(), _dir: dir }
}

fn ctx() -> DeliveryContext {
    DeliveryContext {
        tenant: "acme".into(),
        endpoint_id: "ep_1".into(),
        event_id: "evt_1".into(),
        event_type: "invoice.paid".into(),
        attempt: 1,
        timestamp: 1_700_000_000,
        attempt_id: "att_1".into(),
    }
}

fn outcome(status: u16) -> Outcome {
    Outcome::Response(Response { status, headers: vec![], body: b"conflict".to_vec() })
}

fn request() -> Request {
    Request { headers: vec![("content-type".into(), "application/json".into())], body: br#"{"a":1}"#.to_vec() }
}

/// Waits for a hook call the way a test thread can: hook calls are async (they run
/// on the host's call pool).
fn block<F: std::future::Future>(call: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(call)
}

fn classify_with(guest: Guest) -> Result<Verdict, PluginFailure> {
    let t = test_host(|_| {});
    t.host.install_blocking("acme", "p", &guest.wasm()).unwrap();
    block(t.host.classify("acme", "p", &ctx(), &outcome(409)))
}

#[test]
fn a_well_behaved_plugin_is_installed_listed_and_called() {
    let t = test_host(|_| {});
    let info = t.host.install_blocking("acme", "p", &Guest::classify(DELIVERED).wasm()).unwrap();
    assert_eq!(info.hooks, HookSet { classify: true, ..HookSet::default() });
    assert_eq!((info.plugin_name.as_str(), info.plugin_version.as_str()), ("wat-plugin", "0.0.1"));
    assert_eq!(info.sha256.len(), 64);
    assert!(t._dir.path().join("acme/p.wasm").is_file());

    for _ in 0..3 {
        assert_eq!(block(t.host.classify("acme", "p", &ctx(), &outcome(409))), Ok(Verdict::Delivered));
    }
    assert_eq!(t.host.get("acme", "p"), Some(info.hooks));
    assert_eq!(t.host.list("acme"), vec![info]);
    assert_eq!(
        block(t.host.sign("acme", "p", &ctx(), &[b"k".to_vec()], &request())),
        Err(PluginFailure::HookNotImplemented)
    );
    let metrics = t.host.metrics();
    let classify = metrics.iter().find(|m| m.hook == Hook::Classify).unwrap();
    assert_eq!((classify.calls, classify.failures), (3, 0));
}

#[test]
fn an_over_long_name_in_describe_is_truncated_and_the_plugin_kept() {
    // `describe` says a name of 8 MiB (zero bytes, valid UTF-8) at 65536 and a version of
    // 8 MiB aliasing it: twice the 4 MiB output cap, once refused as a whole (422).
    let guest = Guest {
        pages: 130,
        data: r#"(data (i32.const 0) "\00\00\01\00\00\00\80\00\00\00\01\00\00\00\80\00")"#,
        ..Guest::classify(DELIVERED)
    };
    let t = test_host(|c| c.max_output_bytes = PluginConfig::new("").max_output_bytes);
    let info = t.host.install_blocking("acme", "p", &guest.wasm()).unwrap();
    assert_eq!((info.plugin_name.len(), info.plugin_version.len()), (128, 128));
    assert_eq!(block(t.host.classify("acme", "p", &ctx(), &outcome(409))), Ok(Verdict::Delivered));
}

/// A classifier (declaring `hooks`) whose `describe` lists `statuses` for `classify`.
fn with_statuses(hooks: u8, statuses: &[u16]) -> Guest {
    let bytes: String = statuses.iter().flat_map(|s| s.to_le_bytes()).map(|b| format!("\\{b:02x}")).collect();
    let n = statuses.len();
    // The option's tag at 20, then the list's pointer (96) and length; the list at 96.
    let data =
        format!(r#"(data (i32.const 20) "\01\00\00\00\60\00\00\00\{n:02x}\00\00\00") (data (i32.const 96) "{bytes}")"#);
    Guest { hooks, data: Box::leak(data.into_boxed_str()), ..Guest::classify(DELIVERED) }
}

#[test]
fn classify_is_only_called_for_the_statuses_it_declares() {
    let t = test_host(|_| {});
    // 409 only; the plugin itself answers "delivered" to anything.
    let info = t.host.install_blocking("acme", "p", &with_statuses(2, &[409]).wasm()).unwrap();
    assert_eq!(info.classify_statuses, Some(vec![409]));
    assert_eq!(block(t.host.classify("acme", "p", &ctx(), &outcome(409))), Ok(Verdict::Delivered));
    assert_eq!(
        block(t.host.classify("acme", "p", &ctx(), &outcome(500))),
        Ok(Verdict::Default),
        "not called: built-in table"
    );
    assert_eq!(block(t.host.classify("acme", "p", &ctx(), &outcome(200))), Ok(Verdict::Default));
    let timeout = Outcome::TransportError(TransportError { kind: TransportErrorKind::Timeout, message: "t".into() });
    assert_eq!(
        block(t.host.classify("acme", "p", &ctx(), &timeout)),
        Ok(Verdict::Delivered),
        "transport errors always go to it"
    );

    let bad = [(with_statuses(2, &[999]), "999"), (with_statuses(1, &[409]), "without the classify hook")];
    for (guest, why) in bad {
        let err = t.host.install_blocking("acme", "q", &guest.wasm()).unwrap_err().to_string();
        assert!(err.contains(why), "{err}");
    }
}

#[test]
fn tenants_cannot_reach_each_others_plugins() {
    let t = test_host(|_| {});
    t.host.install_blocking("acme", "p", &Guest::classify(DELIVERED).wasm()).unwrap();
    assert_eq!(block(t.host.classify("globex", "p", &ctx(), &outcome(409))), Err(PluginFailure::NotFound));
    assert_eq!(t.host.get("globex", "p"), None);
    assert!(t.host.list("globex").is_empty());
}

#[test]
fn an_infinite_loop_times_out_quickly() {
    let started = Instant::now();
    let result = classify_with(Guest::classify("(loop $l (br $l)) (i32.const 128)"));
    assert_timeout(&result, "CPU budget of 10ms (plugins.call_timeout)");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
}

/// Asserts that `result` is a timeout whose reason names `budget` (a CPU budget and its
/// key): `used its <budget>`, or, for a call starved of CPU, `stopped after … of wall
/// time, the most a call with a <budget> may take`.
fn assert_timeout<T: std::fmt::Debug>(result: &Result<T, PluginFailure>, budget: &str) {
    let reason = result.as_ref().err().map(PluginFailure::reason).unwrap_or_default();
    assert!(reason.starts_with("plugin:timeout: ") && reason.contains(budget), "{result:?}: {reason}");
}

#[test]
fn an_idle_host_stops_ticking_and_a_call_wakes_it_in_time() {
    let t = test_host(|_| {});
    t.host.install_blocking("acme", "spin", &Guest::classify("(loop $l (br $l)) (i32.const 128)").wasm()).unwrap();
    let idle_since = Instant::now();
    while !t.host.ticker_sleeping() {
        assert!(idle_since.elapsed() < Duration::from_secs(10), "the epoch ticker never slept");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The deadline still holds: the call wakes the ticker instead of waiting out its
    // 10 s sleep (a starved call is stopped within 100 x 10 ms of wall time).
    let started = Instant::now();
    assert_timeout(&block(t.host.classify("acme", "spin", &ctx(), &outcome(409))), "plugins.call_timeout");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
}

#[test]
fn a_memory_bomb_hits_the_cap() {
    let bomb = "(if (i32.eq (memory.grow (i32.const 1000)) (i32.const -1)) (then unreachable)) (i32.const 128)";
    let expected = "memory: over its memory limit of 16 MiB (plugins.memory_limit_mib)";
    assert_eq!(classify_with(Guest::classify(bomb)).map_err(|f| f.to_string()), Err(expected.to_string()));
}

#[test]
fn the_load_pays_for_instantiating_and_its_instance_serves_the_first_call() {
    // `describe` marks its instance; `classify` says `retry` on an instance it did not mark.
    let marked = "(if (i32.eqz (i32.load8_u (i32.const 1000))) (then (i32.store8 (i32.const 128) (i32.const 1)) \
                  (i32.store8 (i32.const 132) (i32.const 0)) (return (i32.const 128)))) (i32.store8 (i32.const 128) \
                  (i32.const 0)) (i32.const 128)";
    let guest =
        Guest { describe: "(i32.store8 (i32.const 1000) (i32.const 1)) (i32.const 0)", ..Guest::classify(marked) };
    let t = test_host(|_| {});
    let info = t.host.install_blocking("acme", "p", &guest.wasm()).unwrap();
    let load = info.load_time.unwrap_or_default();
    assert!(load > Duration::ZERO, "the load time is reported: {info:?}");
    assert_eq!(t.host.warm_instances(), 1);
    let cpu = cpu_time();
    assert_eq!(
        block(t.host.classify("acme", "p", &ctx(), &outcome(409))),
        Ok(Verdict::Delivered),
        "the first call ran on the instance the load made, instantiating nothing"
    );
    // The call's own cost, apart from the load's, within twice its budget (CPU time: the
    // wall clock of a test beside others also counts their turns).
    let first = cpu_time() - cpu;
    assert!(first < PluginConfig::new("").call_timeout * 2, "the first call took {first:?} (the load {load:?})");
}

#[test]
fn a_call_that_runs_out_of_time_while_filling_its_memory_is_a_memory_failure() {
    // Half the 16 MiB cap and more grown, then stopped by the budget before the cap (as
    // any allocation loop is whose fresh pages cost more than its budget to touch).
    let grows = Guest::classify("(drop (memory.grow (i32.const 130))) (loop $l (br $l)) (i32.const 128)");
    let reason = classify_with(grows).map_err(|f| f.reason());
    let expected = "plugin:memory: grew by 8 MiB toward its memory limit of 16 MiB (plugins.memory_limit_mib) until its CPU budget of 10ms (plugins.call_timeout) ran out";
    assert_eq!(reason, Err(expected.to_string()));
    // Less than half: the budget is what stopped it, and the timeout says how far it grew.
    let reason =
        classify_with(Guest::classify("(drop (memory.grow (i32.const 64))) (loop $l (br $l)) (i32.const 128)"));
    assert_timeout(&reason, "CPU budget of 10ms (plugins.call_timeout)");
    assert_timeout(&reason, ", having grown by 4 MiB of its memory limit of 16 MiB");
}

#[test]
fn a_trap_is_contained_and_the_next_call_gets_a_fresh_instance() {
    let flaky = "(if (i32.eqz (i32.load (i32.const 256))) (then (i32.store (i32.const 256) (i32.const 1)) unreachable)) (i32.store8 (i32.const 128) (i32.const 0)) (i32.const 128)";
    let t = test_host(|_| {});
    t.host.install_blocking("acme", "p", &Guest::classify(DELIVERED).wasm()).unwrap();
    t.host.install_blocking("acme", "flaky", &Guest::classify(flaky).wasm()).unwrap();
    let failure = block(t.host.classify("acme", "flaky", &ctx(), &outcome(409))).unwrap_err();
    assert!(matches!(&failure, PluginFailure::Trap(msg) if msg.contains("unreachable")), "{failure:?}");
    assert!(failure.reason().starts_with("plugin:trap: "));
    // A fresh instance starts from the initial memory image, so it traps again: the
    // trapped instance was never reused.
    assert!(matches!(block(t.host.classify("acme", "flaky", &ctx(), &outcome(409))), Err(PluginFailure::Trap(_))));
    assert_eq!(block(t.host.classify("acme", "p", &ctx(), &outcome(409))), Ok(Verdict::Delivered));
    let traps = t.host.failures_by_kind().into_iter().find(|(k, _)| *k == "trap").unwrap().1;
    assert_eq!(traps, 2);
}

#[test]
fn malformed_output_is_rejected() {
    let bad_discriminant = "(i32.store8 (i32.const 128) (i32.const 9)) (i32.const 128)";
    assert!(matches!(classify_with(Guest::classify(bad_discriminant)), Err(PluginFailure::InvalidOutput(_))));

    let bad_utf8 = Guest {
        data: r#"(data (i32.const 300) "\ff\fe")"#,
        ..Guest::classify(
            "(i32.store8 (i32.const 128) (i32.const 2)) (i32.store (i32.const 132) (i32.const 300)) (i32.store (i32.const 136) (i32.const 2)) (i32.const 128)",
        )
    };
    assert!(matches!(classify_with(bad_utf8), Err(PluginFailure::InvalidOutput(_))));

    let out_of_bounds = "(i32.store8 (i32.const 128) (i32.const 2)) (i32.store (i32.const 132) (i32.const -256)) (i32.store (i32.const 136) (i32.const 100)) (i32.const 128)";
    assert!(matches!(classify_with(Guest::classify(out_of_bounds)), Err(PluginFailure::InvalidOutput(_))));

    let endless_pause = "(i32.store8 (i32.const 128) (i32.const 3)) (i32.store (i32.const 132) (i32.const -1)) (i32.store (i32.const 140) (i32.const 0)) (i32.const 128)";
    assert!(matches!(classify_with(Guest::classify(endless_pause)), Err(PluginFailure::InvalidOutput(_))));
}

/// `sign` returning `ok([(name at 500, value at 65536 of `len` bytes)])`.
const SIGN_ONE_HEADER: &str = "(i32.store8 (i32.const 160) (i32.const 0)) (i32.store (i32.const 164) (i32.const 400)) (i32.store (i32.const 168) (i32.const 1))
  (i32.store (i32.const 400) (i32.const 500)) (i32.store (i32.const 404) (i32.const 8)) (i32.store (i32.const 408) (i32.const 65536)) (i32.store (i32.const 412) (i32.load (i32.const 600))) (i32.const 160)";

fn sign_with(name: &'static str, value_len: &'static str) -> Result<Vec<Header>, PluginFailure> {
    sign_value(name, value_len, "abc")
}

/// [`sign_with`] with the value bytes (WAT string syntax) at 65536.
fn sign_value(name: &str, value_len: &str, value: &str) -> Result<Vec<Header>, PluginFailure> {
    let data: &'static str = Box::leak(
        format!(
            r#"(data (i32.const 500) "{name}") (data (i32.const 600) "{value_len}") (data (i32.const 65536) "{value}")"#
        )
        .into_boxed_str(),
    );
    let guest = Guest { hooks: 4, pages: 5, data, sign: SIGN_ONE_HEADER, ..Guest::default() };
    let t = test_host(|_| {});
    t.host.install_blocking("acme", "s", &guest.wasm()).unwrap();
    block(t.host.sign("acme", "s", &ctx(), &[b"key".to_vec()], &request()))
}

#[test]
fn sign_output_is_checked() {
    assert_eq!(sign_with("x-sig-aa", r"\03\00\00\00"), Ok(vec![("x-sig-aa".to_string(), "abc".to_string())]));
    // 200 000 bytes of value: over the 64 KiB output cap.
    assert_eq!(sign_with("x-sig-aa", r"\40\0d\03\00"), Err(PluginFailure::OutputTooLarge));
    assert!(matches!(sign_with("bad name", r"\03\00\00\00"), Err(PluginFailure::InvalidOutput(_))));
}

#[test]
fn transform_can_send_drop_or_refuse() {
    let echo = "(i32.store8 (i32.const 192) (i32.const 0)) (i32.store8 (i32.const 196) (i32.const 0))
      (i32.store (i32.const 200) (local.get 12)) (i32.store (i32.const 204) (local.get 13))
      (i32.store (i32.const 208) (local.get 14)) (i32.store (i32.const 212) (local.get 15)) (i32.const 192)";
    let drop = "(i32.store8 (i32.const 192) (i32.const 0)) (i32.store8 (i32.const 196) (i32.const 1))
      (i32.store (i32.const 200) (i32.const 300)) (i32.store (i32.const 204) (i32.const 3)) (i32.const 192)";
    let refuse = "(i32.store8 (i32.const 192) (i32.const 1))
      (i32.store (i32.const 196) (i32.const 300)) (i32.store (i32.const 200) (i32.const 3)) (i32.const 192)";
    let t = test_host(|_| {});
    for (name, body) in [("echo", echo), ("drop", drop), ("refuse", refuse)] {
        let guest = Guest { hooks: 1, data: r#"(data (i32.const 300) "bye")"#, transform: body, ..Guest::default() };
        t.host.install_blocking("acme", name, &guest.wasm()).unwrap();
    }
    assert_eq!(block(t.host.transform("acme", "echo", &ctx(), &request())), Ok(TransformResult::Send(request())));
    assert_eq!(block(t.host.transform("acme", "drop", &ctx(), &request())), Ok(TransformResult::Drop("bye".into())));
    let refused = block(t.host.transform("acme", "refuse", &ctx(), &request())).unwrap_err();
    assert_eq!(refused, PluginFailure::Guest("bye".into()));
    assert_eq!(refused.reason(), "plugin:error: bye");
}

#[test]
fn uploads_are_validated_before_anything_is_written() {
    let t = test_host(|c| c.max_plugin_bytes = 64 << 10);
    let good = Guest::classify(DELIVERED).wasm();
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        ("Acme", "p", good.clone()),
        ("acme", "../p", good.clone()),
        ("acme", "p", vec![0; 65 << 10]),
        ("acme", "p", b"not wasm at all".to_vec()),
        ("acme", "p", wat::parse_str("(module)").unwrap()),
        ("acme", "p", wat::parse_str(r#"(component (core module $m (func (export "f"))) (core instance $i (instantiate $m)) (func (export "describe") (canon lift (core func $i "f"))))"#).unwrap()),
        ("acme", "p", Guest { hooks: 0, ..Guest::default() }.wasm()),
    ];
    let mut errors = Vec::new();
    for (tenant, name, bytes) in cases {
        let err = t.host.install_blocking(tenant, name, &bytes).unwrap_err();
        assert!(err.is_client_error(), "{err}");
        errors.push(err);
    }
    assert!(matches!(errors[0], PluginError::InvalidName { what: "tenant", .. }));
    assert!(matches!(errors[1], PluginError::InvalidName { .. }));
    assert!(matches!(errors[2], PluginError::TooLarge { .. }));
    assert!(matches!(errors[3], PluginError::Invalid(_)));
    assert!(matches!(errors[4], PluginError::Invalid(_)));
    assert!(matches!(errors[5], PluginError::WrongWorld(_)), "{}", errors[5]);
    assert!(matches!(errors[6], PluginError::Rejected(_)));
    assert!(!t._dir.path().join("acme").join("p.wasm").exists());
    assert!(t.host.list("acme").is_empty());
}

#[test]
fn a_broken_file_leaves_the_old_version_serving_with_its_error_visible() {
    let t = test_host(|_| {});
    let v1 = t.host.install_blocking("acme", "p", &Guest::classify(DELIVERED).wasm()).unwrap();
    std::fs::write(t._dir.path().join("acme/p.wasm"), b"garbage").unwrap();
    t.host.rescan().unwrap();
    let listed = t.host.list("acme");
    assert_eq!(listed[0].sha256, v1.sha256);
    assert!(listed[0].error.as_deref().unwrap_or("").contains("not a valid WebAssembly component"), "{listed:?}");
    assert_eq!(block(t.host.classify("acme", "p", &ctx(), &outcome(409))), Ok(Verdict::Delivered));

    std::fs::remove_file(t._dir.path().join("acme/p.wasm")).unwrap();
    t.host.rescan().unwrap();
    assert_eq!(block(t.host.classify("acme", "p", &ctx(), &outcome(409))), Err(PluginFailure::NotFound));
}

#[test]
fn the_watcher_hot_reloads_changed_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("acme")).unwrap();
    std::fs::write(dir.path().join("acme/p.wasm"), Guest::classify(DELIVERED).wasm()).unwrap();
    let mut config = PluginConfig::new(dir.path());
    config.max_instances = 16;
    config.reload_debounce = Duration::from_millis(50);
    let host = PluginHost::start(config).unwrap();
    assert!(host.wait_loaded(Duration::from_secs(20)));
    assert_eq!(block(host.classify("acme", "p", &ctx(), &outcome(409))), Ok(Verdict::Delivered));

    let retry = "(i32.store8 (i32.const 128) (i32.const 1)) (i32.store8 (i32.const 132) (i32.const 1)) (i32.store (i32.const 136) (i32.const 30)) (i32.const 128)";
    let tmp = dir.path().join("acme/.p.tmp");
    std::fs::write(&tmp, Guest::classify(retry).wasm()).unwrap();
    std::fs::rename(&tmp, dir.path().join("acme/p.wasm")).unwrap();
    std::fs::create_dir_all(dir.path().join("globex")).unwrap();
    std::fs::write(dir.path().join("globex/q.wasm"), Guest::classify(DELIVERED).wasm()).unwrap();

    let deadline = Instant::now() + Duration::from_secs(20);
    while block(host.classify("acme", "p", &ctx(), &outcome(409))) != Ok(Verdict::Retry(Some(30))) {
        assert!(Instant::now() < deadline, "reload not seen: {:?}", host.list("acme"));
        std::thread::sleep(Duration::from_millis(20));
    }
    while host.get("globex", "q").is_none() {
        assert!(Instant::now() < deadline, "new tenant's plugin not seen");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn plugin_config_and_logs_reach_the_cli_runner() {
    let logging = Guest {
        data: r#"(data (i32.const 300) "hello")"#,
        ..Guest::classify(
            "(call $log (i32.const 2) (i32.const 300) (i32.const 5)) (i32.store8 (i32.const 128) (i32.const 5)) (i32.const 128)",
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.wasm");
    std::fs::write(&path, logging.wasm()).unwrap();

    let report = check_file(&path, &PluginConfig::for_cli()).unwrap();
    assert!(report.contains("hooks:   classify"), "{report}");

    let out =
        run_hook_file(&path, &PluginConfig::for_cli(), "classify", r#"{"outcome": {"status": 409, "body": "dup"}}"#)
            .unwrap();
    let out: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["result"]["verdict"], "default");
    assert_eq!(out["logs"][0]["message"], "hello");
    assert_eq!(out["logs"][0]["level"], "info");

    let err = run_hook_file(&path, &PluginConfig::for_cli(), "sign", r#"{"secrets": ["k"]}"#).unwrap_err();
    assert!(matches!(err, PluginError::Call { failure: PluginFailure::HookNotImplemented, .. }), "{err}");
    assert!(matches!(run_hook_file(&path, &PluginConfig::for_cli(), "classify", "{}"), Err(PluginError::Input(_))));
}

#[test]
fn calls_from_many_threads_survive_concurrent_swaps() {
    fn assert_shareable<T: Clone + Send + Sync + 'static>() {}
    assert_shareable::<PluginHost>();

    let retry = "(i32.store8 (i32.const 128) (i32.const 1)) (i32.store8 (i32.const 132) (i32.const 1)) (i32.store (i32.const 136) (i32.const 30)) (i32.const 128)";
    let versions = [Guest::classify(DELIVERED).wasm(), Guest::classify(retry).wasm()];
    let t = test_host(|c| c.max_instances = 64);
    t.host.install_blocking("acme", "p", &versions[0]).unwrap();
    std::thread::scope(|s| {
        let callers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    for _ in 0..300 {
                        let verdict = block(t.host.classify("acme", "p", &ctx(), &outcome(409))).unwrap();
                        assert!(matches!(verdict, Verdict::Delivered | Verdict::Retry(Some(30))), "{verdict:?}");
                    }
                })
            })
            .collect();
        for i in 0..6 {
            t.host.install_blocking("acme", "p", &versions[i % 2]).unwrap();
        }
        callers.into_iter().for_each(|c| c.join().unwrap());
    });
    let m = t.host.metrics();
    assert_eq!((m[0].calls, m[0].failures), (1200, 0));
}

/// `classify` answering `retry(some(<low 32 bits of wasi:random get-random-u64>))`.
const RANDOM_RETRY: &str = "(i32.store8 (i32.const 128) (i32.const 1)) (i32.store8 (i32.const 132) (i32.const 1))
  (i32.store (i32.const 136) (i32.wrap_i64 (call $random))) (i32.const 128)";

/// `classify` answering `retry(some(<low 32 bits of wasi:random insecure-seed>))`.
const SEED_RETRY: &str = "(call $seed (i32.const 256)) (i32.store8 (i32.const 128) (i32.const 1))
  (i32.store8 (i32.const 132) (i32.const 1)) (i32.store (i32.const 136) (i32.load (i32.const 256))) (i32.const 128)";

fn ctx_of(attempt_id: &str) -> DeliveryContext {
    DeliveryContext { attempt_id: attempt_id.into(), ..ctx() }
}

#[test]
fn wasi_random_is_seeded_by_the_attempt_id() {
    for guest in [RANDOM_RETRY, SEED_RETRY] {
        draws_differ_per_attempt_and_repeat_per_id(guest);
    }
}

fn draws_differ_per_attempt_and_repeat_per_id(guest: &'static str) {
    let t = test_host(|_| {});
    t.host.install_blocking("acme", "r", &Guest::classify(guest).wasm()).unwrap();
    let draw = |id: &str| match block(t.host.classify("acme", "r", &ctx_of(id), &outcome(409))) {
        Ok(Verdict::Retry(Some(n))) => n,
        other => panic!("{other:?}"),
    };
    let first = draw("att_a");
    // The same (warm) instance again: a fresh stream per call, the same for the same id.
    assert_eq!(draw("att_a"), first);
    let others: Vec<u32> = ["att_b", "att_c", "att_d"].iter().map(|id| draw(id)).collect();
    assert!(others.iter().all(|n| *n != first), "{first} vs {others:?}");
    assert_ne!(others[0], others[1]);
}

#[test]
fn guest_exit_is_a_trap_with_its_status() {
    let exit = Guest::classify("(call $exit (i32.const 1)) (i32.const 128)");
    assert_eq!(classify_with(exit), Err(PluginFailure::Trap("exit(1)".into())));
}

#[test]
fn header_values_must_be_visible_ascii_and_headers_are_capped() {
    assert_eq!(sign_value("x-sig-aa", r"\03\00\00\00", "a b"), Ok(vec![("x-sig-aa".into(), "a b".into())]));
    for (len, value) in [(r"\02\00\00\00", r"\c3\a9"), (r"\03\00\00\00", r"a\09b"), (r"\03\00\00\00", r"a\7fb")] {
        let got = sign_value("x-sig-aa", len, value);
        assert!(
            matches!(&got, Err(PluginFailure::InvalidOutput(m)) if m.contains("visible ASCII")),
            "{value}: {got:?}"
        );
    }
    let most = sign_headers(64, 3);
    assert!(matches!(&most, Ok(h) if h.len() == 64), "{most:?}");
    let too_many = sign_headers(65, 3);
    assert!(matches!(&too_many, Err(PluginFailure::InvalidOutput(m)) if m.contains("65 headers")), "{too_many:?}");
}

/// `sign` returning `count` headers named `x-sig-aa`, every value aliasing the same
/// `value_len` bytes of memory at 65536.
fn sign_headers(count: u32, value_len: u32) -> Result<Vec<Header>, PluginFailure> {
    timed_sign(aliased_headers(count, value_len), |_| {}).0
}

/// A `sign` plugin returning `count` headers named `x-sig-aa`, every value aliasing
/// the same `value_len` bytes of memory at 65536.
fn aliased_headers(count: u32, value_len: u32) -> Guest {
    let entry: String =
        [500u32, 8, 65536, value_len].iter().flat_map(|v| v.to_le_bytes()).map(|b| format!("\\{b:02x}")).collect();
    let list = entry.repeat(count as usize);
    let data = format!(
        r#"(data (i32.const 500) "x-sig-aa") (data (i32.const 65536) "abc") (data (i32.const 131072) "{list}")"#
    );
    let body = format!(
        "(i32.store8 (i32.const 160) (i32.const 0)) (i32.store (i32.const 164) (i32.const 131072)) (i32.store (i32.const 168) (i32.const {count})) (i32.const 160)"
    );
    Guest {
        hooks: 4,
        pages: 3 + (count * 16).div_ceil(1 << 16),
        data: Box::leak(data.into_boxed_str()),
        sign: Box::leak(body.into_boxed_str()),
        ..Guest::default()
    }
}

/// Installs `guest` on a host configured by `configure` and calls its `sign`: the
/// result, and the CPU time of the process during the call alone (the call runs on a
/// pool thread; the wall clock on a shared machine also counts others' turns).
fn timed_sign(
    guest: Guest,
    configure: impl FnOnce(&mut PluginConfig),
) -> (Result<Vec<Header>, PluginFailure>, Duration) {
    let t = test_host(configure);
    t.host.install_blocking("acme", "s", &guest.wasm()).unwrap();
    let started = cpu_time();
    let got = block(t.host.sign("acme", "s", &ctx(), &[b"key".to_vec()], &request()));
    (got, cpu_time() - started)
}

/// A `sign` plugin that calls `get-config` `calls` times with a key of `key_len` bytes.
fn config_keys(calls: u32, key_len: u32) -> Guest {
    let body = format!(
        "(local.set 0 (i32.const 0)) (loop $l (call $get_config (i32.const 65536) (i32.const {key_len}) (i32.const \
         256)) (local.set 0 (i32.add (local.get 0) (i32.const 1))) (br_if $l (i32.lt_u (local.get 0) (i32.const \
         {calls})))) (i32.store8 (i32.const 160) (i32.const 0)) (i32.store (i32.const 168) (i32.const 0)) \
         (i32.const 160)"
    );
    Guest { hooks: 4, pages: 2 + key_len.div_ceil(1 << 16), sign: Box::leak(body.into_boxed_str()), ..Guest::default() }
}

#[test]
fn amplified_output_ends_within_a_few_budgets() {
    // The defaults: a 10 ms budget, a 4 MiB output cap (and so 4 MiB of hostcall fuel).
    let defaults = PluginConfig::new("");
    let (budget, cap) = (defaults.call_timeout, defaults.max_output_bytes);
    let with_defaults = |c: &mut PluginConfig| c.max_output_bytes = cap;
    let cases = [
        ("100k headers aliasing one 1 KiB value", aliased_headers(100_000, 1 << 10)),
        ("50k headers (100k strings) aliasing one 1 KiB value", aliased_headers(50_000, 1 << 10)),
        ("get-config with 8 MiB keys, 1000 times", config_keys(1000, 8 << 20)),
        ("get-config with 4 MiB keys (within the fuel), 1000 times", config_keys(1000, (4 << 20) - 1)),
    ];
    for (what, guest) in cases {
        let (got, took) = timed_sign(guest, with_defaults);
        eprintln!("{what}: {took:?} ({got:?})");
        assert!(got.is_err(), "{what}: {got:?}");
        // The CPU time of the first call, which instantiates too, in a debug build.
        assert!(took < budget * 4, "{what} took {took:?}");
    }
}

#[test]
fn aliased_output_is_refused_before_the_host_copies_it() {
    // 2000 headers whose values all alias one 60 KiB buffer: 120 MB if the host copied
    // them all (wasmtime's own limit is 128 MiB). The hostcall fuel, set from the 64 KiB
    // output cap, stops the copy after about that much.
    let cpu = cpu_time();
    assert_eq!(sign_headers(2000, 60 << 10), Err(PluginFailure::OutputTooLarge));
    assert!(cpu_time() - cpu < Duration::from_secs(2), "took {:?} of CPU", cpu_time() - cpu);

    // The same bound holds for every host call, not only for a hook's result: a log
    // line over the output cap is refused rather than copied (and then truncated).
    let log = |len: u32| Guest {
        pages: 6,
        ..Guest::classify(Box::leak(
            format!("(call $log (i32.const 2) (i32.const 131072) (i32.const {len})) {DELIVERED}").into_boxed_str(),
        ))
    };
    assert_eq!(classify_with(log(60 << 10)), Ok(Verdict::Delivered));
    assert_eq!(classify_with(log(200 << 10)), Err(PluginFailure::OutputTooLarge));
}

#[test]
fn a_tenant_spinning_at_its_budget_leaves_a_call_thread_to_the_others() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    // Two call threads; a long budget so that "before any spin ends" is unambiguous.
    let t = test_host(|c| {
        c.call_threads = 2;
        c.call_timeout = Duration::from_millis(300);
    });
    t.host.install_blocking("evil", "spin", &Guest::classify("(loop $l (br $l)) (i32.const 128)").wasm()).unwrap();
    t.host.install_blocking("acme", "p", &Guest::classify(DELIVERED).wasm()).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    runtime.block_on(async {
        let spins_done = Arc::new(AtomicUsize::new(0));
        let spins: Vec<_> = (0..2)
            .map(|_| {
                let (host, done) = (t.host.clone(), Arc::clone(&spins_done));
                tokio::spawn(async move {
                    let result = host.classify("evil", "spin", &ctx(), &outcome(409)).await;
                    done.fetch_add(1, Ordering::SeqCst);
                    result
                })
            })
            .collect();
        // Both spins are submitted once both are counted (counting and submitting
        // happen in one poll).
        let submitted = Instant::now();
        while t.host.metrics().iter().find(|m| m.tenant == "evil").map_or(0, |m| m.calls) < 2 {
            assert!(submitted.elapsed() < Duration::from_secs(10), "spins not submitted");
            tokio::task::yield_now().await;
        }
        // evil may hold one of the two threads, so acme's call runs at once instead of
        // waiting for a spin to use up its budget.
        assert_eq!(t.host.classify("acme", "p", &ctx(), &outcome(409)).await, Ok(Verdict::Delivered));
        assert_eq!(spins_done.load(Ordering::SeqCst), 0, "acme waited for a spinning call");
        for spin in spins {
            assert!(matches!(spin.await.unwrap(), Err(PluginFailure::Timeout(_))));
        }
    });
}

/// The scheduling policy of each plugin call thread of this process (0 normal, 5 idle).
#[cfg(target_os = "linux")]
fn call_thread_policies() -> Vec<u32> {
    let mut policies = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("herald-plugin-c") {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        // Fields after the command's closing parenthesis start at field 3; policy is 41.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        policies.push(after.split(' ').nth(41 - 3).unwrap().parse().unwrap());
    }
    policies
}

#[cfg(target_os = "linux")]
#[test]
fn a_long_call_runs_at_idle_priority_and_its_thread_comes_back_normal() {
    let t = test_host(|c| {
        c.call_threads = 2;
        c.call_timeout = Duration::from_millis(200);
    });
    t.host.install_blocking("evil", "spin", &Guest::classify("(loop $l (br $l)) (i32.const 128)").wasm()).unwrap();
    t.host.install_blocking("acme", "p", &Guest::classify(DELIVERED).wasm()).unwrap();
    assert_eq!(call_thread_policies(), [0, 0]);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    runtime.block_on(async {
        let host = t.host.clone();
        let spin = tokio::spawn(async move { host.classify("evil", "spin", &ctx(), &outcome(409)).await });
        let started = Instant::now();
        while !call_thread_policies().contains(&5) {
            assert!(!spin.is_finished(), "the spinning call ended at normal priority");
            assert!(started.elapsed() < Duration::from_secs(10), "no call thread was demoted");
            tokio::task::yield_now().await;
        }
        // A short call is not demoted, and runs while the long one holds a thread.
        assert_eq!(t.host.classify("acme", "p", &ctx(), &outcome(409)).await, Ok(Verdict::Delivered));
        assert!(matches!(spin.await.unwrap(), Err(PluginFailure::Timeout(_))));
        // Every call thread is back at normal priority: restored, or (where that is not
        // permitted) retired and replaced, at the next call, by one at normal priority.
        let ended = Instant::now();
        loop {
            assert_eq!(t.host.classify("acme", "p", &ctx(), &outcome(409)).await, Ok(Verdict::Delivered));
            let policies = call_thread_policies();
            if policies == [0, 0] {
                break;
            }
            assert!(ended.elapsed() < Duration::from_secs(5), "{policies:?}");
            tokio::task::yield_now().await;
        }
    });
}

/// A well-behaved classifier that also carries a core module nobody instantiates, with
/// one function of `instructions` × 3 bytes: what a compile bomb looks like.
fn bomb(instructions: usize) -> Vec<u8> {
    let body = "i32.const 1 drop ".repeat(instructions);
    let extra = format!("(core module $bomb (func (export \"f\") {body}))");
    Guest { extra: Box::leak(extra.into_boxed_str()), ..Guest::classify(DELIVERED) }.wasm()
}

#[test]
fn a_compile_bomb_is_refused_before_compiling_at_upload_and_by_the_cli() {
    let t = test_host(|c| c.structure.max_function_bytes = 64 << 10);
    let cpu = cpu_time();
    let err = t.host.install_blocking("acme", "bomb", &bomb(30_000)).unwrap_err();
    assert!(matches!(&err, PluginError::Structure(m) if m.contains("a function of 90")), "{err}");
    assert!(err.is_client_error());
    assert!(cpu_time() - cpu < Duration::from_secs(1), "took {:?} of CPU", cpu_time() - cpu);
    assert!(!t._dir.path().join("acme/bomb.wasm").exists());
    // Under the limit, the same shape is an ordinary plugin.
    t.host.install_blocking("acme", "small", &bomb(1_000)).unwrap();

    let counted = test_host(|c| c.structure.max_modules = 2);
    let err = counted.host.install_blocking("acme", "p", &bomb(10)).unwrap_err();
    assert!(matches!(&err, PluginError::Structure(m) if m.contains("core modules")), "{err}");

    // The CLI's default limit (512 KiB) and a 600 KB function.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bomb.wasm");
    std::fs::write(&path, bomb(200_000)).unwrap();
    let cpu = cpu_time();
    let err = check_file(&path, &PluginConfig::for_cli()).unwrap_err();
    assert!(matches!(&err, PluginError::Structure(_)), "{err}");
    assert!(err.to_string().contains("refused before compiling"), "{err}");
    assert!(cpu_time() - cpu < Duration::from_secs(1), "took {:?} of CPU", cpu_time() - cpu);
}

/// CPU time this process has used so far: what a test bounds when it means "cheap" (on
/// a loaded machine the wall clock also counts everybody else's turns).
fn cpu_time() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

#[test]
fn a_component_of_another_world_is_refused_before_compiling() {
    let t = test_host(|_| {});
    let imports_more = r#"(component (import "acme:evil/net" (instance)) (core module $m (func (export "f"))) (core instance $i (instantiate $m)) (func (export "describe") (canon lift (core func $i "f"))))"#;
    let err = t.host.install_blocking("acme", "p", &wat::parse_str(imports_more).unwrap()).unwrap_err();
    assert!(matches!(&err, PluginError::WrongWorld(m) if m.contains("acme:evil/net")), "{err}");
}

#[test]
fn a_tenant_is_held_to_its_plugin_count_and_size() {
    let wasm = Guest::classify(DELIVERED).wasm();
    let t = test_host(|c| {
        c.max_plugins_per_tenant = 2;
        c.max_tenant_bytes = wasm.len() * 2 + 10;
    });
    t.host.install_blocking("acme", "a", &wasm).unwrap();
    t.host.install_blocking("acme", "b", &wasm).unwrap();
    t.host.install_blocking("acme", "b", &wasm).unwrap(); // replacing is not adding
    let err = t.host.install_blocking("acme", "c", &wasm).unwrap_err();
    assert!(
        matches!(&err, PluginError::TenantLimit { key, have: 3, limit: 2, .. } if key == "plugins.max_plugins_per_tenant"),
        "{err}"
    );
    assert!(err.to_string().contains("plugins.max_plugins_per_tenant is 2"), "{err}");
    assert!(!t._dir.path().join("acme/c.wasm").exists());
    // Another tenant is not affected.
    t.host.install_blocking("globex", "c", &wasm).unwrap();
    assert_eq!(block(t.host.classify("globex", "c", &ctx(), &outcome(409))), Ok(Verdict::Delivered));

    // Bytes: a bigger version of `b` would take acme past its total.
    let bigger = Guest {
        data: r#"(data (i32.const 2000) "0123456789abcdefghijklmnopqrstuvwxyz")"#,
        ..Guest::classify(DELIVERED)
    };
    let err = t.host.install_blocking("acme", "b", &bigger.wasm()).unwrap_err();
    assert!(matches!(&err, PluginError::TenantLimit { key, .. } if key == "plugins.max_tenant_bytes"), "{err}");
    assert_eq!(t.host.list("acme").len(), 2);
}

#[test]
fn idle_plugins_hold_no_instance_slot() {
    // Far more plugins than slots: loading keeps its instance only within the warm budget
    // (half the pool), so every upload works.
    let t = test_host(|c| {
        c.max_instances = 8;
        c.warm_idle = Duration::from_millis(100);
    });
    for i in 0..40 {
        let tenant = if i % 2 == 0 { "acme" } else { "globex" };
        t.host.install_blocking(tenant, &format!("p{i}"), &Guest::classify(DELIVERED).wasm()).unwrap();
    }
    assert!(t.host.warm_instances() <= 4, "{} warm", t.host.warm_instances());
    for i in 0..40 {
        let tenant = if i % 2 == 0 { "acme" } else { "globex" };
        assert_eq!(
            block(t.host.classify(tenant, &format!("p{i}"), &ctx(), &outcome(409))),
            Ok(Verdict::Delivered),
            "p{i}"
        );
    }
    // At most half the pool stays warm, and an idle instance is dropped.
    let warm = t.host.warm_instances();
    assert!((1..=4).contains(&warm), "{warm} warm");
    let deadline = Instant::now() + Duration::from_secs(10);
    while t.host.warm_instances() > 0 {
        assert!(Instant::now() < deadline, "idle instances kept");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_restart_loads_from_the_compile_cache_in_the_background() {
    let plugins = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let config = |max_instances| {
        let mut c = PluginConfig::new(plugins.path());
        c.cache_dir = Some(cache.path().to_path_buf());
        c.max_instances = max_instances;
        c.max_plugins_per_tenant = 100;
        c.watch = false;
        c
    };
    let host = PluginHost::start(config(64)).unwrap();
    for i in 0..30 {
        host.install_blocking("acme", &format!("p{i}"), &with_statuses(2, &[400 + i]).wasm()).unwrap();
    }
    host.install_blocking("zeta", "z", &Guest::classify(DELIVERED).wasm()).unwrap();
    drop(host);
    let artifacts = std::fs::read_dir(cache.path()).unwrap().count();
    assert_eq!(artifacts, 31, "one compiled artifact per distinct plugin");

    // Fewer slots than acme has plugins: zeta's plugin loads all the same.
    let host = PluginHost::start(config(8)).unwrap();
    assert!(host.wait_loaded(Duration::from_secs(20)), "{:?}", host.list("zeta"));
    assert_eq!(block(host.classify("zeta", "z", &ctx(), &outcome(409))), Ok(Verdict::Delivered));
    assert_eq!(host.list("acme").len(), 30);
    assert!(host.list("acme").iter().all(|p| p.error.is_none() && !p.loading));
    assert_eq!(block(host.classify("acme", "p9", &ctx(), &outcome(409))), Ok(Verdict::Delivered));
    assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 31, "nothing compiled again");

    // A corrupt artifact is dropped and compiled again. (Replaced, never rewritten in
    // place: a mapped artifact that shrinks would fault the process that maps it.)
    drop(host);
    for entry in std::fs::read_dir(cache.path()).unwrap() {
        let path = entry.unwrap().path();
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, b"not an artifact").unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    let host = PluginHost::start(config(8)).unwrap();
    assert!(host.wait_loaded(Duration::from_secs(60)));
    assert_eq!(block(host.classify("zeta", "z", &ctx(), &outcome(409))), Ok(Verdict::Delivered));
}

#[test]
fn the_compile_cache_must_be_outside_the_plugins_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = PluginConfig::new(dir.path());
    config.cache_dir = Some(dir.path().join("acme"));
    let err = PluginHost::start(config).unwrap_err();
    assert!(err.to_string().contains("must be outside the plugins directory"), "{err}");
}

#[test]
fn the_cli_says_when_it_compiles_the_javascript_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("herald-js.wasm");
    std::fs::write(&file, b"\0asm a runtime never compiled").unwrap();
    let mut config = PluginConfig::for_cli();
    config.js_runtime = Some(file);
    let runtime = runtime::Runtime::new(&config).unwrap();
    let notice = cli::compile_notice(&runtime, b"function transform(ctx, req) { return req; }");
    assert!(notice.is_some_and(|n| n.contains("compiling Herald's JavaScript runtime")), "{notice:?}");
    assert_eq!(cli::compile_notice(&runtime, &Guest::default().wasm()), None, "a component compiles in no time");
}
