/** An accepted install that failed: the download, its source, its digest or its verification. */
export class ComponentInstallError extends Error {
  override readonly name: string = "ComponentInstallError";
}

/**
 * Which check refused a download. Each depends on the bytes alone (and, for `identity`, on
 * `allowShimHandover`), so the refusal is remembered with its source and holds while the bytes
 * at the URL do not change:
 *
 * - `sha256`: the bytes are not the digest the request named;
 * - `content`: neither an ELF executable nor a `#!` script, or its `--version` does not print this
 *   component's version line;
 * - `identity`: a `dstack-shim` that is not taskshim (dstack's Go shim), while handover is off.
 *
 * A `--version` that could not run (a timeout, a launch failure, an exit status) is not a
 * refusal: it may pass next time (a loaded host, a Node.js upgraded under a bundle).
 */
export type RefusalRule = "sha256" | "content" | "identity";

/** A download that was fetched and looked at, and is not to be installed. */
export class ComponentRefusedError extends ComponentInstallError {
  override readonly name: string = "ComponentRefusedError";
  constructor(
    readonly rule: RefusalRule,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}
