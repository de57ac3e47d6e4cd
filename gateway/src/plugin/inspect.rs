//! Reads a component without compiling it: the structural limits and the world's names,
//! checked for the price of one pass over the bytes, before any compile is paid for.
//!
//! Compiling is superlinear in the size of one function (a 7.6 MB function took 2.5 GB
//! and 20-40 s), and a core module the component never instantiates is compiled all the
//! same; so limits apply to every module, nested or not. The full type check of the
//! world still happens after compiling (`instantiate_pre`); this pass refuses the
//! obvious misfits (a core module, a component of another world) before that.

use wasmparser::{
    ComponentExportSectionReader, ComponentExternalKind, ComponentImportSectionReader, ComponentTypeRef, Encoding,
    Parser, Payload,
};

use super::types::{PluginError, StructureLimits};

/// The functions the `herald:plugin/plugin` world exports.
const WORLD_EXPORTS: [&str; 4] = ["describe", "transform", "classify", "sign"];
/// What a plugin may import: its host interface and WASI (which grants nothing).
const IMPORT_PREFIXES: [&str; 2] = ["herald:plugin/", "wasi:"];

/// Checks `bytes` against `limits` and the world's names, without compiling.
pub(crate) fn inspect(bytes: &[u8], limits: &StructureLimits) -> Result<(), PluginError> {
    let mut depth = 0usize;
    let (mut modules, mut functions) = (0usize, 0usize);
    let mut exports: Vec<String> = Vec::new();
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| PluginError::Invalid(e.to_string()))?;
        match payload {
            Payload::Version { encoding, .. } => {
                if depth == 0 && encoding != Encoding::Component {
                    return Err(PluginError::Invalid("a core module, not a component".into()));
                }
                depth += 1;
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ModuleSection { .. } => {
                modules += 1;
                if modules > limits.max_modules {
                    return Err(structure(format!("more than {} core modules", limits.max_modules)));
                }
            }
            Payload::CodeSectionStart { count, .. } => {
                functions += count as usize;
                if functions > limits.max_functions {
                    return Err(structure(format!("more than {} functions", limits.max_functions)));
                }
            }
            Payload::CodeSectionEntry(body) => {
                let size = body.range().len();
                if size > limits.max_function_bytes {
                    return Err(structure(format!(
                        "a function of {size} bytes (the limit is {})",
                        limits.max_function_bytes
                    )));
                }
            }
            Payload::ComponentImportSection(reader) if depth == 1 => check_imports(reader)?,
            Payload::ComponentExportSection(reader) if depth == 1 => exports.extend(exported_functions(reader)?),
            _ => {}
        }
    }
    if let Some(missing) = WORLD_EXPORTS.iter().find(|f| !exports.iter().any(|e| e == *f)) {
        return Err(PluginError::WrongWorld(format!("no exported function {missing:?}")));
    }
    Ok(())
}

/// Refuses an import of the top-level component that Herald does not provide.
fn check_imports(reader: ComponentImportSectionReader<'_>) -> Result<(), PluginError> {
    for import in reader {
        let import = import.map_err(|e| PluginError::Invalid(e.to_string()))?;
        let name = import.name.name;
        // A world's `use` of interface types becomes a type import: no capability.
        if matches!(import.ty, ComponentTypeRef::Type(_)) {
            continue;
        }
        if !IMPORT_PREFIXES.iter().any(|p| name.starts_with(p)) {
            return Err(PluginError::WrongWorld(format!("imports {name:?}, which Herald does not provide")));
        }
    }
    Ok(())
}

/// The names of the functions the top-level component exports.
fn exported_functions(reader: ComponentExportSectionReader<'_>) -> Result<Vec<String>, PluginError> {
    let mut names = Vec::new();
    for export in reader {
        let export = export.map_err(|e| PluginError::Invalid(e.to_string()))?;
        if export.kind == ComponentExternalKind::Func {
            names.push(export.name.name.to_string());
        }
    }
    Ok(names)
}

fn structure(reason: String) -> PluginError {
    PluginError::Structure(reason)
}
