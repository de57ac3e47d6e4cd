//! Build-time facts the binary carries: the migrations folder's contents and the source's
//! git revision (`herald --version`).

use std::path::Path;
use std::process::Command;

fn main() {
    // `sqlx::migrate!` embeds the migration folders at compile time, but cargo does not see
    // a file added to them: without this, an incremental build keeps the old set.
    println!("cargo:rerun-if-changed=migrations");
    let rev = revision();
    // Twelve hex digits name a commit unambiguously in practice, and read better.
    let short = if rev.len() > 12 && rev.chars().all(|c| c.is_ascii_hexdigit()) { &rev[..12] } else { &rev };
    println!("cargo:rustc-env=HERALD_REVISION={short}");
}

/// The commit the source is at, in this order: `HERALD_REVISION` (a packager's say), the
/// git checkout's `HEAD`, the `REVISION` file that `git archive` fills in (a tarball
/// without `.git`, via `export-subst` in `.gitattributes`), else "unknown".
fn revision() -> String {
    println!("cargo:rerun-if-env-changed=HERALD_REVISION");
    if let Ok(given) = std::env::var("HERALD_REVISION")
        && !given.trim().is_empty()
    {
        return given.trim().to_string();
    }
    if let Some(rev) = git_head() {
        return rev;
    }
    println!("cargo:rerun-if-changed=REVISION");
    match std::fs::read_to_string("REVISION") {
        // Unfilled (`$Format:%H$`) outside an archive.
        Ok(text) if !text.trim().is_empty() && !text.contains('$') => text.trim().to_string(),
        _ => "unknown".into(),
    }
}

/// `git rev-parse HEAD`, and, for an optimised build, the files whose change moves it (HEAD,
/// the branch's ref, packed refs) so cargo runs this again after a commit or a checkout. A dev
/// build keeps the revision of the build script's last run: watching the refs there would
/// recompile the whole `gateway` crate after every commit, for a line of `--version`.
fn git_head() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let rev = git(&["rev-parse", "HEAD"])?;
    if std::env::var("PROFILE").as_deref() == Ok("debug") {
        return Some(rev);
    }
    let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"])?];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.extend(git(&["rev-parse", "--git-path", &branch]));
    }
    watched.extend(git(&["rev-parse", "--git-path", "packed-refs"]));
    for path in watched {
        if Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    Some(rev)
}
