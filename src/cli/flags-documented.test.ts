import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Command } from "commander";
import { describe, expect, it } from "vitest";
import { buildCli } from "./main.js";

/*
 * Every flag of every command, as the CLI's own help lists it (hidden test knobs aside), is documented: named in README.md
 * or docs/operations.md. A flag added without a line there fails here.
 */
const ROOT = join(import.meta.dirname, "..", "..");
const DOCS = ["README.md", "docs/operations.md"].map((f) => readFileSync(join(ROOT, f), "utf8")).join("\n");

function commands(command: Command, path: string[] = []): { path: string; flags: string[] }[] {
  const here = {
    path: ["taskshim", ...path].join(" "),
    // A hidden option (a test knob) is not a user's: it is not in the help either.
    flags: command.options
      .filter((o) => !o.hidden)
      .map((o) => o.long)
      .filter((f): f is string => f !== undefined && f !== "--version"),
  };
  return [here, ...command.commands.flatMap((c) => commands(c, [...path, c.name()]))];
}

describe("the CLI's flags", () => {
  const all = commands(buildCli() as unknown as Command);

  it("walks every command group (serve, supervise, upgrade, fence, status, tasks …)", () => {
    const paths = all.map((c) => c.path);
    for (const expected of [
      "taskshim serve",
      "taskshim supervise",
      "taskshim upgrade",
      "taskshim fence",
      "taskshim tasks ls",
    ])
      expect(paths).toContain(expected);
    expect(all.reduce((n, c) => n + c.flags.length, 0)).toBeGreaterThan(40);
  });

  it.each(all.filter((c) => c.flags.length > 0))(
    "$path: every flag is in README.md or docs/operations.md",
    ({ flags }) => {
      const missing = flags.filter((flag) => !new RegExp(`${flag}(?![\\w-])`).test(DOCS));
      expect(missing).toEqual([]);
    },
  );
});
