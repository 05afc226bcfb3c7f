// The Node.js flags the shim runs with in every launch path: the bundle's shebang (so `npm start`,
// `taskshim` from npm's bin and the tests, which read it back), and the single binary's execArgv
// (so systemd's unit, `taskshim supervise` and a run by hand need no NODE_OPTIONS).
//
// --max-semi-space-size=2: V8 grows the young generation to 16 MB x 3 after a burst of requests
// and keeps it, a third of the shim's memory.
// --expose-gc: lets the shim return its heap's garbage once idle (src/cli/heap-trim.ts).
export const NODE_FLAGS = ["--max-semi-space-size=2", "--expose-gc"];
