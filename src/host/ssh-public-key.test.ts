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
