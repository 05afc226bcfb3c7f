// The Node.js flags the shim runs with in every launch path: the bundle's shebang (so `npm start`,
// `taskshim` from npm's bin and the tests, which read it back), and the single binary's execArgv
// (so systemd's unit, `taskshim supervise` and a run by hand need no NODE_OPTIONS).
//
// --max-semi-space-size=2: V8 grows the young generation to 16 MB x 3 after a burst of requests
// and keeps it, a third of the shim's memory.
// --expose-gc: lets the shim return its heap's garbage once idle (src/shim/heap-trim.ts).
export const NODE_FLAGS = ["--max-semi-space-size=2", "--expose-gc"];

// The environment the bundle's shebang sets before node starts (the same value as MALLOC_ARENAS in
// src/shim/glibc-malloc.ts; test/supervise.test.ts compares them). MALLOC_ARENA_MAX=1 keeps every
// thread's malloc in glibc's main arena: `serve`'s own cap comes after V8's worker threads have
// taken their arenas, and each arena fragments on its own over task churn (submit -> exit ->
// remove cycles 1,000 -> 3,000, two shims side by side: +2.3 MB of RSS at 2, of which its thread
// arena 0.7 MB, +1.6 MB at 1). The single binary cannot carry an environment: its unit
// (deploy/taskshim.service) and `taskshim supervise` set the same.
export const LAUNCH_ENV = ["MALLOC_ARENA_MAX=1"];
