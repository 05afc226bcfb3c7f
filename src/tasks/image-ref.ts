/**
 * A parsed, normalised image reference (distribution/reference grammar).
 * `ubuntu` is `{ domain: "docker.io", path: "library/ubuntu" }`.
 */
export interface ImageReference {
  /** Registry host with optional port, e.g. `docker.io`, `127.0.0.1:5000`, `ghcr.io`. */
  readonly domain: string;
  /** Repository path inside the registry, e.g. `library/ubuntu`. */
  readonly path: string;
  /** Tag, absent when the reference names none (no implicit `latest` here). */
  readonly tag?: string;
  /** Content digest, e.g. `sha256:<64 hex>`. */
  readonly digest?: string;
}

/** The image reference does not follow the distribution/reference grammar. */
export class InvalidImageReferenceError extends Error {
  override readonly name = "InvalidImageReferenceError";

  constructor(
    /** The rejected input, untruncated. */
    readonly reference: string,
    /** Why it was rejected. */
    readonly reason: string,
  ) {
    super(`invalid image reference ${quoteForMessage(reference)}: ${reason}`);
  }
}

const DEFAULT_DOMAIN = "docker.io";
const LEGACY_DEFAULT_DOMAIN = "index.docker.io";
const OFFICIAL_REPO_PREFIX = "library/";
const DOCKER_HUB_SERVER_ADDRESS = "https://index.docker.io/v1/";
const LOCALHOST = "localhost";
const NAME_TOTAL_LENGTH_MAX = 255;
// Longer than any valid reference (255-char name, 128-char tag, sha512 digest); bounds the regex work.
const REFERENCE_LENGTH_MAX = 1024;

const DOMAIN_COMPONENT = "[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?";
const DOMAIN_RE = new RegExp(
  `^(?:${DOMAIN_COMPONENT}(?:\\.${DOMAIN_COMPONENT})*|\\[[a-fA-F0-9:]+\\])(?::[0-9]+)?$`,
);
const PATH_COMPONENT_RE = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;
const TAG_RE = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;
const DIGEST_RE = /^([A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*):([0-9a-fA-F]{32,})$/;
/** The algorithms go-digest accepts, with their (lowercase) hex lengths. */
const DIGEST_HEX_LENGTHS: ReadonlyMap<string, number> = new Map([
  ["sha256", 64],
  ["sha384", 96],
  ["sha512", 128],
]);
const IMAGE_ID_RE = /^[a-f0-9]{64}$/;
const WHITESPACE_OR_CONTROL_RE = /[\s\p{Cc}]/u;

function quoteForMessage(value: string): string {
  const quoted = JSON.stringify(value);
  return quoted.length > 300 ? `${quoted.slice(0, 300)}…` : quoted;
}

/** Whether a first path component names a registry host rather than a Docker Hub namespace. */
function looksLikeDomain(component: string): boolean {
  return component === LOCALHOST || component.includes(".") || component.includes(":");
}

/**
 * Parses and normalises an image reference: `name[:tag][@digest]`.
 *
 * The first `/`-separated component is a registry only if it contains `.` or `:` or is `localhost`,
 * so `host:5000/img` is registry `host:5000` with no tag, while `ubuntu` becomes
 * `docker.io/library/ubuntu` and `index.docker.io` becomes `docker.io`. Unlike newer Docker, an
 * uppercase first component (`UPPER/case`) is not taken as a registry host: it is rejected as an
 * uppercase repository name.
 *
 * @throws {InvalidImageReferenceError} for anything the grammar rejects: empty input, whitespace or
 * control characters, uppercase or empty path components, bad separators (`..`, `a//b`), a bad tag
 * (`[\w][\w.-]{0,127}`), a digest that is not a well-formed sha256/sha384/sha512 digest, a
 * normalised name longer than 255 characters, or a bare 64-hex image ID.
 */
export function parseImageReference(ref: string): ImageReference {
  const fail = (reason: string): never => {
    throw new InvalidImageReferenceError(ref, reason);
  };
  if (ref === "") fail("empty reference");
  if (ref.length > REFERENCE_LENGTH_MAX) fail(`longer than ${REFERENCE_LENGTH_MAX} characters`);
  if (WHITESPACE_OR_CONTROL_RE.test(ref)) fail("contains whitespace or control characters");
  if (IMAGE_ID_RE.test(ref)) fail("a 64-character hexadecimal string is an image ID, not a repository name");

  let name = ref;
  let digest: string | undefined;
  const at = name.indexOf("@");
  if (at !== -1) {
    digest = name.slice(at + 1);
    name = name.slice(0, at);
    validateDigest(digest, fail);
  }

  let tag: string | undefined;
  const colon = name.lastIndexOf(":");
  if (colon > name.lastIndexOf("/")) {
    tag = name.slice(colon + 1);
    name = name.slice(0, colon);
    if (tag === "") fail("empty tag");
    if (!TAG_RE.test(tag)) fail(`invalid tag ${quoteForMessage(tag)}`);
  }

  if (name === "") fail("missing repository name");
  const { domain, path } = splitDomain(name);
  if (!DOMAIN_RE.test(domain)) fail(`invalid registry host ${quoteForMessage(domain)}`);
  if (path.toLowerCase() !== path) fail(`repository name ${quoteForMessage(path)} must be lowercase`);
  for (const component of path.split("/")) {
    if (component === "") fail("empty path component (leading, trailing or repeated '/')");
    if (!PATH_COMPONENT_RE.test(component)) fail(`invalid path component ${quoteForMessage(component)}`);
  }
  const fullName = `${domain}/${path}`;
  if (fullName.length > NAME_TOTAL_LENGTH_MAX) {
    fail(`repository name ${quoteForMessage(fullName)} is longer than ${NAME_TOTAL_LENGTH_MAX} characters`);
  }

  return Object.freeze({
    domain,
    path,
    ...(tag === undefined ? {} : { tag }),
    ...(digest === undefined ? {} : { digest }),
  });
}

function splitDomain(name: string): { domain: string; path: string } {
  const slash = name.indexOf("/");
  // A single component is always a Docker Hub official image: `localhost` and `host:5000` included.
  if (slash === -1) return { domain: DEFAULT_DOMAIN, path: OFFICIAL_REPO_PREFIX + name };
  const first = name.slice(0, slash);
  if (!looksLikeDomain(first)) return { domain: DEFAULT_DOMAIN, path: name };
  const domain = first === LEGACY_DEFAULT_DOMAIN ? DEFAULT_DOMAIN : first;
  const remainder = name.slice(slash + 1);
  const path =
    domain === DEFAULT_DOMAIN && !remainder.includes("/") ? OFFICIAL_REPO_PREFIX + remainder : remainder;
  return { domain, path };
}

function validateDigest(digest: string, fail: (reason: string) => never): void {
  if (digest === "") fail("empty digest");
  const match = DIGEST_RE.exec(digest);
  const algorithm = match?.[1];
  const hex = match?.[2];
  if (algorithm === undefined || hex === undefined) return fail(`invalid digest ${quoteForMessage(digest)}`);
  const expectedLength = DIGEST_HEX_LENGTHS.get(algorithm);
  if (expectedLength === undefined) fail(`unsupported digest algorithm ${quoteForMessage(algorithm)}`);
  if (hex.length !== expectedLength || !/^[a-f0-9]+$/.test(hex)) {
    fail(`invalid ${algorithm} digest: expected ${expectedLength} lowercase hex characters`);
  }
}

/**
 * The repository name as Docker prints it: Docker Hub names lose `docker.io/` and `library/`.
 * Kept in full when dropping the domain would change the meaning (`docker.io/foo.bar/baz`).
 */
function familiarName(ref: ImageReference): string {
  if (ref.domain !== DEFAULT_DOMAIN) return `${ref.domain}/${ref.path}`;
  if (ref.path.startsWith(OFFICIAL_REPO_PREFIX)) {
    const official = ref.path.slice(OFFICIAL_REPO_PREFIX.length);
    if (!official.includes("/")) return official;
  }
  const slash = ref.path.indexOf("/");
  if (slash !== -1 && looksLikeDomain(ref.path.slice(0, slash))) return `${DEFAULT_DOMAIN}/${ref.path}`;
  return ref.path;
}

/**
 * The reference to pass to Docker's pull (and to look the image up locally):
 * `name:tag`, `name@digest`, `name:tag@digest`, or `name:latest` when neither tag nor digest is given.
 *
 * Docker Hub images are given in the familiar form (`ubuntu:latest`, `dstackai/base:1`): Docker pulls
 * either form, but its `reference=` image-list filter matches patterns against the familiar string
 * (or the tagless full name) only, so `docker.io/library/ubuntu:latest` would never find a local image.
 */
export function formatPullReference(ref: ImageReference): string {
  let result = familiarName(ref);
  if (ref.tag !== undefined) result += `:${ref.tag}`;
  if (ref.digest !== undefined) result += `@${ref.digest}`;
  if (ref.tag === undefined && ref.digest === undefined) result += ":latest";
  return result;
}

/** The `serveraddress` of the registry auth config: Docker Hub's legacy index URL, else the domain. */
export function registryServerAddress(ref: ImageReference): string {
  return ref.domain === DEFAULT_DOMAIN ? DOCKER_HUB_SERVER_ADDRESS : ref.domain;
}

/**
 * True if the reference may move: no digest, and no tag or the tag `latest`. Such an image is
 * pulled even when present locally; any other is pulled only when missing.
 */
export function isLatestOrUntagged(ref: ImageReference): boolean {
  return ref.digest === undefined && (ref.tag === undefined || ref.tag === "latest");
}
