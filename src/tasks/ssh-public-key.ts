import { createHash } from "node:crypto";

/*
 * An OpenSSH public key line (`<type> <base64> [comment]`): parsed and checked by hand,
 * canonicalised into the entry the shim writes, fingerprinted. Pure: no I/O, so the task model
 * can validate submitted keys with it, and the authorized_keys reconciler (authorized-keys.ts)
 * writes what it returns.
 */

/** Appended to the comment of every entry the shim writes; only such entries are ever removed. */
export const PUBLIC_KEY_MARKER = "# added by dstack-shim";

/** A public key the shim refuses to write. */
export class InvalidPublicKeyError extends Error {
  override readonly name = "InvalidPublicKeyError";
}

const MARKER_SUFFIX = ` ${PUBLIC_KEY_MARKER}`;
const MARKER_WORDS = PUBLIC_KEY_MARKER.split(" ");
const MAX_KEY_LINE = 16 * 1024;
/** Plain key types only: certificates belong behind `cert-authority`, which is an option. */
const KEY_TYPES: ReadonlySet<string> = new Set([
  "ssh-ed25519",
  "ssh-rsa",
  "ssh-dss",
  "ecdsa-sha2-nistp256",
  "ecdsa-sha2-nistp384",
  "ecdsa-sha2-nistp521",
  "sk-ssh-ed25519@openssh.com",
  "sk-ecdsa-sha2-nistp256@openssh.com",
]);
const ECDSA_POINT_BYTES: Readonly<Record<string, number>> = { nistp256: 65, nistp384: 97, nistp521: 133 };

interface ParsedKey {
  readonly type: string;
  readonly base64: string;
  readonly blob: Buffer;
  readonly comment: readonly string[];
}

function invalid(message: string): never {
  throw new InvalidPublicKeyError(message);
}

/** The length-prefixed strings of an SSH wire blob, or undefined when it is not exactly that. */
function wireStrings(blob: Buffer): Buffer[] | undefined {
  const parts: Buffer[] = [];
  let offset = 0;
  while (offset < blob.length) {
    if (offset + 4 > blob.length) return undefined;
    const length = blob.readUInt32BE(offset);
    if (offset + 4 + length > blob.length) return undefined;
    parts.push(blob.subarray(offset + 4, offset + 4 + length));
    offset += 4 + length;
  }
  return parts;
}

function checkKeyBlob(type: string, blob: Buffer): void {
  const parts = wireStrings(blob);
  if (parts === undefined || parts[0]?.toString("latin1") !== type) {
    invalid(`public key data does not match its type ${type}`);
  }
  const sizes = parts.map((part) => part.length);
  const curveOk = (curve: Buffer | undefined, point: Buffer | undefined) =>
    curve !== undefined &&
    type.includes(curve.toString("latin1")) &&
    point?.length === ECDSA_POINT_BYTES[curve.toString("latin1")] &&
    point?.[0] === 0x04;
  const ok = ((): boolean => {
    switch (type) {
      case "ssh-ed25519":
        return parts.length === 2 && sizes[1] === 32;
      case "sk-ssh-ed25519@openssh.com":
        return parts.length === 3 && sizes[1] === 32 && (sizes[2] ?? 0) > 0;
      case "ssh-rsa":
        return parts.length === 3 && (sizes[1] ?? 0) > 0 && (sizes[2] ?? 0) > 0;
      case "ssh-dss":
        return parts.length === 5 && sizes.every((size) => size > 0);
      case "sk-ecdsa-sha2-nistp256@openssh.com":
        return parts.length === 4 && curveOk(parts[1], parts[2]) && (sizes[3] ?? 0) > 0;
      default:
        return parts.length === 3 && curveOk(parts[1], parts[2]);
    }
  })();
  if (!ok) invalid(`malformed ${type} public key`);
}

function parsePublicKey(key: string): ParsedKey {
  if (key.length > MAX_KEY_LINE) invalid("public key is too long");
  const line = key.trim();
  if (/[\r\n]/.test(line) || line.includes("\0")) invalid("more than one key in a single entry");
  if (line === "") invalid("empty public key");
  const fields = line.split(/[ \t]+/);
  const [type = "", base64, ...comment] = fields;
  if (!KEY_TYPES.has(type)) {
    // Stryker disable next-line MethodExpression: fields[0] is the type, known not to be a key type here
    if (fields.slice(1).some((word) => KEY_TYPES.has(word))) invalid("unexpected authorized_keys options");
    invalid(`unsupported public key type ${JSON.stringify(type.slice(0, 64))}`);
  }
  if (base64 === undefined) invalid("public key data is missing");
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(base64) || base64.length % 4 !== 0)
    invalid("public key data is not base64");
  const blob = Buffer.from(base64, "base64");
  if (blob.toString("base64") !== base64) invalid("public key data is not canonical base64");
  checkKeyBlob(type, blob);
  // Strip a marker already present, so canonicalising a canonical entry changes nothing.
  let words = comment;
  while (
    // Stryker disable next-line ConditionalExpression: fewer words than the marker's never join into it
    words.length >= MARKER_WORDS.length &&
    words.slice(-MARKER_WORDS.length).join(" ") === PUBLIC_KEY_MARKER
  ) {
    words = words.slice(0, -MARKER_WORDS.length);
  }
  return { type, base64, blob, comment: words };
}

/**
 * Parses one OpenSSH public key line (`<type> <base64> [comment]`) and returns the entry the shim
 * writes: `"<type> <base64> <comment words…> # added by dstack-shim"`. Parsed by hand: the type
 * must be a known plain key type, the base64 must decode to a blob whose first string is that
 * type and whose fields fit it. Idempotent.
 *
 * @throws InvalidPublicKeyError for options (`unexpected authorized_keys options`), a second line
 *   or a NUL (`more than one key in a single entry`), or anything malformed.
 */
export function canonicalizePublicKey(key: string): string {
  const parsed = parsePublicKey(key);
  return [parsed.type, parsed.base64, ...parsed.comment, PUBLIC_KEY_MARKER].join(" ");
}

/**
 * The SHA256 fingerprint of a public key as `ssh-keygen -l` prints it: `SHA256:` and the
 * unpadded base64 of the digest of the key blob. Comments and the marker do not matter.
 *
 * @throws InvalidPublicKeyError as {@link canonicalizePublicKey} does.
 */
export function publicKeyFingerprint(key: string): string {
  const digest = createHash("sha256").update(parsePublicKey(key).blob).digest("base64");
  // Stryker disable next-line Regex: a SHA-256 digest in base64 always ends in exactly one "="
  return `SHA256:${digest.replace(/=+$/, "")}`;
}

/** Whether an `authorized_keys` line was written by a shim (its right-trimmed text ends with the marker). */
export function isShimEntry(line: string): boolean {
  return line.replace(/[ \t\r]+$/, "").endsWith(MARKER_SUFFIX);
}
