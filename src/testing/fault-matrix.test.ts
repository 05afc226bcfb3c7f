import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";

/*
 * docs/fault-matrix.md is the one place a fault id or an invariant id is defined (what the test
 * does, what must hold). These checks keep the tests and the matrix in step: every id the code
 * or the tests mention is a row of the matrix (or a "Not covered" entry that says why), and every
 * covered row is named by the title of at least one test. And no comment sends the reader to a
 * document the repo does not have (a numbered section, the research notes, a tracker issue).
 */

const ROOT = join(import.meta.dirname, "..", "..");
const MATRIX = readFileSync(join(ROOT, "docs", "fault-matrix.md"), "utf8");
/** A fault or invariant id: a class letter, a number, an optional variant letter (A8b). */
const ID = /\b[ADHIORSUW]\d{1,2}[a-z]?\b/g;

function sources(dir: string): string[] {
  return readdirSync(join(ROOT, dir), { recursive: true, encoding: "utf8" })
    .filter((f) => f.endsWith(".ts"))
    .map((f) => join(dir, f));
}

/** Every `.ts` file of src/ and test/ except this one, by path relative to the repo. */
const FILES = [...sources("src"), ...sources("test")].filter((f) => join(ROOT, f) !== import.meta.filename);

/** The rows of the matrix's tables: id → its cells after the id. `D1+D3` defines both. */
function matrixRows(): Map<string, string[]> {
  const rows = new Map<string, string[]>();
  for (const line of MATRIX.split("\n")) {
    const cells = line.split("|").map((c) => c.trim());
    const first = cells[1] ?? "";
    if (!line.startsWith("|") || !/^[A-Z]\d+[a-z]?(\+[A-Z]\d+[a-z]?)*$/.test(first)) continue;
    for (const id of first.split("+")) rows.set(id, cells.slice(2, -1));
  }
  return rows;
}

/** The ids the "Not covered" section names in bold, each with the reason it gives. */
function notCovered(): Set<string> {
  const section = MATRIX.slice(MATRIX.indexOf("## Not covered"));
  const ids = new Set<string>();
  for (const [, bold] of section.matchAll(/\*\*([^*]+)\*\*/g)) {
    for (const [id] of (bold ?? "").matchAll(ID)) ids.add(id);
  }
  return ids;
}

/** Where each id is mentioned in src/ and test/. */
function mentions(): Map<string, string[]> {
  const found = new Map<string, string[]>();
  for (const file of FILES) {
    for (const [id] of readFileSync(join(ROOT, file), "utf8").matchAll(ID)) {
      found.set(id, [...new Set([...(found.get(id) ?? []), file])]);
    }
  }
  return found;
}

/** The ids named in test and describe titles (string or template literals). */
function titledIds(): Set<string> {
  const ids = new Set<string>();
  const title = /\b(?:it|test|describe)(?:\.\w+)*\(\s*(["'`])((?:\\.|(?!\1)[\s\S])*?)\1/g;
  for (const file of FILES.filter((f) => f.endsWith(".test.ts"))) {
    for (const match of readFileSync(join(ROOT, file), "utf8").matchAll(title)) {
      for (const [id] of (match[2] ?? "").matchAll(ID)) ids.add(id);
    }
  }
  return ids;
}

describe("docs/fault-matrix.md", () => {
  const rows = matrixRows();
  const skipped = notCovered();

  it("defines the invariants I1–I8 and the fault rows, each with what is done and what must hold", () => {
    for (let i = 1; i <= 8; i++) expect(rows.has(`I${i}`), `I${i}`).toBe(true);
    expect(rows.size).toBeGreaterThan(40);
    for (const [id, cells] of rows) {
      expect(cells.length, id).toBeGreaterThanOrEqual(1);
      for (const cell of cells.slice(0, 2)) expect(cell, id).not.toBe("");
    }
  });

  it("defines every fault and invariant id that src/ and test/ mention", () => {
    const undefinedIds = [...mentions()]
      .filter(([id]) => !rows.has(id) && !skipped.has(id))
      .map(([id, files]) => `${id} (${files.join(", ")})`);
    expect(undefinedIds).toEqual([]);
  });

  it("has a test whose title names each fault row it covers", () => {
    const titled = titledIds();
    const untested = [...rows.keys()].filter((id) => !id.startsWith("I") && !titled.has(id));
    expect(untested).toEqual([]);
  });
});

describe("references in src/ and test/", () => {
  it("point into the repo: no § section of an outside document (RFCs aside), no research notes, no issue numbers", () => {
    const outside = /§|restart-anchors|wire notes|\bissue \d+/i;
    const found: string[] = [];
    for (const file of FILES) {
      readFileSync(join(ROOT, file), "utf8")
        .split("\n")
        .forEach((line, i) => {
          if (outside.test(line) && !/\bRFC \d+ §/.test(line)) found.push(`${file}:${i + 1}: ${line.trim()}`);
        });
    }
    expect(found).toEqual([]);
  });
});
