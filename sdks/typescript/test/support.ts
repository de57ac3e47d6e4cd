// What the tests share.

/** sdks/vectors: `HERALD_SDK_VECTORS`, or beside this package when it is built in place (dist/test/). */
export function vectorsDir(): string {
  return process.env.HERALD_SDK_VECTORS ?? new URL("../../../vectors/", import.meta.url).pathname;
}
