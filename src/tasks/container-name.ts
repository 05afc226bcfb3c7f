import { createHash } from "node:crypto";

/**
 * The container name of a task: `<name>-<first 8 hex of sha256(name/id)>`, as dstack-shim
 * derives it, so either shim finds the other's containers.
 */
export function containerNameFor(name: string, id: string): string {
  const digest = createHash("sha256").update(`${name}/${id}`).digest("hex");
  return `${name}-${digest.slice(0, 8)}`;
}
