// `sqlx::migrate!` embeds the migration folders at compile time, but cargo does not see a
// file added to them: without this, an incremental build keeps the old set of migrations.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
