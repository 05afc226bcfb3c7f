import { closeSync, openSync, readSync } from "node:fs";

/** How to start a shim binary: the program to spawn and the arguments that go before its own. */
export interface SelfInvocation {
  readonly file: string;
  readonly args: readonly string[];
}

/** The most of a script's first line read for its shebang. */
const SHEBANG_BYTES = 512;

/**
 * How to start the shim binary at `binary` without a `PATH` lookup. The single binary (or any
 * other executable that is not a script) is spawned itself. The bundle is a script whose shebang
 * runs `env … node`, so spawning it would run whatever `node` comes first on `PATH` (often the
 * system's, which is too old and refuses with exit 78): it is run by this process's own Node.js,
 * `process.execPath`, with the Node flags its shebang names. A script of another interpreter
 * (`#!/bin/sh` …) is spawned itself: its interpreter is a path, not a lookup of node.
 */
export function selfInvocation(binary: string): SelfInvocation {
  let head: string;
  try {
    head = readFirstLine(binary);
  } catch {
    // Unreadable: spawned as given, so that its own error (ENOENT, EACCES) is what is reported.
    return { file: binary, args: [] };
  }
  const flags = nodeFlagsOfShebang(head);
  return flags === undefined
    ? { file: binary, args: [] }
    : { file: process.execPath, args: [...flags, binary] };
}

/**
 * The Node flags a `#!` line passes to `node` (`#!/usr/bin/env -S VAR=1 node --flag` →
 * `["--flag"]`), or undefined when the line is not a shebang that runs node.
 */
export function nodeFlagsOfShebang(line: string): string[] | undefined {
  if (!line.startsWith("#!")) return undefined;
  const words = line.slice(2).trim().split(/\s+/);
  const node = words.findIndex((word) => /(^|\/)node$/.test(word));
  return node === -1 ? undefined : words.slice(node + 1);
}

/** The first line of a file (at most {@link SHEBANG_BYTES} bytes of it). */
function readFirstLine(path: string): string {
  const fd = openSync(path, "r");
  try {
    const buffer = Buffer.alloc(SHEBANG_BYTES);
    const read = readSync(fd, buffer, 0, SHEBANG_BYTES, 0);
    return buffer.subarray(0, read).toString("latin1").split("\n")[0] ?? "";
  } finally {
    closeSync(fd);
  }
}
