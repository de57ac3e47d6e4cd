//! `herald plugin new --lang js NAME`: a directory with a working JavaScript plugin, a
//! unit test of it that runs under node without Herald (`npm test`), an `input.json` for
//! `herald plugin run --input` (shared with the Rust scaffold), and the author kit
//! it uses (the test helper, the evaluation rules Herald applies, the TypeScript
//! definitions), copied from `sdk-js/` at build time so the scaffold matches this Herald.
//! Writes files only; never overwrites a directory that exists.

use std::path::{Path, PathBuf};

use crate::plugin::{PluginError, check_slug};

/// The files of a new JavaScript plugin, relative to its directory. `{name}` in the
/// templates (not in the kit under `herald/`) is replaced by the plugin's name.
const JS_FILES: &[(&str, &str)] = &[
    ("plugin.js", JS_PLUGIN),
    ("plugin.test.mjs", JS_TEST),
    ("input.json", super::INPUT_JSON),
    ("package.json", JS_PACKAGE),
    ("README.md", JS_README),
    ("herald/testing.mjs", include_str!("../../../sdk-js/testing.mjs")),
    ("herald/plugin-host.js", include_str!("../../../sdk-js/plugin-host.js")),
    ("herald/herald.d.ts", include_str!("../../../sdk-js/herald.d.ts")),
    ("herald/types/plugin.d.ts", include_str!("../../../sdk-js/types/plugin.d.ts")),
    (
        "herald/types/interfaces/herald-plugin-types.d.ts",
        include_str!("../../../sdk-js/types/interfaces/herald-plugin-types.d.ts"),
    ),
    (
        "herald/types/interfaces/herald-plugin-host.d.ts",
        include_str!("../../../sdk-js/types/interfaces/herald-plugin-host.d.ts"),
    ),
];

const JS_PLUGIN: &str = r#"/// <reference path="./herald/herald.d.ts" />
// {name}: a Herald transform plugin. It adds the event type to the body's top level and
// a header; see README.md for the other hooks and how to test and upload it.

/** @type {import('./herald/herald').PluginMeta} */
const plugin = { name: '{name}', version: '0.1.0' };

/** @type {import('./herald/herald').Transform} */
function transform(ctx, req) {
  const event = JSON.parse(herald.text(req.body));
  event.event_type = ctx.eventType;
  const headers = [...req.headers, ['x-{name}', herald.config('tag') ?? 'untagged']];
  // A body is a string (sent as UTF-8) or a Uint8Array.
  return { tag: 'send', val: { headers, body: JSON.stringify(event) } };
}
"#;

const JS_TEST: &str = r#"import { test } from 'node:test';
import assert from 'node:assert/strict';
import { load, context, request, json } from './herald/testing.mjs';

const plugin = (config) => load(new URL('./plugin.js', import.meta.url), { config });

test('implements transform', () => {
  assert.deepEqual(plugin().describe().hooks, { transform: true, classify: false, sign: false });
});

test('adds the event type and a header', () => {
  const out = plugin({ tag: 'blue' }).transform(context({ eventType: 'invoice.paid' }), request({ data: { n: 1 } }));
  assert.equal(out.tag, 'send');
  assert.deepEqual(json(out.val.body), { data: { n: 1 }, event_type: 'invoice.paid' });
  assert.deepEqual(out.val.headers.at(-1), ['x-{name}', 'blue']);
});
"#;

const JS_PACKAGE: &str = r#"{
  "name": "{name}",
  "version": "0.1.0",
  "private": true,
  "type": "module",
  "scripts": {
    "test": "node --test"
  }
}
"#;

const JS_README: &str = r#"# {name}

A Herald plugin in JavaScript.

- `plugin.js` is the plugin: define any of `transform`, `classify`, `sign` (types in
  `herald/herald.d.ts`, generated from Herald's WIT).
- `npm test` (or `node --test`) runs `plugin.test.mjs` without Herald.
- `herald plugin check plugin.js` loads it as Herald would; `herald plugin run plugin.js
  --hook transform --input input.json` runs one call within Herald's limits on the
  example delivery in `input.json` (its `context`, the plugin's `config`, the `request`
  Herald would send), and prints the result and the plugin's log lines.
- Upload it (`$HERALD`: the node's address, `$TOKEN`: a token of the tenant with scope
  `manage`): `curl -X PUT --data-binary @plugin.js -H "authorization: Bearer $TOKEN"
  $HERALD/v1/tenants/acme/plugins/{name}`.
"#;

/// Writes a new JavaScript plugin `name` into `parent/name`; returns the files written.
pub fn new_js_plugin(parent: &Path, name: &str) -> Result<Vec<PathBuf>, PluginError> {
    check_slug("plugin name", name)?;
    let dir = parent.join(name);
    if dir.exists() {
        return Err(PluginError::Input(format!("{} exists; choose another name or directory", dir.display())));
    }
    let mut written = Vec::new();
    for (file, template) in JS_FILES {
        let path = dir.join(file);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| PluginError::io(parent, e))?;
        }
        // The kit under herald/ is copied as it is; only the templates name the plugin.
        let text = if file.starts_with("herald/") { template.to_string() } else { template.replace("{name}", name) };
        std::fs::write(&path, text).map_err(|e| PluginError::io(&path, e))?;
        written.push(path);
    }
    Ok(written)
}
