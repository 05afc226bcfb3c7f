import { escapeControls } from "./terminal-text.js";

/**
 * One table cell: the first line only, control and bidi characters shown as `\uXXXX` (a
 * termination message may hold container output, and an escape sequence must not reach the
 * operator's terminal; see `terminal-text.ts`).
 */
export function cell(value: string | number | null | undefined, max = 80): string {
  if (value === null || value === undefined || value === "") return "-";
  const firstLine = String(value).split("\n")[0] ?? "";
  const clean = escapeControls(firstLine).trimEnd();
  if (clean === "") return "-";
  return clean.length > max ? `${clean.slice(0, max - 1)}…` : clean;
}

/**
 * An aligned plain-text table: a header row and one row per item, columns separated by two
 * spaces, no trailing blanks. Cells are used as given; pass them through {@link cell}.
 */
export function formatTable(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => (row[i] ?? "").length)));
  const line = (cells: readonly string[]): string =>
    header
      .map((_, i) => (cells[i] ?? "").padEnd(widths[i] ?? 0))
      .join("  ")
      .trimEnd();
  return [line(header), ...rows.map(line)].join("\n");
}

/**
 * A two-column `key: value` listing; a multi-line value continues under its first line.
 * Control and bidi characters other than newlines are shown as `\uXXXX` in values.
 */
export function formatFields(fields: readonly (readonly [string, string])[]): string {
  const width = Math.max(...fields.map(([key]) => key.length + 1));
  return fields
    .map(([key, value]) => {
      const lines = (value === "" ? "-" : value).split("\n").map((l) => escapeControls(l).trimEnd());
      const label = `${key}:`.padEnd(width);
      return [
        `${label}  ${lines[0] ?? ""}`.trimEnd(),
        ...lines.slice(1).map((l) => `${" ".repeat(width)}  ${l}`.trimEnd()),
      ].join("\n");
    })
    .join("\n");
}
