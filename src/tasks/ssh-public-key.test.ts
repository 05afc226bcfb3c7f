import { describe, expect, it } from "vitest";
import {
  canonicalizePublicKey,
  InvalidPublicKeyError,
  isShimEntry,
  PUBLIC_KEY_MARKER,
  publicKeyFingerprint,
} from "./ssh-public-key.js";

// Real keys made with ssh-keygen; the fingerprints are what `ssh-keygen -lf` printed.
const ALICE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIM3w4GVANxwykR9noGY7PCFNXEBbweA+ReD2IuJzgeUW alice@laptop";
const BOB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAII1MS7iRqDbzkLOAf8AtxRMav662TwVJ6YS9npFc/qVR bob";
const CAROL =
  "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBICmPe7vpeT0DQdCfHGV2FrDU7HJkZOuVtDyilCgwf3tF88QflKvDddmTs+Yi9LjvALdJBoCNPPULWSXxuEWjAg= carol";
const DAVE =
  "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDPznDhrKoAnuml22Qp0j5M98boPUghuqE1cNgb+14Gvg6ciy1krSsLzLht0gNkmdlV4Ejs0xnsP5FcCD3TXbjTeGlAmwmaDeu1JqwLMpAXburSaZUZZ9WG5W1uv9KgXzv1qNKw6oj80FvBNHK59Fmjs8l+y5NZV3USGnHpGOCnmw== dave";
const [ALICE_TYPE = "", ALICE_B64 = ""] = ALICE.split(" ");

describe("canonicalizePublicKey", () => {
  it("appends the marker to the comment words", () => {
    expect(canonicalizePublicKey(ALICE)).toBe(`${ALICE} ${PUBLIC_KEY_MARKER}`);
    expect(canonicalizePublicKey(`  ${ALICE_TYPE}\t${ALICE_B64}   my \t key \n`)).toBe(
      `${ALICE_TYPE} ${ALICE_B64} my key ${PUBLIC_KEY_MARKER}`,
    );
    expect(canonicalizePublicKey(`${ALICE_TYPE} ${ALICE_B64}`)).toBe(
      `${ALICE_TYPE} ${ALICE_B64} ${PUBLIC_KEY_MARKER}`,
    );
  });

  it("accepts ed25519, ecdsa and rsa keys and is idempotent", () => {
    for (const key of [ALICE, BOB, CAROL, DAVE]) {
      const canonical = canonicalizePublicKey(key);
      expect(canonicalizePublicKey(canonical)).toBe(canonical);
      expect(isShimEntry(canonical)).toBe(true);
    }
  });

  it.each([
    ["no-pty", `no-pty ${ALICE}`],
    ["a command", `command="echo hi there" ${ALICE}`],
    ["restrict,from", `restrict,from="10.0.0.1" ${ALICE}`],
  ])("rejects options (%s)", (_label, key) => {
    expect(() => canonicalizePublicKey(key)).toThrow(
      new InvalidPublicKeyError("unexpected authorized_keys options"),
    );
  });

  it.each([
    ["two lines", `${ALICE}\n${BOB}`],
    ["a carriage return", `${ALICE}\r${BOB}`],
    ["an option smuggled on a second line", `${ALICE}\ncommand="sh" ${BOB}`],
    ["a NUL", `${ALICE}\u0000${BOB}`],
  ])("rejects more than one key: %s", (_label, key) => {
    expect(() => canonicalizePublicKey(key)).toThrow(
      new InvalidPublicKeyError("more than one key in a single entry"),
    );
  });

  it.each([
    ["empty", ""],
    ["blank", " \n"],
    ["an unknown type", `ssh-foo ${ALICE_B64}`],
    ["a certificate type", `ssh-ed25519-cert-v01@openssh.com ${ALICE_B64}`],
    ["no key data", ALICE_TYPE],
    ["bad base64", `${ALICE_TYPE} AAAA!!!!`],
    ["non-canonical base64", CAROL.replace("Ag= carol", "Ah=")],
    ["a mismatched type", `ssh-rsa ${ALICE_B64}`],
    [
      "a truncated blob",
      `${ALICE_TYPE} ${Buffer.from(ALICE_B64, "base64").subarray(0, 40).toString("base64")}`,
    ],
    [
      "trailing bytes",
      `${ALICE_TYPE} ${Buffer.concat([Buffer.from(ALICE_B64, "base64"), Buffer.alloc(4)]).toString("base64")}`,
    ],
    ["a huge line", `${ALICE} ${"x".repeat(20_000)}`],
  ])("rejects %s", (_label, key) => {
    expect(() => canonicalizePublicKey(key)).toThrow(InvalidPublicKeyError);
  });
});

describe("publicKeyFingerprint", () => {
  it("matches ssh-keygen", () => {
    expect(publicKeyFingerprint(ALICE)).toBe("SHA256:6fan6SpdS7z4Bn77ulGPIy2yd+Ks8E7pfhNdRQR8z6Y");
    expect(publicKeyFingerprint(BOB)).toBe("SHA256:ooRMgzFkrF3MgA1hn2UjiAtK3vInFHjty8UqaiwCPV0");
    expect(publicKeyFingerprint(CAROL)).toBe("SHA256:n81bqt4rhdDWiILVkaROBDt2Nk66tCCdEunv2oWgK4A");
    expect(publicKeyFingerprint(DAVE)).toBe("SHA256:9agC2lnXsDnlbm7QqGROzoEXaCJLvI0AfbLgTq4yYHk");
  });

  it("ignores the comment and the marker", () => {
    expect(publicKeyFingerprint(`${ALICE_TYPE} ${ALICE_B64} other`)).toBe(publicKeyFingerprint(ALICE));
    expect(publicKeyFingerprint(canonicalizePublicKey(ALICE))).toBe(publicKeyFingerprint(ALICE));
  });
});

describe("isShimEntry", () => {
  it("matches the exact marker suffix only", () => {
    expect(isShimEntry(`${ALICE} ${PUBLIC_KEY_MARKER} \t\r`)).toBe(true);
    expect(isShimEntry(`${ALICE} # added by dstack`)).toBe(false);
    expect(isShimEntry(`${ALICE} # added by dstack-shim2`)).toBe(false);
    expect(isShimEntry(`${ALICE} x# added by dstack-shim`)).toBe(false);
  });
});

/** An SSH wire blob: each part as a uint32 big-endian length and its bytes. */
const wire = (...parts: (string | Buffer)[]): Buffer =>
  Buffer.concat(
    parts.flatMap((part) => {
      const bytes = typeof part === "string" ? Buffer.from(part, "latin1") : part;
      const length = Buffer.alloc(4);
      length.writeUInt32BE(bytes.length);
      return [length, bytes];
    }),
  );
const line = (type: string, blob: Buffer): string => `${type} ${blob.toString("base64")}`;
const bytes = (n: number, first = 1): Buffer => Buffer.alloc(n, first);
const point = (n: number): Buffer => Buffer.concat([Buffer.of(0x04), bytes(n - 1)]);
const rejects = (key: string, message: string): void => {
  let thrown: unknown;
  try {
    canonicalizePublicKey(key);
  } catch (error) {
    thrown = error;
  }
  expect(thrown).toBeInstanceOf(InvalidPublicKeyError);
  expect((thrown as Error).name).toBe("InvalidPublicKeyError");
  expect((thrown as Error).message).toBe(message);
};

describe("canonicalizePublicKey: every plain key type, checked field by field", () => {
  const valid: [string, Buffer][] = [
    ["ssh-dss", wire("ssh-dss", bytes(129), bytes(21), bytes(128), bytes(128))],
    ["ecdsa-sha2-nistp384", wire("ecdsa-sha2-nistp384", "nistp384", point(97))],
    ["ecdsa-sha2-nistp521", wire("ecdsa-sha2-nistp521", "nistp521", point(133))],
    ["sk-ssh-ed25519@openssh.com", wire("sk-ssh-ed25519@openssh.com", bytes(32), "ssh:")],
    [
      "sk-ecdsa-sha2-nistp256@openssh.com",
      wire("sk-ecdsa-sha2-nistp256@openssh.com", "nistp256", point(65), "ssh:"),
    ],
  ];
  it.each(valid)("accepts a well-formed %s key", (type, blob) => {
    expect(canonicalizePublicKey(`${line(type, blob)} c`)).toBe(`${line(type, blob)} c ${PUBLIC_KEY_MARKER}`);
  });

  it.each([
    ["ssh-ed25519 with a 31-byte key", line("ssh-ed25519", wire("ssh-ed25519", bytes(31)))],
    ["ssh-ed25519 with an extra field", line("ssh-ed25519", wire("ssh-ed25519", bytes(32), "x"))],
    [
      "sk-ssh-ed25519 with a 33-byte key",
      line("sk-ssh-ed25519@openssh.com", wire("sk-ssh-ed25519@openssh.com", bytes(33), "ssh:")),
    ],
    [
      "sk-ssh-ed25519 with no application",
      line("sk-ssh-ed25519@openssh.com", wire("sk-ssh-ed25519@openssh.com", bytes(32), "")),
    ],
    [
      "sk-ssh-ed25519 without its application",
      line("sk-ssh-ed25519@openssh.com", wire("sk-ssh-ed25519@openssh.com", bytes(32))),
    ],
    ["ssh-rsa with an empty exponent", line("ssh-rsa", wire("ssh-rsa", "", bytes(128)))],
    ["ssh-rsa with an empty modulus", line("ssh-rsa", wire("ssh-rsa", bytes(3), ""))],
    ["ssh-rsa without a modulus", line("ssh-rsa", wire("ssh-rsa", bytes(3)))],
    ["ssh-dss with an empty field", line("ssh-dss", wire("ssh-dss", bytes(129), bytes(21), "", bytes(128)))],
    ["ssh-dss with a field missing", line("ssh-dss", wire("ssh-dss", bytes(129), bytes(21), bytes(128)))],
    [
      "ecdsa with another curve's name",
      line("ecdsa-sha2-nistp256", wire("ecdsa-sha2-nistp256", "nistp384", point(97))),
    ],
    [
      "ecdsa with a point of the wrong size",
      line("ecdsa-sha2-nistp384", wire("ecdsa-sha2-nistp384", "nistp384", point(65))),
    ],
    [
      "ecdsa with a compressed point",
      line(
        "ecdsa-sha2-nistp256",
        wire("ecdsa-sha2-nistp256", "nistp256", Buffer.concat([Buffer.of(0x02), bytes(64)])),
      ),
    ],
    ["ecdsa without a point", line("ecdsa-sha2-nistp256", wire("ecdsa-sha2-nistp256", "nistp256"))],
    [
      "ecdsa with an extra field",
      line("ecdsa-sha2-nistp256", wire("ecdsa-sha2-nistp256", "nistp256", point(65), "x")),
    ],
    [
      "sk-ecdsa with a bad point",
      line(
        "sk-ecdsa-sha2-nistp256@openssh.com",
        wire("sk-ecdsa-sha2-nistp256@openssh.com", "nistp256", point(64), "ssh:"),
      ),
    ],
    [
      "sk-ecdsa with no application",
      line(
        "sk-ecdsa-sha2-nistp256@openssh.com",
        wire("sk-ecdsa-sha2-nistp256@openssh.com", "nistp256", point(65), ""),
      ),
    ],
    [
      "sk-ecdsa without its application",
      line(
        "sk-ecdsa-sha2-nistp256@openssh.com",
        wire("sk-ecdsa-sha2-nistp256@openssh.com", "nistp256", point(65)),
      ),
    ],
  ])("rejects %s as malformed", (_label, key) => {
    rejects(key, `malformed ${key.split(" ")[0] ?? ""} public key`);
  });

  it("says which check failed, word for word", () => {
    rejects("", "empty public key");
    rejects(" \n", "empty public key");
    rejects("x".repeat(16 * 1024 + 1), "public key is too long");
    rejects(ALICE_TYPE, "public key data is missing");
    rejects(`ssh-foo ${ALICE_B64}`, 'unsupported public key type "ssh-foo"');
    rejects(`${"t".repeat(100)} ${ALICE_B64}`, `unsupported public key type "${"t".repeat(64)}"`);
    rejects(`${ALICE_TYPE} AAAA!!!!`, "public key data is not base64");
    rejects(`${ALICE_TYPE} !!!!AAAA`, "public key data is not base64");
    rejects(`${ALICE_TYPE} AAAAA`, "public key data is not base64");
    rejects(
      `${ALICE_TYPE} AAAAAAA=`.replace("AAAAAAA=", "AAAAAAB="),
      "public key data is not canonical base64",
    );
    rejects(`ssh-rsa ${ALICE_B64}`, "public key data does not match its type ssh-rsa");
    // A length prefix that claims more bytes than follow, and a length prefix cut short.
    rejects(
      line(ALICE_TYPE, Buffer.from(ALICE_B64, "base64").subarray(0, 40)),
      `public key data does not match its type ${ALICE_TYPE}`,
    );
    rejects(
      line(ALICE_TYPE, Buffer.concat([Buffer.from(ALICE_B64, "base64"), Buffer.alloc(2)])),
      `public key data does not match its type ${ALICE_TYPE}`,
    );
    // A zero-length last string is a well-formed blob with a field too many.
    rejects(
      line(ALICE_TYPE, Buffer.concat([Buffer.from(ALICE_B64, "base64"), Buffer.alloc(4)])),
      `malformed ${ALICE_TYPE} public key`,
    );
  });

  it("strips only a trailing marker, however many words the comment has", () => {
    const bare = `${ALICE_TYPE} ${ALICE_B64}`;
    expect(canonicalizePublicKey(`${bare} ${PUBLIC_KEY_MARKER}`)).toBe(`${bare} ${PUBLIC_KEY_MARKER}`);
    expect(canonicalizePublicKey(`${bare} ${PUBLIC_KEY_MARKER} ${PUBLIC_KEY_MARKER}`)).toBe(
      `${bare} ${PUBLIC_KEY_MARKER}`,
    );
    expect(canonicalizePublicKey(`${bare} my four word key`)).toBe(
      `${bare} my four word key ${PUBLIC_KEY_MARKER}`,
    );
    expect(canonicalizePublicKey(`${bare} a b c d e`)).toBe(`${bare} a b c d e ${PUBLIC_KEY_MARKER}`);
  });
});
