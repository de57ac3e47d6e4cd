//! `herald plugin new --lang rust NAME`: a plugin project that builds, with a unit test
//! that runs its hook through `plugin_sdk::testing`. Writes files only; never overwrites.

mod js;

use std::path::{Path, PathBuf};

pub use js::new_js_plugin;

/// The languages `plugin new` scaffolds (`js`: [`new_js_plugin`]).
pub const LANGS: [&str; 2] = ["rust", "js"];

/// `input.json` of every scaffold: an example delivery for `herald plugin run --hook
/// transform --input input.json` (the hook both scaffolds implement), with the context,
/// the `tag` setting they read and the envelope Herald sends by default.
pub const INPUT_JSON: &str = include_str!("scaffold/input.json.tmpl");

/// Why a project could not be created.
#[derive(Debug, thiserror::Error)]
pub enum ScaffoldError {
    #[error("plugin name {0:?}: expected 1-64 characters of [a-z0-9_-], starting with a letter")]
    Name(String),
    #[error("unknown language {0:?}; one of: rust")]
    Lang(String),
    #[error("{0} exists; choose another name or directory")]
    Exists(PathBuf),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// Where `plugin-sdk` is when none is named: beside the crate this binary was built from.
pub fn default_sdk() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugin-sdk")
}

/// Creates `<dir>/<name>/` (`Cargo.toml`, `src/lib.rs`, `input.json`) depending on the
/// SDK at `sdk`; returns the project's directory.
pub fn new_plugin(lang: &str, name: &str, dir: &Path, sdk: &Path) -> Result<PathBuf, ScaffoldError> {
    if lang != "rust" {
        return Err(ScaffoldError::Lang(lang.to_string()));
    }
    let valid = crate::plugin::is_slug(name) && name.starts_with(|c: char| c.is_ascii_lowercase());
    if !valid {
        return Err(ScaffoldError::Name(name.to_string()));
    }
    let root = dir.join(name);
    if root.exists() {
        return Err(ScaffoldError::Exists(root));
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ScaffoldError::Io { path, source }
    };
    let sdk = std::fs::canonicalize(sdk).map_err(io(sdk))?;
    let fill = |template: &str| {
        template
            .replace("{{name}}", name)
            .replace("{{crate}}", &name.replace('-', "_"))
            .replace("{{type}}", &type_name(name))
            .replace("{{sdk}}", &sdk.display().to_string())
    };
    std::fs::create_dir_all(root.join("src")).map_err(io(&root))?;
    let files = [
        ("Cargo.toml", include_str!("scaffold/Cargo.toml.tmpl")),
        ("src/lib.rs", include_str!("scaffold/lib.rs.tmpl")),
        ("input.json", INPUT_JSON),
    ];
    for (file, template) in files {
        let path = root.join(file);
        std::fs::write(&path, fill(template)).map_err(io(&path))?;
    }
    Ok(root)
}

/// `my-plugin` → `MyPlugin`.
fn type_name(name: &str) -> String {
    name.split(['-', '_']).filter(|w| !w.is_empty()).map(|w| w[..1].to_uppercase() + &w[1..]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_refusals() {
        assert_eq!(type_name("add-tag_2"), "AddTag2");
        let dir = tempfile::tempdir().unwrap();
        let sdk = default_sdk();
        assert!(matches!(new_plugin("go", "x", dir.path(), &sdk), Err(ScaffoldError::Lang(_))));
        assert!(matches!(new_plugin("rust", "9x", dir.path(), &sdk), Err(ScaffoldError::Name(_))));
        let root = new_plugin("rust", "add-tag", dir.path(), &sdk).unwrap();
        let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
        assert!(lib.contains("struct AddTag;") && !lib.contains("{{"), "{lib}");
        let input: serde_json::Value =
            serde_json::from_slice(&std::fs::read(root.join("input.json")).unwrap()).unwrap();
        assert_eq!(input["config"]["tag"], "blue", "an example for `plugin run --input input.json`: {input}");
        assert!(matches!(new_plugin("rust", "add-tag", dir.path(), &sdk), Err(ScaffoldError::Exists(_))));
    }
}
