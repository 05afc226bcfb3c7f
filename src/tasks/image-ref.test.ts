import { describe, expect, it } from "vitest";
import {
  formatPullReference,
  InvalidImageReferenceError,
  isLatestOrUntagged,
  parseImageReference,
  registryServerAddress,
} from "./image-ref.js";
import type { ImageReference } from "./image-ref.js";

const SHA256 = "sha256:" + "0123456789abcdef".repeat(4);
const SHA512 = "sha512:" + "0123456789abcdef".repeat(8);
const HUB = "https://index.docker.io/v1/";

interface ValidCase {
  input: string;
  parsed: ImageReference;
  pull: string;
  server: string;
  latestOrUntagged: boolean;
}

const valid: ValidCase[] = [
  {
    input: "ubuntu",
    parsed: { domain: "docker.io", path: "library/ubuntu" },
    pull: "ubuntu:latest",
    server: HUB,
    latestOrUntagged: true,
  },
  {
    input: "ubuntu:22.04",
    parsed: { domain: "docker.io", path: "library/ubuntu", tag: "22.04" },
    pull: "ubuntu:22.04",
    server: HUB,
    latestOrUntagged: false,
  },
  {
    input: "ubuntu:latest",
    parsed: { domain: "docker.io", path: "library/ubuntu", tag: "latest" },
    pull: "ubuntu:latest",
    server: HUB,
    latestOrUntagged: true,
  },
  {
    input: "library/ubuntu",
    parsed: { domain: "docker.io", path: "library/ubuntu" },
    pull: "ubuntu:latest",
    server: HUB,
    latestOrUntagged: true,
  },
  {
    input: "docker.io/ubuntu",
    parsed: { domain: "docker.io", path: "library/ubuntu" },
    pull: "ubuntu:latest",
    server: HUB,
    latestOrUntagged: true,
  },
  {
    input: "index.docker.io/library/ubuntu:20.04",
    parsed: { domain: "docker.io", path: "library/ubuntu", tag: "20.04" },
    pull: "ubuntu:20.04",
    server: HUB,
    latestOrUntagged: false,
  },
  {
    input: "dstackai/base:py3.11-0.4-cuda-12.1",
    parsed: { domain: "docker.io", path: "dstackai/base", tag: "py3.11-0.4-cuda-12.1" },
    pull: "dstackai/base:py3.11-0.4-cuda-12.1",
    server: HUB,
    latestOrUntagged: false,
  },
  {
    input: "docker.io/dstackai/base",
    parsed: { domain: "docker.io", path: "dstackai/base" },
    pull: "dstackai/base:latest",
    server: HUB,
    latestOrUntagged: true,
  },
  {
    input: "docker.io/library/a/b",
    parsed: { domain: "docker.io", path: "library/a/b" },
    pull: "library/a/b:latest",
    server: HUB,
    latestOrUntagged: true,
  },
  {
    // Dropping "docker.io/" would turn "foo.bar" into a registry host.
    input: "docker.io/foo.bar/baz",
    parsed: { domain: "docker.io", path: "foo.bar/baz" },
    pull: "docker.io/foo.bar/baz:latest",
    server: HUB,
    latestOrUntagged: true,
  },
  {
    input: "localhost/img",
    parsed: { domain: "localhost", path: "img" },
    pull: "localhost/img:latest",
    server: "localhost",
    latestOrUntagged: true,
  },
  {
    input: "localhost:5000/a/b:1",
    parsed: { domain: "localhost:5000", path: "a/b", tag: "1" },
    pull: "localhost:5000/a/b:1",
    server: "localhost:5000",
    latestOrUntagged: false,
  },
  {
    input: "127.0.0.1:5000/img",
    parsed: { domain: "127.0.0.1:5000", path: "img" },
    pull: "127.0.0.1:5000/img:latest",
    server: "127.0.0.1:5000",
    latestOrUntagged: true,
  },
  {
    input: "host:5000/img",
    parsed: { domain: "host:5000", path: "img" },
    pull: "host:5000/img:latest",
    server: "host:5000",
    latestOrUntagged: true,
  },
  {
    input: "[::1]:5000/img:tag",
    parsed: { domain: "[::1]:5000", path: "img", tag: "tag" },
    pull: "[::1]:5000/img:tag",
    server: "[::1]:5000",
    latestOrUntagged: false,
  },
  {
    input: "Registry.Example.com/team/img",
    parsed: { domain: "Registry.Example.com", path: "team/img" },
    pull: "Registry.Example.com/team/img:latest",
    server: "Registry.Example.com",
    latestOrUntagged: true,
  },
  {
    input: `img@${SHA256}`,
    parsed: { domain: "docker.io", path: "library/img", digest: SHA256 },
    pull: `img@${SHA256}`,
    server: HUB,
    latestOrUntagged: false,
  },
  {
    input: `ghcr.io/owner/repo@${SHA256}`,
    parsed: { domain: "ghcr.io", path: "owner/repo", digest: SHA256 },
    pull: `ghcr.io/owner/repo@${SHA256}`,
    server: "ghcr.io",
    latestOrUntagged: false,
  },
  {
    input: `nvcr.io/nvidia/pytorch:24.01-py3@${SHA256}`,
    parsed: { domain: "nvcr.io", path: "nvidia/pytorch", tag: "24.01-py3", digest: SHA256 },
    pull: `nvcr.io/nvidia/pytorch:24.01-py3@${SHA256}`,
    server: "nvcr.io",
    latestOrUntagged: false,
  },
  {
    input: `ubuntu:latest@${SHA512}`,
    parsed: { domain: "docker.io", path: "library/ubuntu", tag: "latest", digest: SHA512 },
    pull: `ubuntu:latest@${SHA512}`,
    server: HUB,
    latestOrUntagged: false,
  },
  {
    input: "registry.example.com/a_b__c-d---e.f/x:Tag_1.0-RC",
    parsed: { domain: "registry.example.com", path: "a_b__c-d---e.f/x", tag: "Tag_1.0-RC" },
    pull: "registry.example.com/a_b__c-d---e.f/x:Tag_1.0-RC",
    server: "registry.example.com",
    latestOrUntagged: false,
  },
  {
    input: "my-registry-1.internal:443/deep/nested/path/img:_x",
    parsed: { domain: "my-registry-1.internal:443", path: "deep/nested/path/img", tag: "_x" },
    pull: "my-registry-1.internal:443/deep/nested/path/img:_x",
    server: "my-registry-1.internal:443",
    latestOrUntagged: false,
  },
  {
    // As in Docker, a single component is never a registry: this is library/localhost.
    input: "localhost",
    parsed: { domain: "docker.io", path: "library/localhost" },
    pull: "localhost:latest",
    server: HUB,
    latestOrUntagged: true,
  },
  {
    // ...and "host:5000" alone is image "host" with tag "5000".
    input: "localhost:5000",
    parsed: { domain: "docker.io", path: "library/localhost", tag: "5000" },
    pull: "localhost:5000",
    server: HUB,
    latestOrUntagged: false,
  },
  {
    input: `img:${"t".repeat(128)}`,
    parsed: { domain: "docker.io", path: "library/img", tag: "t".repeat(128) },
    pull: `img:${"t".repeat(128)}`,
    server: HUB,
    latestOrUntagged: false,
  },
  {
    // The normalised name is exactly 255 characters.
    input: `r.io/${"a".repeat(250)}`,
    parsed: { domain: "r.io", path: "a".repeat(250) },
    pull: `r.io/${"a".repeat(250)}:latest`,
    server: "r.io",
    latestOrUntagged: true,
  },
];

describe("parseImageReference: valid references", () => {
  it.each(valid)("$input", ({ input, parsed, pull, server, latestOrUntagged }) => {
    const ref = parseImageReference(input);
    expect(ref).toStrictEqual(parsed);
    expect(formatPullReference(ref)).toBe(pull);
    expect(registryServerAddress(ref)).toBe(server);
    expect(isLatestOrUntagged(ref)).toBe(latestOrUntagged);
  });

  it.each(valid)("formatPullReference($input) parses back to the same image", ({ input }) => {
    const ref = parseImageReference(input);
    const reparsed = parseImageReference(formatPullReference(ref));
    expect(reparsed.domain).toBe(ref.domain);
    expect(reparsed.path).toBe(ref.path);
    expect(reparsed.digest).toBe(ref.digest);
    expect(reparsed.tag ?? (reparsed.digest === undefined ? "latest" : undefined)).toBe(
      ref.tag ?? (ref.digest === undefined ? "latest" : undefined),
    );
  });

  it("returns a frozen object without absent keys", () => {
    const ref = parseImageReference("ubuntu");
    expect(Object.isFrozen(ref)).toBe(true);
    expect(Object.keys(ref)).toEqual(["domain", "path"]);
  });
});

const invalid: [input: string, reason: RegExp][] = [
  ["", /empty reference/],
  [" ", /whitespace/],
  ["ubuntu ", /whitespace/],
  [" ubuntu", /whitespace/],
  ["ub untu", /whitespace/],
  ["ubuntu\n", /whitespace/],
  ["\tubuntu", /whitespace/],
  ["ubu\0ntu", /control/],
  ["ubuntu\x7f", /control/],
  ["ubuntu\u00a0", /whitespace/],
  ["UPPER/case", /must be lowercase/],
  ["Ubuntu", /must be lowercase/],
  ["docker.io/Library/ubuntu", /must be lowercase/],
  ["ghcr.io/Owner/repo", /must be lowercase/],
  ["a//b", /empty path component/],
  ["a/", /empty path component/],
  ["ghcr.io/", /empty path component/],
  ["/a", /empty path component/],
  ["ghcr.io//a", /empty path component/],
  [":tag", /missing repository name/],
  ["@" + SHA256, /missing repository name/],
  ["a:", /empty tag/],
  ["a@", /empty digest/],
  ["a:tag@", /empty digest/],
  ["a..b", /invalid path component "a..b"/],
  ["a/../b", /invalid path component "\.\."/],
  ["ghcr.io/a/./b", /invalid path component "\."/],
  ["-a", /invalid path component/],
  ["a-", /invalid path component/],
  ["a_", /invalid path component/],
  ["a___b", /invalid path component/],
  ["a.-b", /invalid path component/],
  ["ubüntu", /invalid path component/],
  ["a:b:c", /invalid path component "a:b"/],
  ["a:-tag", /invalid tag/],
  ["a:.tag", /invalid tag/],
  ["a:tag!", /invalid tag/],
  ["a:ta/g", /invalid registry host "a:ta"/],
  [`a:${"t".repeat(129)}`, /invalid tag/],
  ["a@sha256:abc", /invalid digest/],
  [`a@sha256:${"a".repeat(63)}`, /invalid sha256 digest/],
  [`a@sha256:${"a".repeat(65)}`, /invalid sha256 digest/],
  [`a@sha256:${"A".repeat(64)}`, /invalid sha256 digest/],
  [`a@sha256:${"g".repeat(64)}`, /invalid digest/],
  [`a@md5:${"a".repeat(32)}`, /unsupported digest algorithm "md5"/],
  [`a@${"a".repeat(64)}`, /invalid digest/],
  [`a@${SHA256}@${SHA256}`, /invalid digest/],
  [`a@${SHA256}:tag`, /invalid digest/],
  ["a@sha256:" + "0".repeat(64) + "/b", /invalid digest/],
  ["a".repeat(64).replace(/a/g, "f"), /image ID/],
  ["a".repeat(238), /longer than 255 characters/],
  [`r.io/${"a".repeat(251)}`, /longer than 255 characters/],
  ["x".repeat(1025), /longer than 1024 characters/],
  ["host:/img", /invalid registry host/],
  ["host:50a/img", /invalid registry host/],
  ["-bad.com/img", /invalid registry host/],
  ["bad-.com/img", /invalid registry host/],
  ["a..com/img", /invalid registry host/],
  ["a_b.com/img", /invalid registry host/],
  ["[::1/img", /invalid registry host/],
];

describe("parseImageReference: invalid references", () => {
  it.each(invalid)("%j", (input, reason) => {
    let caught: unknown;
    try {
      parseImageReference(input);
    } catch (error) {
      caught = error;
    }
    expect(caught).toBeInstanceOf(InvalidImageReferenceError);
    const error = caught as InvalidImageReferenceError;
    expect(error.name).toBe("InvalidImageReferenceError");
    expect(error.reference).toBe(input);
    expect(error.reason).toMatch(reason);
    expect(error.message).toContain(error.reason);
  });

  it("truncates a huge reference in the message but keeps it on the error", () => {
    const input = "x".repeat(5000);
    const error = (() => {
      try {
        parseImageReference(input);
      } catch (e) {
        return e as InvalidImageReferenceError;
      }
      throw new Error("expected a rejection");
    })();
    expect(error.message.length).toBeLessThan(400);
    expect(error.reference).toBe(input);
  });
});

describe("formatPullReference", () => {
  it("adds :latest only without tag and digest", () => {
    expect(formatPullReference({ domain: "ghcr.io", path: "a/b" })).toBe("ghcr.io/a/b:latest");
    expect(formatPullReference({ domain: "ghcr.io", path: "a/b", tag: "v1" })).toBe("ghcr.io/a/b:v1");
    expect(formatPullReference({ domain: "ghcr.io", path: "a/b", digest: SHA256 })).toBe(
      `ghcr.io/a/b@${SHA256}`,
    );
    expect(formatPullReference({ domain: "ghcr.io", path: "a/b", tag: "v1", digest: SHA256 })).toBe(
      `ghcr.io/a/b:v1@${SHA256}`,
    );
  });

  it("keeps docker.io for a Hub path whose namespace looks like a host", () => {
    expect(formatPullReference({ domain: "docker.io", path: "localhost/x" })).toBe(
      "docker.io/localhost/x:latest",
    );
    expect(formatPullReference({ domain: "docker.io", path: "library/foo.bar" })).toBe("foo.bar:latest");
  });
});
