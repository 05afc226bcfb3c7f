import { describe, expect, it } from "vitest";
import { cell, formatFields, formatTable } from "./table.js";

describe("formatTable", () => {
  it("aligns columns with two spaces and no trailing blanks", () => {
    const table = formatTable(
      ["ID", "STATUS", "REASON"],
      [
        ["a", "running", "-"],
        ["long-id-1", "terminated", "done_by_runner"],
      ],
    );
    expect(table.split("\n")).toEqual([
      "ID         STATUS      REASON",
      "a          running     -",
      "long-id-1  terminated  done_by_runner",
    ]);
  });

  it("prints only the header for no rows, and pads short rows", () => {
    expect(formatTable(["A", "B"], [])).toBe("A  B");
    expect(formatTable(["A", "B"], [["x"]])).toBe("A  B\nx");
  });
});

describe("cell", () => {
  it("shows - for empty values and keeps only the first line", () => {
    expect(cell("")).toBe("-");
    expect(cell(null)).toBe("-");
    expect(cell(undefined)).toBe("-");
    expect(cell(3)).toBe("3");
    expect(cell("first\nsecond")).toBe("first");
  });

  it("shows control characters as escapes, so container output cannot drive the terminal", () => {
    expect(cell("a\u001b[31mred\u0007")).toBe("a\\u001b[31mred\\u0007");
    expect(cell("\u001b")).toBe("\\u001b");
  });

  it("shortens long values with an ellipsis", () => {
    expect(cell("x".repeat(100), 10)).toBe(`${"x".repeat(9)}…`);
  });
});

describe("formatFields", () => {
  it("aligns keys and continues multi-line values under the first line", () => {
    expect(
      formatFields([
        ["id", "t1"],
        ["message", "line one\nline two"],
        ["reason", ""],
      ]),
    ).toBe(["id:       t1", "message:  line one", "          line two", "reason:   -"].join("\n"));
  });
});
