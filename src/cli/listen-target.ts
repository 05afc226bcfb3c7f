/** The first file descriptor systemd passes (SD_LISTEN_FDS_START). */
const SD_LISTEN_FDS_START = 3;

/** Where the API listens: the configured address, or a socket systemd passed in. */
export type ListenTarget =
  | { readonly kind: "address"; readonly host: string; readonly port: number }
  | { readonly kind: "inherited"; readonly fd: number };

/** A LISTEN_FDS/LISTEN_PID pair that is meant for this process but unusable. */
export class SocketActivationError extends Error {
  override readonly name = "SocketActivationError";
}

/**
 * systemd socket activation (`sd_listen_fds`, deploy/taskshim.socket): with `LISTEN_FDS` set for
 * this process (`LISTEN_PID` absent or equal to its pid), the API serves the listening socket
 * systemd holds as fd 3, and the configured address and port are not bound. systemd keeps that
 * socket open across restarts and upgrades, so a client's connection waits in its backlog
 * instead of being refused while no shim runs. The variables are removed from `env` so nothing
 * the shim starts inherits them.
 */
export function listenTarget(
  configured: { readonly host: string; readonly port: number },
  env: NodeJS.ProcessEnv,
  pid: number,
): ListenTarget {
  const fds = env.LISTEN_FDS;
  const forPid = env.LISTEN_PID;
  if (fds === undefined || (forPid !== undefined && forPid !== String(pid))) {
    return { kind: "address", ...configured };
  }
  delete env.LISTEN_FDS;
  delete env.LISTEN_PID;
  delete env.LISTEN_FDNAMES;
  if (fds !== "1") {
    throw new SocketActivationError(
      `LISTEN_FDS=${fds}: taskshim takes exactly one socket from systemd (one ListenStream= in taskshim.socket)`,
    );
  }
  return { kind: "inherited", fd: SD_LISTEN_FDS_START };
}
