import { readFile, readlink } from "node:fs/promises";
import { ConfigError } from "../config/shim-config.js";

/** The first file descriptor systemd passes (SD_LISTEN_FDS_START). */
const SD_LISTEN_FDS_START = 3;

/** Where the API listens: the configured address, or a socket systemd passed in. */
export type ListenTarget =
  | { readonly kind: "address"; readonly host: string; readonly port: number }
  | { readonly kind: "inherited"; readonly fd: number };

/**
 * A LISTEN_FDS/LISTEN_PID pair that is meant for this process but unusable, or a passed
 * descriptor that is no listening TCP socket: a configuration error (exit 78), since the same
 * unit would fail the same way at every restart.
 */
export class SocketActivationError extends ConfigError {
  override readonly name: string = "SocketActivationError";
}

/**
 * systemd socket activation (`sd_listen_fds`, deploy/taskshim.socket): with `LISTEN_FDS` set for
 * this process (`LISTEN_PID` absent or equal to its pid), the API serves the listening socket
 * systemd holds as fd 3, and the configured address and port are not bound. systemd keeps that
 * socket open across restarts and upgrades, so a client's connection waits in its backlog
 * instead of being refused while no shim runs. The variables are removed from `env` so nothing
 * the shim starts inherits them.
 *
 * @throws SocketActivationError naming what is wrong with LISTEN_FDS or LISTEN_PID.
 */
export function listenTarget(
  configured: { readonly host: string; readonly port: number },
  env: NodeJS.ProcessEnv,
  pid: number,
): ListenTarget {
  const fds = env.LISTEN_FDS;
  const forPid = env.LISTEN_PID;
  if (fds === undefined) return { kind: "address", ...configured };
  if (forPid !== undefined && !/^[1-9]\d*$/.test(forPid)) {
    throw new SocketActivationError(`LISTEN_PID=${JSON.stringify(forPid)} is not a process id`);
  }
  if (forPid !== undefined && forPid !== String(pid)) return { kind: "address", ...configured };
  delete env.LISTEN_FDS;
  delete env.LISTEN_PID;
  delete env.LISTEN_FDNAMES;
  if (!/^\d+$/.test(fds)) {
    throw new SocketActivationError(
      `LISTEN_FDS=${JSON.stringify(fds)} is not a number of sockets (systemd sets it to 1 for taskshim.socket)`,
    );
  }
  if (fds !== "1") {
    throw new SocketActivationError(
      `LISTEN_FDS=${fds}: taskshim takes exactly one socket from systemd (one ListenStream= in taskshim.socket)`,
    );
  }
  return { kind: "inherited", fd: SD_LISTEN_FDS_START };
}

/** What a descriptor is, as far as the API can serve it. */
export type InheritedSocket =
  | { readonly kind: "tcp-listening" }
  | { readonly kind: "unknown-socket" }
  | { readonly kind: "refused"; readonly why: string };

/** Where the kernel lists sockets (`/proc/net/…`) and descriptors (`/proc/self/fd`); tests may move it. */
export interface ProcPaths {
  readonly fdDir: string;
  readonly netDir: string;
}

const PROC: ProcPaths = { fdDir: "/proc/self/fd", netDir: "/proc/net" };

/**
 * Checks the descriptor socket activation passed, before anything is restored: not open, not a
 * socket, a UDP socket, a Unix socket or a TCP socket that does not listen is refused with one
 * line naming the descriptor (the configured port is not what failed). A socket the kernel lists
 * in none of these tables (another network namespace) is left to the listen to judge.
 */
export async function inspectInheritedSocket(fd: number, proc: ProcPaths = PROC): Promise<InheritedSocket> {
  const name = `fd ${fd} (LISTEN_FDS=1)`;
  let target: string;
  try {
    target = await readlink(`${proc.fdDir}/${fd}`);
  } catch {
    return { kind: "refused", why: `${name} is not open: the socket unit passed no socket` };
  }
  const inode = /^socket:\[(\d+)\]$/.exec(target)?.[1];
  // (A descriptor the unit did not pass may be one the runtime opened since, its epoll say.)
  if (inode === undefined) {
    return { kind: "refused", why: `${name} is not a socket (${target}): the socket unit passed none` };
  }
  const table = async (file: string): Promise<string[][]> =>
    (await readFile(`${proc.netDir}/${file}`, "utf8").catch(() => ""))
      .split("\n")
      .slice(1)
      .map((line) => line.trim().split(/\s+/));
  for (const file of ["tcp", "tcp6"]) {
    const row = (await table(file)).find((fields) => fields[9] === inode);
    if (row === undefined) continue;
    // st 0A is TCP_LISTEN.
    if (row[3] === "0A") return { kind: "tcp-listening" };
    return { kind: "refused", why: `${name} is a TCP socket that is not listening` };
  }
  for (const file of ["udp", "udp6"]) {
    if ((await table(file)).some((fields) => fields[9] === inode)) {
      return {
        kind: "refused",
        why: `${name} is a UDP socket: taskshim serves HTTP on a TCP socket (ListenStream=, not ListenDatagram=)`,
      };
    }
  }
  const unix = (await table("unix")).find((fields) => fields[6] === inode);
  if (unix !== undefined) {
    const path = unix[7] ?? "";
    return {
      kind: "refused",
      why: `${name} is a Unix socket${path ? ` (${path})` : ""}: taskshim serves TCP only (ListenStream=ADDRESS:PORT)`,
    };
  }
  return { kind: "unknown-socket" };
}
