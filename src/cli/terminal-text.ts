/**
 * What the CLI must never print as it is: C0 controls and DEL (an escape sequence rewrites the
 * operator's terminal), C1 controls (U+0080–U+009F: CSI and OSC on terminals that take 8-bit
 * controls), and the bidirectional overrides, embeddings, isolates and marks (U+202A–U+202E,
 * U+2066–U+2069, U+200E, U+200F, U+061C), which reorder what is shown so that a task name or a
 * message can look like another. A shim's answers carry container output and names that anyone
 * able to submit a task chose.
 */
// eslint-disable-next-line no-control-regex
const UNSAFE = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

/** One character as the JavaScript escape that names it: `\u202e`. */
const escaped = (char: string): string => `\\u${char.charCodeAt(0).toString(16).padStart(4, "0")}`;

/**
 * `text` with every unsafe character (see above) shown literally as its `\uXXXX` escape, newlines
 * included: for what must stay on one line.
 */
export function escapeControls(text: string): string {
  return text.replace(UNSAFE, escaped);
}

/** As {@link escapeControls}, but newlines are kept: for a value shown over several lines. */
export function escapeControlsKeepingLines(text: string): string {
  return text.split("\n").map(escapeControls).join("\n");
}
