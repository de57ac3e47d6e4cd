//! Test harness: `TestGateway` (a real Herald node in-process on 127.0.0.1:0 with its own
//! temporary directory), `HeraldProcess` (the real `herald` binary, for crash tests and
//! benchmarks), `FakeReceiver` (a scriptable webhook receiver that records what it gets) and
//! `Api` (a small JSON client). Every wait has a timeout.

// Test code: a failed unwrap is a failed test, and tests compare against the wall clock.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{Notify, oneshot};

pub mod pg;

pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef";
/// A `[secrets] key` (`HERALD_SECRETS_KEY`) for nodes that seal stored secrets.
pub const SEAL_KEY: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

/// A JSON client for Herald's API.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// A response: status and parsed JSON (Null when the body is empty or not JSON).
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub json: Value,
    pub text: String,
    pub headers: http::HeaderMap,
}

impl Reply {
    /// This reply, if its status is `status`; else an error with its body.
    pub fn expect(self, status: u16) -> anyhow::Result<Reply> {
        anyhow::ensure!(self.status == status, "expected {status}, got {}: {}", self.status, self.text);
        Ok(self)
    }
}

/// The one poll of the suite: runs `probe` every 20 ms until it answers `Ok(value)`, for
/// at most `timeout`. `Err(state)` is "not yet": the failure names `what` and the last
/// state seen. An error of the probe itself (a request that failed) fails at once.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Result<T, String>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let state = match probe().await? {
            Ok(value) => return Ok(value),
            Err(state) => state,
        };
        if Instant::now() > deadline {
            bail!("{what}: not within {timeout:?}; last seen: {state}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `Ok(())` when `done`, else "not yet" with `state` (for [`eventually`]).
pub fn done_or(done: bool, state: impl std::fmt::Display) -> anyhow::Result<Result<(), String>> {
    Ok(if done { Ok(()) } else { Err(state.to_string()) })
}

impl Api {
    pub fn new(base: impl Into<String>) -> Api {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        Api { base: base.into(), client: Client::builder(TokioExecutor::new()).pool_max_idle_per_host(256).build(http) }
    }

    /// Sends a request with a raw body; `token` goes in `Authorization: Bearer`.
    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: impl Into<Bytes>,
    ) -> anyhow::Result<Reply> {
        self.raw_with(method, path, token, &[], body).await
    }

    /// [`Api::raw`] with more request headers.
    pub async fn raw_with(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> anyhow::Result<Reply> {
        let mut req = http::Request::builder().method(method).uri(format!("{}{}", self.base, path));
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.header("content-type", "application/json").body(Full::new(body.into()))?;
        let resp = tokio::time::timeout(Duration::from_secs(30), self.client.request(req))
            .await
            .context("API request timed out")??;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok(Reply { status, json, text, headers })
    }

    pub async fn call(&self, method: &str, path: &str, token: &str, body: Option<Value>) -> anyhow::Result<Reply> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        self.raw(method, path, Some(token), body).await
    }

    pub async fn get(&self, path: &str, token: &str) -> anyhow::Result<Reply> {
        self.call("GET", path, token, None).await
    }

    pub async fn post(&self, path: &str, token: &str, body: Value) -> anyhow::Result<Reply> {
        self.call("POST", path, token, Some(body)).await
    }

    /// Creates a tenant with the admin token.
    pub async fn tenant(&self, id: &str) -> anyhow::Result<()> {
        let r = self.post("/v1/tenants", ADMIN_TOKEN, json!({ "id": id })).await?;
        if r.status != 201 {
            bail!("create tenant {id}: {} {}", r.status, r.text);
        }
        Ok(())
    }

    /// Creates a tenant token with `scopes` and returns it.
    pub async fn token(&self, tenant: &str, scopes: &[&str]) -> anyhow::Result<String> {
        let r = self.post(&format!("/v1/tenants/{tenant}/tokens"), ADMIN_TOKEN, json!({ "scopes": scopes })).await?;
        if r.status != 201 {
            bail!("create token: {} {}", r.status, r.text);
        }
        Ok(r.json["token"].as_str().context("token")?.to_string())
    }

    /// Creates an endpoint and returns its JSON (with `id` and `secret`).
    pub async fn endpoint(&self, tenant: &str, body: Value) -> anyhow::Result<Value> {
        let r = self.post(&format!("/v1/tenants/{tenant}/endpoints"), ADMIN_TOKEN, body).await?;
        if r.status != 201 {
            bail!("create endpoint: {} {}", r.status, r.text);
        }
        Ok(r.json)
    }

    /// Posts an event; returns the reply.
    pub async fn event(&self, tenant: &str, body: Value) -> anyhow::Result<Reply> {
        self.post(&format!("/v1/tenants/{tenant}/events"), ADMIN_TOKEN, body).await
    }

    /// Polls `GET path` until `done` holds, or fails after `timeout`.
    pub async fn wait_for(
        &self,
        path: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        eventually(path, timeout, || async {
            let r = self.get(path, ADMIN_TOKEN).await?;
            Ok(if r.status == 200 && done(&r.json) { Ok(r.json) } else { Err(format!("{} {}", r.status, r.text)) })
        })
        .await
    }
}

/// Which store a test node runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file in the node's temporary directory.
    Sqlite,
    /// A fresh schema in the test Postgres database (see `pg`).
    Postgres,
}

/// A Herald node running in this process, on its own temporary directory.
pub struct TestGateway {
    pub api: Api,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    /// Dropped after the node: its Postgres schema, if it runs on one.
    schema: Option<pg::PgSchema>,
}

impl TestGateway {
    pub async fn start() -> anyhow::Result<TestGateway> {
        Self::start_with(&[]).await
    }

    /// Starts with extra `HERALD_*` settings.
    pub async fn start_with(env: &[(&str, &str)]) -> anyhow::Result<TestGateway> {
        let dir = tempfile::tempdir()?;
        Self::start_in(dir, env).await
    }

    /// Starts on `backend` with extra `HERALD_*` settings.
    pub async fn start_on(backend: Backend, env: &[(&str, &str)]) -> anyhow::Result<TestGateway> {
        let dir = tempfile::tempdir()?;
        match backend {
            Backend::Sqlite => Self::start_in(dir, env).await,
            Backend::Postgres => {
                let schema = pg::PgSchema::create().await?;
                let mut vars: Vec<(&str, &str)> = vec![("HERALD_STORE_URL", schema.url.as_str())];
                vars.extend_from_slice(env);
                let mut gw = Self::start_in(dir, &vars).await?;
                gw.schema = Some(schema);
                Ok(gw)
            }
        }
    }

    pub async fn start_in(dir: tempfile::TempDir, env: &[(&str, &str)]) -> anyhow::Result<TestGateway> {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("HERALD_TEST_LOG"))
            .with_test_writer()
            .try_init();
        let mut vars = base_env(dir.path());
        vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let config = gateway::config::Config::load(None, vars)?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            if let Err(e) = gateway::app::run(config, listener, shutdown).await {
                eprintln!("test gateway stopped: {e}");
            }
        });
        let api = Api::new(format!("http://{addr}"));
        wait_healthy(&api).await?;
        Ok(TestGateway { api, addr, dir, stop: Some(stop), task: Some(task), schema: None })
    }

    /// The Postgres schema the node runs on (`Backend::Postgres`), for a test to reach into.
    pub fn schema(&self) -> Option<&pg::PgSchema> {
        self.schema.as_ref()
    }

    /// Stops the node and waits for it to finish; returns its directory for a restart.
    pub async fn stop(mut self) -> tempfile::TempDir {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        std::mem::replace(&mut self.dir, dir)
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Every byte a node in `dir` stored in its SQLite database (`herald.db` and its `-wal`
/// and `-shm` files), for a test that a secret is never stored in clear.
pub fn stored_bytes(dir: &Path) -> anyhow::Result<Vec<u8>> {
    let mut stored = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("herald.db")) {
            stored.extend(std::fs::read(&path)?);
        }
    }
    Ok(stored)
}

/// The settings every test node gets: a SQLite file in `dir`, a random port, the admin
/// token, private destinations allowed (receivers live on 127.0.0.1), and the compile cache
/// all nodes share ([`shared_plugin_cache`]). Nodes start with a cleared environment;
/// `HERALD_SERVER_WORKER_THREADS` is passed through when the caller sets it, so a benchmark
/// can compare runtime sizes.
pub fn base_env(dir: &Path) -> Vec<(String, String)> {
    const WORKERS: &str = "HERALD_SERVER_WORKER_THREADS";
    let workers = std::env::var(WORKERS).ok().map(|v| (WORKERS.to_string(), v));
    let mut env: Vec<(String, String)> = vec![
        ("HERALD_SERVER_LISTEN".into(), "127.0.0.1:0".into()),
        ("HERALD_SERVER_ADMIN_TOKEN".into(), ADMIN_TOKEN.into()),
        ("HERALD_STORE_URL".into(), format!("sqlite://{}", dir.join("herald.db").display())),
        ("HERALD_DELIVERY_ALLOW_PRIVATE_DESTINATIONS".into(), "true".into()),
        ("HERALD_PLUGINS_DIR".into(), dir.join("plugins").display().to_string()),
        ("HERALD_PLUGINS_CACHE_DIR".into(), shared_plugin_cache().display().to_string()),
        ("HERALD_LOG_LEVEL".into(), "warn".into()),
    ];
    env.extend(workers);
    env
}

/// The compile cache every test node shares, `plugin-cache` beside the running binary in
/// the build's target directory (`target/debug/plugin-cache`): each plugin is compiled with
/// cranelift once, then every node of every test maps the artifact. Safe to share: an
/// artifact is named by the component's SHA-256 and the engine's compatibility hash,
/// written whole and renamed into place, never changed. A test about compiling itself gives
/// its node a cache of its own (`HERALD_PLUGINS_CACHE_DIR` in its settings).
pub fn shared_plugin_cache() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("the running binary's path");
        let mut dir = exe.parent().expect("the binary's folder").to_path_buf();
        if dir.ends_with("deps") {
            dir.pop();
        }
        dir.join("plugin-cache")
    })
    .clone()
}

async fn wait_healthy(api: &Api) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = api.raw("GET", "/readyz", None, Bytes::new()).await
            && r.status == 200
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("herald at {} did not become ready", api.base);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Appends a custom section to a component: the same plugin with other bytes (another
/// version, another SHA-256).
pub fn with_custom_section(mut bytes: Vec<u8>, tag: &str) -> Vec<u8> {
    let name = b"herald-test";
    let payload_len = 1 + name.len() + tag.len();
    bytes.push(0);
    bytes.push(payload_len as u8);
    bytes.push(name.len() as u8);
    bytes.extend_from_slice(name);
    bytes.extend_from_slice(tag.as_bytes());
    bytes
}

/// CPU time (user + system) used so far by `who` (`libc::RUSAGE_SELF`: this process, every
/// thread; `libc::RUSAGE_CHILDREN`: its children that ended and were waited for). A test
/// that means "cheap" bounds this, not the wall clock: on a loaded machine the wall clock
/// also counts the other processes' turns and the disk's stalls.
#[allow(unsafe_code)]
pub fn cpu_time(who: libc::c_int) -> Duration {
    // SAFETY: getrusage writes one plain struct it is handed.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `who` is one of the values getrusage accepts, or it fails cleanly.
    let rc = unsafe { libc::getrusage(who, &mut usage) };
    assert_eq!(rc, 0, "getrusage({who}): {}", std::io::Error::last_os_error());
    let of = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    of(usage.ru_utime) + of(usage.ru_stime)
}

/// Runs `command` to its end: its output, and the CPU time it used.
pub fn output_and_cpu_time(command: &mut std::process::Command) -> std::io::Result<(std::process::Output, Duration)> {
    let before = cpu_time(libc::RUSAGE_CHILDREN);
    let output = command.output()?;
    Ok((output, cpu_time(libc::RUSAGE_CHILDREN).saturating_sub(before)))
}

/// Path of the `herald` binary built alongside the running test or benchmark.
pub fn herald_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().context("exe dir")?.to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join("herald");
    if !bin.exists() {
        bail!("{} not found: build it first (cargo build -p gateway --bin herald)", bin.display());
    }
    Ok(bin)
}

/// The real `herald` binary running as a child process.
pub struct HeraldProcess {
    pub api: Api,
    child: std::process::Child,
}

impl HeraldProcess {
    /// Starts `herald serve` on `dir` (its SQLite file lives there) on a free port.
    pub async fn start(binary: &Path, dir: &Path, env: &[(&str, &str)]) -> anyhow::Result<HeraldProcess> {
        Self::start_logged(binary, dir, env, None).await
    }

    /// Like `start`, with the node's stdout and stderr (its logs) written to `log`.
    pub async fn start_logged(
        binary: &Path,
        dir: &Path,
        env: &[(&str, &str)],
        log: Option<&Path>,
    ) -> anyhow::Result<HeraldProcess> {
        Self::spawn(binary, dir, env, log, None).await
    }

    /// Like `start`, with `config` (TOML) written to `dir/herald.toml` and passed as
    /// `--config`; `HERALD_*` variables still override it.
    pub async fn start_with_config(
        binary: &Path,
        dir: &Path,
        env: &[(&str, &str)],
        config: &str,
    ) -> anyhow::Result<HeraldProcess> {
        let path = dir.join("herald.toml");
        std::fs::write(&path, config)?;
        Self::spawn(binary, dir, env, None, Some(&path)).await
    }

    async fn spawn(
        binary: &Path,
        dir: &Path,
        env: &[(&str, &str)],
        log: Option<&Path>,
        config: Option<&Path>,
    ) -> anyhow::Result<HeraldProcess> {
        let port = free_port()?;
        let mut cmd = std::process::Command::new(binary);
        cmd.arg("serve").current_dir(dir).env_clear().stdin(std::process::Stdio::null());
        if let Some(config) = config {
            cmd.arg("--config").arg(config);
        }
        if let Some(log) = log {
            let file = std::fs::File::create(log)?;
            cmd.stdout(file.try_clone()?).stderr(file);
        }
        for (k, v) in base_env(dir) {
            cmd.env(k, v);
        }
        cmd.env("HERALD_SERVER_LISTEN", format!("127.0.0.1:{port}"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().with_context(|| format!("spawn {}", binary.display()))?;
        let api = Api::new(format!("http://127.0.0.1:{port}"));
        let mut p = HeraldProcess { api, child };
        if let Err(e) = wait_healthy(&p.api).await {
            p.kill();
            return Err(e);
        }
        Ok(p)
    }

    /// SIGKILL: no shutdown, no flush.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (up to `within`) for the process to end by itself; its exit status.
    pub async fn exited(&mut self, within: Duration) -> anyhow::Result<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            anyhow::ensure!(Instant::now() < deadline, "herald {} still runs after {within:?}", self.child.id());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM, and waits (up to `within`) for the drained shutdown to end the process.
    pub async fn terminate(&mut self, within: Duration) -> anyhow::Result<std::process::ExitStatus> {
        let pid = libc::pid_t::try_from(self.child.id())?;
        // SAFETY: kill(2) sends a signal to the child this value owns; it has not been waited for.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        anyhow::ensure!(rc == 0, "SIGTERM {pid}: {}", std::io::Error::last_os_error());
        let exited = self.exited(within).await;
        if exited.is_err() {
            self.kill();
        }
        exited.with_context(|| format!("herald {pid} did not stop within {within:?} of SIGTERM"))
    }
}

impl Drop for HeraldProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// How the fake receiver answers one request.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub delay: Duration,
}

impl Answer {
    pub fn status(status: u16) -> Answer {
        Answer { status, headers: Vec::new(), body: String::new(), delay: Duration::ZERO }
    }
    pub fn header(mut self, k: &str, v: &str) -> Answer {
        self.headers.push((k.into(), v.into()));
        self
    }
    pub fn body(mut self, b: &str) -> Answer {
        self.body = b.into();
        self
    }
    pub fn delay(mut self, d: Duration) -> Answer {
        self.delay = d;
        self
    }
    /// Accept and never answer (until the client gives up).
    pub fn hang() -> Answer {
        Answer::status(200).delay(Duration::from_secs(3600))
    }
}

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub at: Instant,
    pub path: String,
    pub headers: http::HeaderMap,
    pub body: Bytes,
    pub status: u16,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// Picks out requests by their body and answers them.
type Rule = Arc<dyn Fn(&[u8]) -> Option<Answer> + Send + Sync>;

#[derive(Default)]
struct ReceiverState {
    script: VecDeque<Answer>,
    default: Option<Answer>,
    /// Once the script is used up: this share of requests (0 to 1) gets this answer.
    flaky: Option<(f64, Answer)>,
    /// Before the script: requests whose body this picks out get its answer.
    rule: Option<Rule>,
    received: Vec<Received>,
}

/// A webhook receiver on 127.0.0.1:0 whose answers can be scripted and changed mid-test.
#[derive(Clone)]
pub struct FakeReceiver {
    pub addr: SocketAddr,
    state: Arc<Mutex<ReceiverState>>,
    arrived: Arc<Notify>,
}

impl FakeReceiver {
    /// Starts a receiver that answers 200 unless told otherwise.
    pub async fn start() -> anyhow::Result<FakeReceiver> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let r = FakeReceiver {
            addr: listener.local_addr()?,
            state: Arc::new(Mutex::new(ReceiverState { default: Some(Answer::status(200)), ..Default::default() })),
            arrived: Arc::new(Notify::new()),
        };
        let me = r.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let me = me.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let me = me.clone();
                        async move { me.handle(req).await }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(r)
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Answers the next requests with these, in order, then with the default.
    pub fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        self.state.lock().unwrap().script.extend(answers);
    }

    /// Changes how requests are answered once the script is used up.
    pub fn set_default(&self, a: Answer) {
        self.state.lock().unwrap().default = Some(a);
    }

    /// Once the script is used up, answers `share` (0 to 1) of the requests, at random,
    /// with `a` instead of the default.
    pub fn fail_at_random(&self, share: f64, a: Answer) {
        self.state.lock().unwrap().flaky = Some((share, a));
    }

    /// Answers the requests whose body `rule` picks out with its answer, before anything
    /// else.
    pub fn answer_when(&self, rule: impl Fn(&[u8]) -> Option<Answer> + Send + Sync + 'static) {
        self.state.lock().unwrap().rule = Some(Arc::new(rule));
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    pub fn count(&self) -> usize {
        self.state.lock().unwrap().received.len()
    }

    /// Fails if more than `n` requests arrive within `window` (absence needs a window:
    /// checked at once, a count cannot tell a request that will never come from one that
    /// has not come yet).
    pub async fn stays_at(&self, n: usize, window: Duration) -> anyhow::Result<()> {
        match self.wait_for(n + 1, window).await {
            Ok(got) => bail!("expected {n} requests to stay {n} for {window:?}; got {}", got.len()),
            Err(_) => Ok(()),
        }
    }

    /// Waits until at least `n` requests arrived.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> anyhow::Result<Vec<Received>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.arrived.notified();
            // Count first: cloning everything received on every arrival is quadratic.
            if self.count() >= n {
                return Ok(self.received());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                bail!("receiver got {} of {n} requests within {timeout:?}", self.count());
            }
        }
    }

    async fn handle(&self, req: http::Request<Incoming>) -> Result<http::Response<Full<Bytes>>, hyper::Error> {
        let at = Instant::now();
        let (parts, body) = req.into_parts();
        let body = body.collect().await?.to_bytes();
        let answer = {
            let mut s = self.state.lock().unwrap();
            let flaky = s.flaky.as_ref().filter(|(share, _)| rand::random::<f64>() < *share).map(|(_, a)| a.clone());
            let ruled = s.rule.as_ref().and_then(|rule| rule(&body));
            let a = match ruled {
                Some(a) => a,
                None => s.script.pop_front().or(flaky).or_else(|| s.default.clone()).unwrap_or(Answer::status(200)),
            };
            s.received.push(Received {
                at,
                path: parts.uri.path().to_string(),
                headers: parts.headers,
                body,
                status: a.status,
            });
            a
        };
        self.arrived.notify_waiters();
        if !answer.delay.is_zero() {
            tokio::time::sleep(answer.delay).await;
        }
        let mut resp = http::Response::builder().status(answer.status);
        for (k, v) in &answer.headers {
            resp = resp.header(k, v);
        }
        Ok(resp.body(Full::new(Bytes::from(answer.body))).expect("valid response"))
    }
}

/// Runs each named case of the calling module once per backend, as the tests
/// `sqlite::<case>` and `postgres::<case>`. A case is an `async fn(Backend) ->
/// anyhow::Result<()>`; with `with open =>` in front, an `async fn(T) -> anyhow::Result<()>`
/// given `open(backend).await?` (the store suite opens its store so). Every form expands
/// from the one list of backends in `@each`.
#[macro_export]
macro_rules! backends {
    (with $($open:ident)::+ => $($case:ident),* $(,)?) => {
        $crate::backends!(@each [super::$($open)::+] [$($case)*]);
    };
    ($($case:ident),* $(,)?) => {
        $crate::backends!(@each [] [$($case)*]);
    };
    // The backends, each as (its test module, its `Backend`). A `Backend` missing here fails
    // to compile at every use.
    (@each $open:tt $cases:tt) => {
        $crate::backends!(@list [sqlite Sqlite, postgres Postgres] $open $cases);
    };
    (@list [$($module:ident $variant:ident),*] $open:tt $cases:tt) => {
        const _: fn($crate::Backend) = |backend| match backend {
            $($crate::Backend::$variant)|* => {}
        };
        $($crate::backends!(@module $module $variant $open $cases);)*
    };
    (@module $module:ident $variant:ident $open:tt [$($case:ident)*]) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() -> anyhow::Result<()> {
                    super::$case($crate::backends!(@arg $open $variant)).await
                }
            )*
        }
    };
    // What a case is given: the `Backend`, or what `open` made of it.
    (@arg [] $variant:ident) => {
        $crate::Backend::$variant
    };
    (@arg [$($open:tt)+] $variant:ident) => {
        $($open)+($crate::Backend::$variant).await?
    };
}
