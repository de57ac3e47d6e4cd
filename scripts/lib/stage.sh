# Sourced by scripts/image and scripts/deb: lays out what a Herald installation holds under
# a root directory, as both ship it.
#
#   stage_herald BINARY ROOT
#     ROOT/usr/lib/herald/herald                  the binary, debug info stripped
#     ROOT/usr/lib/herald/herald-js.wasm          the JavaScript plugin runtime, found beside
#     ROOT/usr/lib/herald/herald-js.wasm.*.cwasm  the binary, and its precompiled artifact
#     ROOT/usr/share/herald/plugins/              the example plugins (components and .js)
stage_herald() {
    local binary="$1" root="$2" target="${CARGO_TARGET_DIR:-target}"
    mkdir -p "$root/usr/lib/herald" "$root/usr/share/herald/plugins"
    objcopy --strip-debug "$binary" "$root/usr/lib/herald/herald"

    [ -f "$target/js-runtime/herald-js.wasm" ] || scripts/build-js-runtime >/dev/null
    cp "$target/js-runtime/herald-js.wasm" "$root/usr/lib/herald/"
    # The runtime precompiled for the binary shipped, beside the runtime file, where every
    # herald looks before compiling it (seconds; minutes on a loaded machine) itself: a
    # node maps it at once. The artifact scripts/build-js-runtime --warm left is reused
    # when this binary's wasmtime configuration is the same (its name says the
    # configuration); else `plugin check` compiles it here, and the stale ones are dropped.
    cp "$target/js-runtime/"herald-js.wasm.*.cwasm "$root/usr/lib/herald/" 2>/dev/null || true
    local before
    before="$(find "$root/usr/lib/herald" -name '*.cwasm' | sort)"
    HERALD_PLUGINS_JS_RUNTIME="$root/usr/lib/herald/herald-js.wasm" HERALD_PLUGINS_CALL_TIMEOUT=10s \
        "$root/usr/lib/herald/herald" plugin check sdk-js/examples/transform-chat.js >/dev/null
    if [ -n "$before" ] && [ "$(find "$root/usr/lib/herald" -name '*.cwasm' | sort)" != "$before" ]; then
        # shellcheck disable=SC2086 # one path a line, none with spaces
        rm -f $before
    fi

    local p
    for p in classify_409 sign_hmac_hex transform_chat; do
        [ -f "$target/wasm32-wasip2/release/$p.wasm" ] || scripts/build-plugins "${p//_/-}" >/dev/null
        cp "$target/wasm32-wasip2/release/$p.wasm" "$root/usr/share/herald/plugins/${p//_/-}.wasm"
    done
    cp sdk-js/examples/*.js "$root/usr/share/herald/plugins/"
}
