//! placeholder
pub mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "herald:plugin/plugin",
        additional_derives: [PartialEq, Eq],
    });
}
